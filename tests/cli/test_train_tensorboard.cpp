// report_to: tensorboard: a training run writes TensorBoard event files with the same values as
// metrics.jsonl, under output_dir/runs/<date>_<host> or logging_dir; other integrations are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "train/tensorboard.h"

namespace qlora {
namespace {
namespace fs = std::filesystem;
using namespace cli_test;

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path().string());
  return out;
}

TEST(TrainTensorBoard, EventFileHoldsWhatMetricsJsonlHolds) {
  const std::string out = temp_dir("tensorboard");
  RunResult r = run_qlora("train " + std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml output_dir=" + out +
                          " max_steps=4 eval_steps=2 report_to=tensorboard threads=1");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto files = event_files(out + "/runs");
  ASSERT_EQ(files.size(), 1u) << r.output;
  EXPECT_NE(r.output.find("tensorboard: " + files[0]), std::string::npos) << r.output;
  std::map<std::pair<std::string, int64_t>, float> tb;
  for (const auto& s : read_tensorboard_scalars(files[0])) tb[{s.tag, s.step}] = s.value;
  // Every finite number of every metrics.jsonl record is there, under transformers' tag names.
  std::ifstream in(out + "/metrics.jsonl");
  int64_t compared = 0, evals = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    const int64_t step = j["step"].get<int64_t>();
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "step" || !it->is_number() || it->is_boolean() || !std::isfinite(it->get<double>())) continue;
      const std::string tag = it.key().rfind("eval_", 0) == 0 ? "eval/" + it.key().substr(5) : "train/" + it.key();
      auto found = tb.find({tag, step});
      ASSERT_NE(found, tb.end()) << tag << " at step " << step;
      EXPECT_EQ(found->second, float(it->get<double>())) << tag << " at step " << step;
      compared++;
      evals += tag == "eval/loss";
    }
  }
  EXPECT_EQ(compared, int64_t(tb.size()));
  EXPECT_GE(evals, 3);  // steps 0, 2 and 4
  EXPECT_TRUE(tb.count({"train/loss", 4}));
  EXPECT_TRUE(tb.count({"train/learning_rate", 4}));
  fs::remove_all(out);
}

TEST(TrainTensorBoard, LoggingDirAndRefusals) {
  const std::string out = temp_dir("tensorboard_dir"), logs = temp_dir("tensorboard_logs");
  RunResult r = run_qlora("train " + std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml output_dir=" + out +
                          " max_steps=1 eval_strategy=no report_to=all logging_dir=" + logs + " threads=1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(event_files(logs).size(), 1u);
  EXPECT_FALSE(fs::exists(out + "/runs"));
  // An integration the engine does not have is refused, naming the key and what it takes.
  r = run_qlora("train " + std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml output_dir=" + out + " report_to=wandb");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("report_to"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tensorboard"), std::string::npos) << r.output;
  fs::remove_all(out);
  fs::remove_all(logs);
}

}  // namespace
}  // namespace qlora
