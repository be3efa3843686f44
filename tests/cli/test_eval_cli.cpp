// `qlora eval` on the tiny example: with the adapter a short `qlora train` run wrote it gives the
// eval_loss the trainer logged at its last step, without one the trainer's step-0 eval_loss (same
// batches, same definition); perplexity = exp(loss); --data and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "cli_util.h"

using namespace qlora::cli_test;
namespace fs = std::filesystem;

namespace {

const std::string kConfig = std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml";
// stdout only (the JSON); stderr (progress, notes) is dropped.
RunResult run_stdout(const std::string& args) { return run_command(std::string(QLORA_BIN) + " " + args + " 2>/dev/null"); }

class EvalCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir("eval_run"));
    // device=cpu threads=1: the same numbers run to run.
    train_ = new RunResult(run_qlora("train " + kConfig + " output_dir=" + *dir_ +
                                     " max_steps=12 eval_steps=6 logging_steps=1 threads=1 device=cpu"));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete train_;
  }
  void SetUp() override { ASSERT_EQ(train_->code, 0) << train_->output; }

  // eval_loss per step from metrics.jsonl
  static std::map<int64_t, double> eval_losses() {
    std::map<int64_t, double> m;
    std::istringstream in(read_file(*dir_ + "/metrics.jsonl"));
    for (std::string l; std::getline(in, l);) {
      if (l.empty()) continue;
      auto j = nlohmann::json::parse(l);
      if (j.contains("eval_loss")) m[j["step"].get<int64_t>()] = j["eval_loss"].get<double>();
    }
    return m;
  }

  static nlohmann::json eval_json(const std::string& args, RunResult* out = nullptr) {
    RunResult r = run_stdout("eval " + kConfig + " threads=1 device=cpu --json " + args);
    if (out) *out = r;
    EXPECT_EQ(r.code, 0) << r.output;
    return nlohmann::json::parse(r.output, nullptr, false);
  }

  static std::string* dir_;
  static RunResult* train_;
};
std::string* EvalCli::dir_ = nullptr;
RunResult* EvalCli::train_ = nullptr;

}  // namespace

TEST_F(EvalCli, AdapterGivesTheTrainersFinalEvalLoss) {
  const auto logged = eval_losses();
  ASSERT_EQ(logged.count(12), 1u) << "the last step's eval_loss is logged at step 12";
  const nlohmann::json j = eval_json("--adapter " + *dir_);
  ASSERT_TRUE(j.is_object());
  const double loss = j["loss"].get<double>();
  EXPECT_NEAR(loss, logged.at(12), 1e-6 * logged.at(12)) << j.dump();
  EXPECT_EQ(j["adapter"], *dir_);
  // ...and differs from the base model's: the adapter was applied.
  EXPECT_LT(loss, logged.at(0));
}

TEST_F(EvalCli, NoAdapterGivesTheStepZeroEvalLoss) {
  const auto logged = eval_losses();
  ASSERT_EQ(logged.count(0), 1u) << "the eval before training is logged as step 0";
  RunResult r;
  const nlohmann::json j = eval_json("", &r);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_NEAR(j["loss"].get<double>(), logged.at(0), 1e-6 * logged.at(0)) << j.dump();
  EXPECT_TRUE(j["adapter"].is_null());
}

TEST_F(EvalCli, JsonFieldsAndPerplexity) {
  const nlohmann::json j = eval_json("--adapter " + *dir_);
  ASSERT_TRUE(j.is_object());
  for (const char* k : {"loss", "perplexity", "tokens", "examples", "model", "adapter", "data"})
    EXPECT_TRUE(j.contains(k)) << k << " missing in " << j.dump();
  EXPECT_DOUBLE_EQ(j["perplexity"].get<double>(), std::exp(j["loss"].get<double>()));
  EXPECT_EQ(j["examples"].get<int64_t>(), 40);  // examples/data/tiny_eval.jsonl
  EXPECT_GT(j["tokens"].get<int64_t>(), 40);
  EXPECT_EQ(j["data"].get<std::string>(), "examples/data/tiny_eval.jsonl");
}

