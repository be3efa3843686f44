// End to end: `qlora train` on a small Mixtral whose config.json sets output_router_logits, on
// pre-tokenized rows: the run trains, metrics.jsonl carries the routing and the micro-batches' mean
// load-balancing loss, and `loss` includes it times router_aux_loss_coef.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"

using namespace qlora::cli_test;
namespace fs = std::filesystem;

namespace {

const std::string kModel = std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/models/mixtral_aux";

// Rows of token ids below the fixture's vocabulary (96), of lengths 10..17, so that padding occurs.
std::string write_rows(const std::string& dir) {
  const std::string path = dir + "/train.jsonl";
  std::ofstream f(path);
  uint32_t x = 12345;
  for (int r = 0; r < 8; r++) {
    nlohmann::json ids = nlohmann::json::array();
    for (int t = 0; t < 10 + r; t++) {
      x = x * 1103515245u + 12345u;
      ids.push_back(int((x >> 16) % 96));
    }
    f << nlohmann::json{{"input_ids", ids}}.dump() << "\n";
  }
  return path;
}

TEST(TrainMoe, LoadBalancingLossIsLoggedBesideTheRouting) {
  const std::string out = temp_dir("moe_aux");
  fs::create_directories(out);
  const std::string cfg = out + "/cfg.yaml";
  std::ofstream(cfg) << "model_name_or_path: " << kModel << "\ntrain_file: " << write_rows(out) << "\n"
                     << "per_device_train_batch_size: 2\ngradient_accumulation_steps: 2\nmax_steps: 2\n"
                     << "learning_rate: 1.0e-3\nr: 4\nlora_alpha: 8\n"
                     << "target_modules: [q_proj, k_proj, v_proj, o_proj]\nlogging_steps: 1\nthreads: 1\n"
                     << "device: cpu\nseed: 5\n";
  const RunResult r = run_qlora("train " + cfg + " output_dir=" + out + "/run");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto recs = metrics_records(out + "/run");
  int steps = 0;
  for (const auto& rec : recs) {
    if (!rec.contains("step") || !rec.contains("loss")) continue;
    steps++;
    ASSERT_TRUE(rec.contains("router/aux_loss")) << rec.dump();
    // E sum_e f_e P_e: 1 for a perfectly even routing, at most E (16) for all on one expert.
    const double aux = rec["router/aux_loss"];
    EXPECT_GT(aux, 0.5) << rec.dump();
    EXPECT_LT(aux, 16.0) << rec.dump();
    EXPECT_TRUE(rec.contains("router/load_max_over_mean")) << rec.dump();
    EXPECT_GT(rec["loss"].get<double>(), 0.1 * aux) << "the loss includes 0.1 x the aux loss";
  }
  EXPECT_EQ(steps, 2) << read_file(out + "/run/metrics.jsonl");
  EXPECT_TRUE(fs::exists(out + "/run/adapter/adapter_model.safetensors")) << r.output;
  fs::remove_all(out);
}

}  // namespace
