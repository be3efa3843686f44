// End to end: `qlora train` with finetuning_type full on the tiny fixture model trains every
// weight, writes a Hugging Face model directory that opens as a base with the trained weights
// (its eval loss is the run's last), and resumes from a checkpoint to the same bytes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"

using namespace qlora::cli_test;
namespace fs = std::filesystem;

namespace {

std::string full_args(const std::string& out, int steps) {
  return std::string(QLORA_SOURCE_DIR) + "/examples/tiny_full.yaml output_dir=" + out + " max_steps=" +
         std::to_string(steps) + " save_steps=4 logging_steps=1 eval_steps=" + std::to_string(steps) +
         " threads=1 device=cpu model_name_or_path=" + QLORA_SOURCE_DIR + "/tests/fixtures/models/tiny_byte" +
         " train_file=" + QLORA_SOURCE_DIR + "/examples/data/tiny_train.jsonl eval_file=" + QLORA_SOURCE_DIR +
         "/examples/data/tiny_eval.jsonl";
}

// The logged (step, loss) and (step, eval_loss) records.
std::vector<std::pair<int64_t, double>> records(const std::string& out, const char* key) {
  std::vector<std::pair<int64_t, double>> v;
  for (const auto& j : metrics_records(out))
    if (j.contains(key)) v.emplace_back(j["step"].get<int64_t>(), j[key].get<double>());
  return v;
}

}  // namespace

TEST(TrainFull, TrainsEveryWeightAndWritesAModelDirectory) {
  const std::string out = temp_dir("full_ft");
  RunResult r = run_qlora("train " + full_args(out, 12));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("trained (full fine-tuning, every weight)"), std::string::npos) << r.output;
  ASSERT_TRUE(fs::exists(out + "/model.safetensors"));
  ASSERT_TRUE(fs::exists(out + "/config.json"));
  EXPECT_FALSE(fs::exists(out + "/adapter_model.safetensors"));
  ASSERT_TRUE(fs::exists(out + "/checkpoint-4/model.safetensors"));
  ASSERT_TRUE(fs::exists(out + "/checkpoint-4/optimizer.safetensors"));
  ASSERT_EQ(records(out, "loss").size(), 12u);
  // Evaluated before training (step 0) and at the end: the eval loss fell.
  const auto eval = records(out, "eval_loss");
  ASSERT_EQ(eval.size(), 2u);
  EXPECT_EQ(eval.back().first, 12);
  EXPECT_LT(eval.back().second, 0.97 * eval.front().second) << "training did not lower the eval loss";
  // The output opens as a base: its eval loss is the run's final one (same data, same weights).
  RunResult trained = run_qlora("eval " + full_args(out, 12) + " model_name_or_path=" + out + " --json");
  ASSERT_EQ(trained.code, 0) << trained.output;
  const auto j = nlohmann::json::parse(trained.output.substr(trained.output.find("{\n")));
  EXPECT_NEAR(j["loss"].get<double>(), eval.back().second, 1e-6 * eval.back().second) << trained.output;
}

TEST(TrainFull, ResumesFromACheckpointToTheSameBytes) {
  const std::string a = temp_dir("full_a"), b = temp_dir("full_b");
  RunResult ra = run_qlora("train " + full_args(a, 8));
  ASSERT_EQ(ra.code, 0) << ra.output;
  fs::create_directories(b);
  fs::copy(a + "/checkpoint-4", b + "/checkpoint-4", fs::copy_options::recursive);
  RunResult rb = run_qlora("train " + full_args(b, 8) + " resume_from_checkpoint=" + b + "/checkpoint-4");
  ASSERT_EQ(rb.code, 0) << rb.output;
  EXPECT_EQ(read_file(a + "/model.safetensors"), read_file(b + "/model.safetensors"));
  EXPECT_EQ(records(a, "loss").back(), records(b, "loss").back());
}

TEST(TrainFull, RefusesWhatItDoesNotImplement) {
  const std::string out = temp_dir("full_refused");
  const std::pair<const char*, const char*> cases[] = {
      {"r=8", "r applies to finetuning_type: lora, not full"},
      {"load_in_4bit=true", "a quantized base cannot be trained"},
      {"finetuning_type=freeze", "freeze"},
      {"rl=dpo", "with finetuning_type full is not implemented"},
  };
  for (const auto& [override, message] : cases) {
    RunResult r = run_qlora("train " + full_args(out, 2) + " " + override);
    EXPECT_NE(r.code, 0) << override;
    EXPECT_NE(r.output.find(message), std::string::npos) << override << ": " << r.output;
  }
}
