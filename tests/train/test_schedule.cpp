// LR schedules and step counts vs values computed by transformers (tests/fixtures/train/schedules.json).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mode_names.h"
#include "train/schedule.h"
#include "train/train_config.h"

using namespace qlora;

namespace {

nlohmann::json fixture() {
  std::ifstream in(std::string(QLORA_FIXTURES) + "/train/schedules.json");
  EXPECT_TRUE(in.good()) << "missing fixture; run tools/make_schedule_fixtures.py";
  return nlohmann::json::parse(in);
}

TrainConfig config_for(const nlohmann::json& c) {
  TrainConfig cfg;
  const auto type = mode_by_name(lr_schedulers(), lr_scheduler_name, c["type"].get<std::string>());
  EXPECT_TRUE(type.has_value()) << c["type"];
  cfg.lr_scheduler_type = type.value_or(LrScheduler::Cosine);
  cfg.learning_rate = c["base_lr"];
  cfg.warmup_steps = c["warmup_steps"];
  cfg.warmup_ratio = c["warmup_ratio"];
  return cfg;
}

}  // namespace

TEST(Schedule, MatchesTransformersStepByStep) {
  nlohmann::json doc = fixture();
  ASSERT_GE(doc["schedules"].size(), 8u);
  for (const auto& c : doc["schedules"]) {
    TrainConfig cfg = config_for(c);
    int64_t total = c["total_steps"];
    SCOPED_TRACE(std::string(c["type"]) + " total=" + std::to_string(total));
    EXPECT_EQ(warmup_steps_for(cfg, total), c["hf_warmup"].get<int64_t>());
    const auto& lrs = c["lr"];
    for (size_t s = 0; s < lrs.size(); ++s) {
      double want = lrs[s], got = lr_at(cfg, total, int64_t(s));
      EXPECT_NEAR(got, want, 1e-12 * std::max(1e-4, std::fabs(want))) << "step " << s;
    }
  }
}

TEST(Schedule, TotalStepsMatchTransformersTrainer) {
  const nlohmann::json fx = fixture();  // the loop must not range over a destroyed temporary
  for (const auto& t : fx["total_steps"]) {
    TrainConfig cfg;
    cfg.gradient_accumulation_steps = t["gradient_accumulation_steps"];
    cfg.num_train_epochs = t["num_train_epochs"];
    cfg.max_steps = t["max_steps"];
    EXPECT_EQ(total_optimizer_steps(cfg, t["micro_batches"]), t["total_steps"].get<int64_t>())
        << "micro_batches " << t["micro_batches"] << " ga " << cfg.gradient_accumulation_steps;
  }
}

// Hand-computed points, independent of the fixture.
TEST(Schedule, HandComputedPoints) {
  ScheduleParams p{.type = LrScheduler::Cosine, .base_lr = 1.0, .warmup_steps = 10, .total_steps = 110};
  EXPECT_DOUBLE_EQ(lr_at(p, 0), 0.0);        // warmup starts at 0
  EXPECT_DOUBLE_EQ(lr_at(p, 5), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(p, 10), 1.0);       // peak right after warmup
  EXPECT_NEAR(lr_at(p, 60), 0.5, 1e-15);     // half-way down the half cosine
  EXPECT_NEAR(lr_at(p, 35), 0.5 * (1 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(p, 110), 0.0);
  p.type = LrScheduler::Linear;
  EXPECT_DOUBLE_EQ(lr_at(p, 60), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(p, 200), 0.0);      // clamped past the end
  p.type = LrScheduler::Constant;
  EXPECT_DOUBLE_EQ(lr_at(p, 0), 1.0);        // constant ignores warmup, as in HF
  p.type = LrScheduler::ConstantWithWarmup;
  EXPECT_DOUBLE_EQ(lr_at(p, 2), 0.2);
  EXPECT_DOUBLE_EQ(lr_at(p, 1000), 1.0);
}

TEST(Schedule, WarmupStepsWinOverRatio) {
  TrainConfig cfg;
  cfg.warmup_ratio = 0.5;
  EXPECT_EQ(warmup_steps_for(cfg, 10), 5);
  EXPECT_EQ(warmup_steps_for(cfg, 11), 6);  // ceil
  cfg.warmup_steps = 2;
  EXPECT_EQ(warmup_steps_for(cfg, 10), 2);
}

TEST(Schedule, BadInputsAreErrors) {
  // A schedule the engine does not implement is refused where the config is read, naming the key.
  try {
    parse_train_config("lr_scheduler_type: cosine_with_restarts\n", "cfg.yaml", {}, nullptr);
    FAIL() << "an unimplemented schedule must be an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(e.where().find("cfg.yaml:1"), std::string::npos) << e.where();
    EXPECT_NE(std::string(e.what()).find("lr_scheduler_type"), std::string::npos) << e.what();
  }
  TrainConfig cfg;
  try {
    total_optimizer_steps(cfg, 0);
    FAIL() << "no batches must be an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Data);
  }
}

// Data parallel: a step of `world` ranks takes world x gradient_accumulation_steps micro-batches,
// so the run has as many steps as one process with that many.
TEST(Schedule, TotalStepsCountTheGlobalBatch) {
  TrainConfig cfg;
  cfg.gradient_accumulation_steps = 2;
  cfg.num_train_epochs = 1;
  EXPECT_EQ(total_optimizer_steps(cfg, 100), 50);
  EXPECT_EQ(total_optimizer_steps(cfg, 100, 3), 17);  // ceil(100 / 6)
  cfg.gradient_accumulation_steps = 6;
  EXPECT_EQ(total_optimizer_steps(cfg, 100), total_optimizer_steps(cfg, 100, 1));
  EXPECT_EQ(total_optimizer_steps(cfg, 100), 17);
  cfg.max_steps = 9;  // max_steps wins at any world size
  EXPECT_EQ(total_optimizer_steps(cfg, 100, 4), 9);
}
