// `sample_prompts`: a training run prints the model's answers before and after training and writes
// them to samples.json; a resumed run skips "before" and keeps the first run's.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"

using namespace qlora::cli_test;

namespace {

std::string args(const std::string& out, int steps) {
  return "train " + std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml output_dir=" + out +
         " max_steps=" + std::to_string(steps) +
         " save_steps=1 eval_strategy=no threads=1 sample_max_new_tokens=12"
         " 'sample_prompts=[The ocean, \"Once upon a time, there\"]'";
}

void expect_answers(const nlohmann::json& block) {
  ASSERT_TRUE(block.is_array());
  ASSERT_EQ(block.size(), 2u);
  EXPECT_EQ(block[0]["prompt"], "The ocean");
  EXPECT_EQ(block[1]["prompt"], "Once upon a time, there");
  for (const auto& a : block) EXPECT_FALSE(a["answer"].get<std::string>().empty()) << block.dump();
}

}  // namespace

TEST(TrainSamples, PrintsAndWritesAnswersBeforeAndAfterTraining) {
  const std::string out = temp_dir("samples");
  RunResult r = run_qlora(args(out, 2));
  ASSERT_EQ(r.code, 0) << r.output;
  const size_t before = r.output.find("sample answers before training:");
  const size_t step = r.output.find("step 2/2");
  const size_t after = r.output.find("sample answers after training:");
  ASSERT_NE(before, std::string::npos) << r.output;
  ASSERT_NE(after, std::string::npos) << r.output;
  EXPECT_LT(before, step) << r.output;
  EXPECT_LT(step, after) << r.output;
  EXPECT_NE(r.output.find("  prompt: Once upon a time, there\n  answer: "), std::string::npos) << r.output;

  const auto j = nlohmann::json::parse(read_file(out + "/samples.json"));
  expect_answers(j["before"]);
  expect_answers(j["after"]);

  // Resuming from checkpoint-1 (into a longer run): no "before" block; samples.json keeps the first one.
  RunResult resumed = run_qlora(args(out, 3) + " resume_from_checkpoint=latest");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("sample answers before training:"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("sample answers after training:"), std::string::npos) << resumed.output;
  const auto k = nlohmann::json::parse(read_file(out + "/samples.json"));
  EXPECT_EQ(k["before"], j["before"]);
  expect_answers(k["after"]);
}
