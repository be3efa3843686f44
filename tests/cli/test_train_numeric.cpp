// Numeric guards end to end: a learning rate that blows the weights up makes the loss NaN a few
// steps in. nan_policy: stop ends the run naming the step and what went non-finite, with the last
// good state checkpointed (and finite); nan_policy: skip skips and counts such steps.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "io/safetensors.h"

using namespace qlora::cli_test;
namespace fs = std::filesystem;

namespace {

std::string args(const std::string& out, const std::string& extra) {
  return "train " + std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml output_dir=" + out +
         " max_steps=6 learning_rate=1e30 logging_steps=1 eval_strategy=no threads=1 device=cpu " + extra;
}

// Every tensor of a safetensors file is finite.
void expect_all_finite(const std::string& path) {
  qlora::SafetensorsArchive ar(path);
  int tensors = 0;
  for (const auto& name : ar.names()) {
    const auto& ti = ar.get(name);
    int64_t n = 1;
    for (auto s : ti.shape) n *= s;
    std::vector<float> v(static_cast<size_t>(n));
    ar.read_f32(name, v.data(), ti.shape);
    for (float x : v) ASSERT_TRUE(std::isfinite(x)) << path << ": " << name;
    tensors++;
  }
  EXPECT_GT(tensors, 0) << path;
}

TEST(TrainNumeric, NonFiniteLossStopsNamingTheStepAndKeepsTheLastGoodState) {
  const std::string out = temp_dir("nan_stop");
  const RunResult r = run_qlora(args(out, ""));
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("loss or gradient is not finite"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("first non-finite: the loss"), std::string::npos) << r.output;
  const auto at = r.output.find("data error: step ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const int step = std::stoi(r.output.substr(at + 17));
  ASSERT_GE(step, 2) << "the first step is finite at any learning rate (B starts at zero)";
  const std::string ckpt = out + "/checkpoint-" + std::to_string(step - 1);
  ASSERT_TRUE(fs::exists(ckpt)) << r.output;
  EXPECT_NE(r.output.find("checkpoint-" + std::to_string(step - 1)), std::string::npos);
  expect_all_finite(ckpt + "/adapter_model.safetensors");
  expect_all_finite(ckpt + "/optimizer.safetensors");
  EXPECT_FALSE(fs::exists(out + "/adapter")) << "no final adapter from a failed run";
  fs::remove_all(out);
}

TEST(TrainNumeric, SkipPolicyCountsSkippedStepsAndFinishes) {
  const std::string out = temp_dir("nan_skip");
  const RunResult r = run_qlora(args(out, "nan_policy=skip"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("skipped: not finite"), std::string::npos) << r.output;
  std::ifstream f(out + "/metrics.jsonl");
  std::string line;
  int skipped = 0, trained = 0;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("skipped", false)) {
      skipped++;
      EXPECT_EQ(j["reason"], "the loss");
    } else if (j.contains("loss") && !j["loss"].is_null()) {
      trained++;
    }
  }
  EXPECT_GT(skipped, 0);
  EXPECT_GT(trained, 0);
  EXPECT_EQ(skipped + trained, 6);
  expect_all_finite(out + "/adapter/adapter_model.safetensors");
  fs::remove_all(out);
}

TEST(TrainNumeric, UnknownNanPolicyIsAConfigError) {
  const std::string out = temp_dir("nan_bad");
  const RunResult r = run_qlora(args(out, "nan_policy=ignore"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("nan_policy"), std::string::npos) << r.output;
  fs::remove_all(out);
}

}  // namespace
