// End to end: `qlora train` with a preference objective (rl: dpo / orpo / simpo / kto) on the tiny
// preference fixture model: TRL's metric names in metrics.jsonl (train and eval), the progress
// line, a PEFT adapter, refusals of rows that do not fit the objective, and a run killed with
// SIGKILL that resumes from its checkpoint to the same final loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <fstream>
#include <thread>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"

using namespace qlora::cli_test;
namespace fs = std::filesystem;

namespace {

std::string fx(const std::string& p) { return std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/" + p; }

// A config over the preference fixtures; `extra` are key=value overrides.
std::string args(const std::string& out, const std::string& rl, const std::string& train, const std::string& extra = "") {
  const std::string cfg = out + "/cfg.yaml";
  fs::create_directories(out);
  std::ofstream(cfg) << "model_name_or_path: " << fx("models/pref_tiny") << "\n"
                     << "train_file: " << fx("preference/" + train) << "\n"
                     << "rl: " << rl << "\nper_device_train_batch_size: 2\nlearning_rate: 1.0e-2\n"
                     << "lr_scheduler_type: constant\nr: 4\nlora_alpha: 8\nlogging_steps: 1\nthreads: 1\n"
                     << "device: cpu\nseed: 3\n";
  return "train " + cfg + " output_dir=" + out + " " + extra;
}

TEST(TrainPreference, DpoLogsTrlsMetricsAndWritesAnAdapter) {
  const std::string out = temp_dir("pref_dpo");
  RunResult r = run_qlora(args(out, "dpo", "pairs_text.jsonl",
                               "max_steps=6 eval_file=" + fx("preference/pairs_chat.jsonl") + " eval_steps=3"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("acc "), std::string::npos) << "the progress line shows the reward accuracy\n" << r.output;
  ASSERT_TRUE(fs::exists(out + "/adapter_model.safetensors"));
  int train = 0, eval = 0;
  double first_margin = 0, last_margin = 0;
  for (const auto& j : metrics_records(out)) {
    if (j.contains("loss")) {
      for (const char* k : {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                            "logps/rejected"})
        ASSERT_TRUE(j.contains(k)) << k << " in " << j.dump();
      EXPECT_NEAR(j["rewards/margins"].get<double>(), j["rewards/chosen"].get<double>() - j["rewards/rejected"].get<double>(), 1e-6);
      (train++ == 0 ? first_margin : last_margin) = j["rewards/margins"];
    }
    if (j.contains("eval_loss")) {
      EXPECT_TRUE(j.contains("eval_rewards/accuracies")) << j.dump();
      eval++;
    }
  }
  EXPECT_EQ(train, 6);
  EXPECT_EQ(eval, 3);  // before training, step 3, step 6
  EXPECT_GT(last_margin, first_margin) << "six steps at lr 1e-2 separate chosen from rejected";
  // loss.svg draws the train and eval reward accuracies beside the losses.
  const std::string svg = read_file(out + "/loss.svg");
  EXPECT_NE(svg.find("id=\"reward-accuracy\""), std::string::npos);
  EXPECT_NE(svg.find("id=\"eval-reward-accuracy\""), std::string::npos);
  // qlora eval with the adapter gives the trainer's last eval numbers.
  double last_eval = -1, last_eval_acc = -1;
  for (const auto& j : metrics_records(out))
    if (j.contains("eval_loss")) last_eval = j["eval_loss"], last_eval_acc = j["eval_rewards/accuracies"];
  RunResult e = run_qlora("eval " + out + "/cfg.yaml --adapter " + out + " --data " + fx("preference/pairs_chat.jsonl") + " --json");
  ASSERT_EQ(e.code, 0) << e.output;
  const auto ej = nlohmann::json::parse(e.output.substr(e.output.find("{\n")));
  EXPECT_EQ(ej["objective"], "dpo");
  EXPECT_TRUE(ej["perplexity"].is_null());
  EXPECT_NEAR(ej["loss"].get<double>(), last_eval, 1e-6 * std::fabs(last_eval));
  EXPECT_EQ(ej["rewards/accuracies"].get<double>(), last_eval_acc);
  fs::remove_all(out);
}

TEST(TrainPreference, EveryMethodRuns) {
  for (const auto& [rl, file] : std::vector<std::pair<std::string, std::string>>{
           {"orpo", "pairs_text.jsonl"}, {"simpo", "pairs_implicit.jsonl"}, {"kto", "kto.jsonl"}}) {
    const std::string out = temp_dir("pref_" + rl);
    RunResult r = run_qlora(args(out, rl, file, "max_steps=2"));
    ASSERT_EQ(r.code, 0) << rl << "\n" << r.output;
    const auto recs = metrics_records(out);
    ASSERT_FALSE(recs.empty());
    EXPECT_TRUE(recs.back().contains(rl == "kto" ? "kl" : "rewards/accuracies")) << recs.back().dump();
    fs::remove_all(out);
  }
}

TEST(TrainPreference, RowsThatDoNotFitTheObjectiveAreRefused) {
  const std::string out = temp_dir("pref_refuse");
  // Preference rows under SFT, SFT rows under DPO, pairs under KTO, a key of another method.
  struct Case {
    std::string rl, file, extra, says;
  };
  const std::vector<Case> cases = {
      {"sft", "pairs_text.jsonl", "", "set rl: dpo"},
      {"dpo", "kto.jsonl", "", "rl: kto"},
      {"kto", "pairs_text.jsonl", "", "rl: dpo, orpo or simpo"},
      {"orpo", "pairs_text.jsonl", "loss_type=ipo", "loss_type applies to rl: dpo"},
      {"dpo", "pairs_text.jsonl", "packing=true", "packing is not implemented"},
      {"kto", "kto.jsonl", "per_device_train_batch_size=1", "rl: kto needs per_device_train_batch_size of at least 2"},
  };
  for (const Case& c : cases) {
    RunResult r = run_qlora(args(out, c.rl, c.file, "max_steps=1 " + c.extra));
    EXPECT_NE(r.code, 0) << c.rl << " " << c.file << " " << c.extra;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
  }
  // SFT rows under DPO: the file is named.
  RunResult r = run_qlora(args(out, "dpo", "../../../examples/data/tiny_train.jsonl", "max_steps=1"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("tiny_train.jsonl"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("trains on preference rows"), std::string::npos) << r.output;
  fs::remove_all(out);
}

// precompute_ref_log_probs: the reference log-probs computed once before training (and read back
// from output_dir by the next run on the same data) train as the in-step reference does.
TEST(TrainPreference, PrecomputedReferenceTrainsAsTheInStepOne) {
  const std::string a = temp_dir("pref_instep"), b = temp_dir("pref_pre");
  // The precomputed pass scores the rows in other batches than the step does (other GEMM shapes:
  // rounding-level differences of the reference log-probs).
  const std::string extra =
      "max_steps=4 eval_file=" + fx("preference/pairs_chat.jsonl") + " eval_steps=2" + kOptimizerLipschitzInGradient;
  for (const std::string& rl : {std::string("dpo"), std::string("kto")}) {
    const std::string file = rl == "kto" ? "kto.jsonl" : "pairs_text.jsonl";
    const std::string eval = rl == "kto" ? " eval_file=" + fx("preference/kto.jsonl") : "";
    RunResult in_step = run_qlora(args(a, rl, file, extra + eval));
    ASSERT_EQ(in_step.code, 0) << in_step.output;
    RunResult pre = run_qlora(args(b, rl, file, extra + eval + " precompute_ref_log_probs=true"));
    ASSERT_EQ(pre.code, 0) << pre.output;
    EXPECT_NE(pre.output.find("reference log-probs: computed"), std::string::npos) << pre.output;
    ASSERT_TRUE(fs::exists(b + "/reference_logps.json"));
    const auto x = metrics_records(a), y = metrics_records(b);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); i++)
      for (const char* k : {"loss", "eval_loss", "rewards/chosen", "eval_rewards/chosen"})
        if (x[i].contains(k)) {
          const double u = x[i][k], v = y[i][k];
          EXPECT_NEAR(u, v, 1e-6 * std::max(1.0, std::fabs(u))) << rl << " " << k << " in record " << i;
        }
    // A rerun on the same model and data reads the values back instead of computing them.
    RunResult again = run_qlora(args(b, rl, file, extra + eval + " precompute_ref_log_probs=true"));
    ASSERT_EQ(again.code, 0) << again.output;
    EXPECT_NE(again.output.find("reference log-probs: read"), std::string::npos) << again.output;
    EXPECT_EQ(metrics_records(b).back()["loss"], y.back()["loss"]);
    fs::remove_all(a);
    fs::remove_all(b);
  }
  // Only the objectives with a reference take it.
  const std::string c = temp_dir("pref_pre_orpo");
  RunResult r = run_qlora(args(c, "orpo", "pairs_text.jsonl", "max_steps=1 precompute_ref_log_probs=true"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("precompute_ref_log_probs applies to rl: dpo and kto"), std::string::npos) << r.output;
  fs::remove_all(c);
}

// SIGKILL mid-run, then resume_from_checkpoint=latest: the same final loss, bit for bit (CPU).
TEST(TrainPreference, KilledDpoRunResumesToTheSameFinalLoss) {
  const std::string a = temp_dir("pref_full"), b = temp_dir("pref_killed");
  // 120 steps of 8 micro-batches leave over a second of work after the kill.
  const std::string extra = "max_steps=120 gradient_accumulation_steps=8 save_steps=2 save_total_limit=2";
  RunResult full = run_qlora(args(a, "dpo", "pairs_text.jsonl", extra));
  ASSERT_EQ(full.code, 0) << full.output;
  const auto ref = metrics_records(a);
  ASSERT_EQ(ref.back()["step"], 120);

  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  const std::string cmd = std::string(QLORA_BIN) + " " + args(b, "dpo", "pairs_text.jsonl", extra);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd + " > " + b + "/first.log 2>&1").c_str(), (char*)nullptr);
    _exit(127);
  }
  auto logged = [&] {  // complete lines: the writer may be mid-line
    const std::string m = fs::exists(b + "/metrics.jsonl") ? read_file(b + "/metrics.jsonl") : "";
    return size_t(std::count(m.begin(), m.end(), '\n'));
  };
  for (int i = 0; i < 2400 && logged() < 4; i++) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st)) << "the run finished before it was killed: " << read_file(b + "/first.log");
  RunResult resumed = run_qlora(args(b, "dpo", "pairs_text.jsonl", extra + " resume_from_checkpoint=latest"));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  const auto got = metrics_records(b);
  ASSERT_EQ(got.back()["step"], 120);
  EXPECT_EQ(got.back()["loss"], ref.back()["loss"]);
  EXPECT_EQ(got.back()["rewards/margins"], ref.back()["rewards/margins"]);
  EXPECT_EQ(read_file(a + "/adapter_model.safetensors"), read_file(b + "/adapter_model.safetensors"));
  fs::remove_all(a);
  fs::remove_all(b);
}

}  // namespace
