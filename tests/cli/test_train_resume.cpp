// End to end: `qlora train` on the tiny fixture model, interrupted by SIGTERM and resumed, gives
// exactly the losses and adapter of an uninterrupted run; outputs are PEFT files.
#include <gtest/gtest.h>

#include <csignal>
#include <chrono>
#include <thread>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"

using namespace qlora::cli_test;
namespace fs = std::filesystem;

namespace {

// device=cpu: bit-identical resume is the CPU's guarantee (fixed reduction orders). On a GPU the
// attention backward adds dq with atomics, so a resumed run equals an uninterrupted one to
// rounding, not to the bit (docs/cuda_backend.md).
std::string base_args(const std::string& out) {
  return std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml output_dir=" + out +
         " max_steps=48 save_steps=4 logging_steps=1 eval_steps=8 threads=1 device=cpu";
}

std::vector<std::string> metric_lines(const std::string& out) {
  std::vector<std::string> v;
  std::istringstream in(read_file(out + "/metrics.jsonl"));
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) v.push_back(l);
  return v;
}

// loss / eval_loss per step, exact (tokens_per_second differs run to run).
std::vector<std::pair<int64_t, std::string>> losses(const std::string& out) {
  std::vector<std::pair<int64_t, std::string>> v;
  for (const auto& l : metric_lines(out)) {
    auto j = nlohmann::json::parse(l);
    std::string s;
    if (j.contains("loss")) s += "loss=" + j["loss"].dump();
    if (j.contains("eval_loss")) s += " eval=" + j["eval_loss"].dump();
    v.emplace_back(j["step"].get<int64_t>(), s);
  }
  return v;
}

}  // namespace

TEST(TrainCli, InterruptAndResumeIsBitIdentical) {
  const std::string a = temp_dir("full"), b = temp_dir("resumed");
  RunResult full = run_qlora("train " + base_args(a));
  ASSERT_EQ(full.code, 0) << full.output;
  ASSERT_TRUE(fs::exists(a + "/adapter_model.safetensors"));
  ASSERT_TRUE(fs::exists(a + "/adapter_config.json"));
  ASSERT_TRUE(fs::exists(a + "/checkpoint-4/optimizer.safetensors"));
  auto ref = losses(a);
  ASSERT_GE(ref.size(), 48u);

  // Start the same run, SIGTERM it after its first logged step, then resume from the latest checkpoint.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string log = b + "/first.log";
    execl("/bin/sh", "sh", "-c", (std::string("exec ") + QLORA_BIN + " train " + base_args(b) + " > " + log + " 2>&1").c_str(),
          (char*)nullptr);
    _exit(127);
  }
  for (int i = 0; i < 600 && metric_lines(b).size() < 3; i++) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << read_file(b + "/first.log");
  const int code = WEXITSTATUS(st);
  // 48 steps leave ~45 to go when the signal lands: the run must have stopped on it, not finished.
  ASSERT_EQ(code, 130) << read_file(b + "/first.log");
  EXPECT_NE(read_file(b + "/first.log").find("resume with"), std::string::npos);
  // the stopped run plots what it logged, after its checkpoint
  EXPECT_NE(read_file(b + "/first.log").find("loss plot: " + b + "/loss.svg"), std::string::npos) << read_file(b + "/first.log");
  EXPECT_TRUE(fs::exists(b + "/loss.svg"));
  ASSERT_LT(metric_lines(b).size(), ref.size()) << "the interrupted run had already finished";

  RunResult resumed = run_qlora("train " + base_args(b) + " resume_from_checkpoint=latest");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_EQ(losses(b), ref);
  EXPECT_EQ(read_file(b + "/adapter_model.safetensors"), read_file(a + "/adapter_model.safetensors"));
  fs::remove_all(a);
  fs::remove_all(b);
}

// A fresh run in an output_dir that holds an earlier run's metrics starts the file anew: one
// step-0 (before training) eval record, not the old run's beside the new one's.
TEST(TrainCli, FreshRunInAUsedOutputDirStartsTheMetricsAnew) {
  const std::string a = temp_dir("again");
  const std::string args = "train " + std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml output_dir=" + a +
                           " max_steps=2 eval_steps=2 save_steps=100 threads=1";
  for (int run = 0; run < 2; run++) {
    RunResult r = run_qlora(args);
    ASSERT_EQ(r.code, 0) << r.output;
  }
  int step0 = 0, rows = 0;
  for (const auto& l : metric_lines(a)) {
    const auto j = nlohmann::json::parse(l);
    rows++;
    step0 += j["step"].get<int64_t>() == 0;
  }
  EXPECT_EQ(step0, 1) << "of " << rows << " records";
  fs::remove_all(a);
}

TEST(TrainCli, LossFallsOnTheTinyExample) {
  const std::string a = temp_dir("falls");
  RunResult r = run_qlora("train " + std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml output_dir=" + a +
                          " max_steps=24 eval_steps=12 threads=1");
  ASSERT_EQ(r.code, 0) << r.output;
  auto lines = metric_lines(a);
  ASSERT_GE(lines.size(), 2u);
  double first = -1, last = -1, eval_first = -1, eval_last = -1;
  for (const auto& l : lines) {
    auto j = nlohmann::json::parse(l);
    if (j.contains("loss")) {
      if (first < 0) first = j["loss"].get<double>();
      last = j["loss"].get<double>();
    }
    if (j.contains("eval_loss")) {
      if (eval_first < 0) eval_first = j["eval_loss"].get<double>();
      eval_last = j["eval_loss"].get<double>();
    }
  }
  // Per-batch training loss is noisy; the held-out loss before vs after training is the signal.
  ASSERT_GT(eval_first, 0) << "no eval_loss before training in metrics.jsonl";
  EXPECT_LT(eval_last, eval_first * 0.97) << r.output;
  EXPECT_LT(last, first) << r.output;
  auto cfg = nlohmann::json::parse(read_file(a + "/adapter_config.json"));
  EXPECT_EQ(cfg["peft_type"], "LORA");
  fs::remove_all(a);
}

TEST(TrainCli, BadInputsGiveClearErrors) {
  const std::string d = temp_dir("bad");
  const std::string cfg = std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml output_dir=" + d;
  {
    RunResult r = run_qlora("train " + cfg + " learnig_rate=1e-3");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.output.find("learning_rate"), std::string::npos) << r.output;
  }
  {
    std::ofstream(d + "/bad.jsonl") << "{\"text\": \"ok\"}\n{\"text\": broken\n";
    RunResult r = run_qlora("train " + cfg + " train_file=" + d + "/bad.jsonl");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.output.find("bad.jsonl:2"), std::string::npos) << r.output;
  }
  {
    std::ofstream(d + "/empty.jsonl") << "\n";
    RunResult r = run_qlora("train " + cfg + " train_file=" + d + "/empty.jsonl");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.output.find("empty"), std::string::npos) << r.output;
  }
  {
    RunResult r = run_qlora("train " + cfg + " model_name_or_path=" + d + "/nope");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  }
  {
    RunResult r = run_qlora("train " + cfg + " target_modules=[q_proj,qkv_proj]");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.output.find("qkv_proj"), std::string::npos) << r.output;
  }
  {
    RunResult r = run_qlora("train " + cfg + " learning_rate=fast");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.output.find("learning_rate"), std::string::npos) << r.output;
  }
  fs::remove_all(d);
}