TEST_F(EvalCli, HumanOutputAndProgress) {
  RunResult r = run_qlora("eval " + kConfig + " threads=1 device=cpu --adapter " + *dir_);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* s : {"loss:", "perplexity:", "tokens scored:", "examples:      40", "eval batch 10/10", "ETA", "+ adapter"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << " missing in\n" << r.output;
  RunResult base = run_qlora("eval " + kConfig + " threads=1 device=cpu");
  ASSERT_EQ(base.code, 0) << base.output;
  EXPECT_NE(base.output.find("no adapter"), std::string::npos) << base.output;
}

TEST_F(EvalCli, DataOverride) {
  // Five rows of the eval file as their own file; also with the config's eval_file unset.
  const std::string d = temp_dir("eval_data");
  {
    std::istringstream in(read_file(std::string(QLORA_SOURCE_DIR) + "/examples/data/tiny_eval.jsonl"));
    std::ofstream out(d + "/five.jsonl");
    std::string l;
    for (int i = 0; i < 5 && std::getline(in, l); i++) out << l << "\n";
  }
  const nlohmann::json all = eval_json("--adapter " + *dir_);
  const nlohmann::json five = eval_json("--adapter " + *dir_ + " --data " + d + "/five.jsonl");
  ASSERT_TRUE(five.is_object());
  EXPECT_EQ(five["examples"].get<int64_t>(), 5);
  EXPECT_EQ(five["data"].get<std::string>(), d + "/five.jsonl");
  EXPECT_LT(five["tokens"].get<int64_t>(), all["tokens"].get<int64_t>());
  const nlohmann::json no_eval_file = eval_json("eval_file= --adapter " + *dir_ + " --data " + d + "/five.jsonl");
  ASSERT_TRUE(no_eval_file.is_object());
  EXPECT_EQ(no_eval_file["loss"], five["loss"]);
  // --data the config's own eval file: the same loss as without it
  const nlohmann::json same =
      eval_json("--adapter " + *dir_ + " --data " + std::string(QLORA_SOURCE_DIR) + "/examples/data/tiny_eval.jsonl");
  EXPECT_EQ(same["loss"], all["loss"]);
  fs::remove_all(d);
}

TEST_F(EvalCli, ClearErrors) {
  RunResult r = run_qlora("eval " + kConfig + " eval_file=");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("config error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no eval data"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--data"), std::string::npos) << r.output;

  r = run_qlora("eval " + kConfig + " --data /nonexistent/eval.jsonl");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("/nonexistent/eval.jsonl"), std::string::npos) << r.output;

  r = run_qlora("eval " + kConfig + " --adapter /nonexistent/adapter");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("adapter directory does not exist"), std::string::npos) << r.output;

  // An adapter trained for another model (llama_gqa: hidden size 64, tiny_byte: 128).
  r = run_qlora("eval " + kConfig + " --adapter " + std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/parity/llama_gqa_adapter");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("the adapter does not fit model"), std::string::npos) << r.output;

  r = run_qlora("eval");
  EXPECT_NE(r.code, 0);
}

TEST_F(EvalCli, TrainWritesTheLossPlot) {
  ASSERT_TRUE(fs::exists(*dir_ + "/loss.svg")) << train_->output;
  EXPECT_NE(train_->output.find("loss plot: " + *dir_ + "/loss.svg (12 train, 3 eval points)"), std::string::npos)
      << train_->output;
  const std::string svg = read_file(*dir_ + "/loss.svg");
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("<polyline class=\"train-loss\""), std::string::npos);
  for (const auto& e : fs::directory_iterator(*dir_)) EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
}

// The eval set as a val_set_size split of the train file, packed: the same rows as training's.
TEST(EvalCliSplit, PackedValSplitGivesTheTrainersEvalLosses) {
  const std::string d = temp_dir("eval_split");
  const std::string keys = " eval_file= val_set_size=0.1 packing=true threads=1 device=cpu";
  RunResult t = run_qlora("train " + kConfig + " output_dir=" + d + " max_steps=4 eval_steps=2" + keys);
  ASSERT_EQ(t.code, 0) << t.output;
  std::map<int64_t, double> logged;
  std::istringstream in(read_file(d + "/metrics.jsonl"));
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l);
    if (j.contains("eval_loss")) logged[j["step"].get<int64_t>()] = j["eval_loss"].get<double>();
  }
  ASSERT_EQ(logged.count(0) + logged.count(4), 2u);
  RunResult base = run_stdout("eval " + kConfig + keys + " --json");
  RunResult tuned = run_stdout("eval " + kConfig + keys + " --json --adapter " + d);
  ASSERT_EQ(base.code, 0);
  ASSERT_EQ(tuned.code, 0);
  const auto jb = nlohmann::json::parse(base.output), jt = nlohmann::json::parse(tuned.output);
  EXPECT_NEAR(jb["loss"].get<double>(), logged[0], 1e-6 * logged[0]);
  EXPECT_NEAR(jt["loss"].get<double>(), logged[4], 1e-6 * logged[4]);
  EXPECT_EQ(jt["examples"].get<int64_t>(), 40);  // 10% of the 400 train rows
  EXPECT_LT(jt["rows"].get<int64_t>(), 40);      // packed
  fs::remove_all(d);
}

// eval_strategy decides when the trainer evaluates: epoch at the step that draws an epoch's last
// micro-batch (24 rows in micro-batches of 4, 2 per step: 3 steps per epoch, 2 epochs), steps every
// eval_steps, no never; each but no also before training and at the end.
TEST(EvalStrategy, EpochStepsAndNoEvaluateWhereTheyShould) {
  const std::string d = temp_dir("eval_strategy");
  std::istringstream rows(read_file(std::string(QLORA_SOURCE_DIR) + "/examples/data/tiny_train.jsonl"));
  std::string line, small;
  for (int i = 0; i < 24 && std::getline(rows, line); i++) small += line + "\n";
  std::ofstream(d + "/train.jsonl") << small;
  auto eval_steps_of = [&](const std::string& keys) {
    const std::string out = d + "/run";
    fs::remove_all(out);
    RunResult r = run_qlora("train " + kConfig + " output_dir=" + out + " train_file=" + d + "/train.jsonl" +
                            " max_steps=-1 num_train_epochs=2 per_device_train_batch_size=4 gradient_accumulation_steps=2"
                            " save_steps=0 threads=1 device=cpu " + keys);
    EXPECT_EQ(r.code, 0) << r.output;
    std::vector<int64_t> steps;
    for (const auto& rec : metrics_records(out))
      if (rec.contains("eval_loss")) steps.push_back(rec["step"].get<int64_t>());
    return steps;
  };
  EXPECT_EQ(eval_steps_of("eval_strategy=epoch eval_steps=0"), (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(eval_steps_of("eval_strategy=steps eval_steps=2"), (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(eval_steps_of("eval_strategy=no eval_steps=2"), (std::vector<int64_t>{}));
  fs::remove_all(d);
}
