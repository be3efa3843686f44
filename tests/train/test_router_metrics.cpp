// Router statistics of metrics.jsonl from per-expert token counts.
#include <gtest/gtest.h>

#include "train/router_metrics.h"

using namespace qlora;

TEST(RouterMetrics, ImbalanceIdleExpertsAndNoDrops) {
  // Two layers of four experts: layer 0 even (3 each), layer 1 with one expert taking 6 of 12
  // choices and one idle.
  const std::vector<double> counts = {3, 3, 3, 3, 6, 3, 3, 0};
  const auto m = router_metrics(counts, 2, 4);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_DOUBLE_EQ(m.at("router/load_max_over_mean"), 2.0);  // 6 against an even 3
  EXPECT_DOUBLE_EQ(m.at("router/idle_expert_fraction"), 1.0 / 8.0);
  EXPECT_EQ(m.at("router/dropped_tokens"), 0.0);
  const auto even = router_metrics({2, 2, 2, 2}, 1, 4);
  EXPECT_DOUBLE_EQ(even.at("router/load_max_over_mean"), 1.0);
  EXPECT_DOUBLE_EQ(even.at("router/idle_expert_fraction"), 0.0);
}

TEST(RouterMetrics, NothingRoutedOrWrongShapeGivesNoMetrics) {
  EXPECT_TRUE(router_metrics({0, 0, 0, 0}, 1, 4).empty());
  EXPECT_TRUE(router_metrics({1, 2, 3}, 1, 4).empty());
  EXPECT_TRUE(router_metrics({}, 0, 0).empty());
}
