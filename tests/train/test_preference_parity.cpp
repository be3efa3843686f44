// Preference training against TRL 1.16's own trainers (tools/make_preference_fixtures.py,
// tests/fixtures/preference/README.md): the rows the engine's data path makes from each JSONL file
// equal the ids TRL trained on, and two optimizer steps from the same adapter give TRL's losses,
// metrics, every LoRA gradient and the weights after the first AdamW update.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "model_test_util.h"
#include "train/data.h"
#include "train/engine_config.h"
#include "train/preference_step.h"
#include "train/step.h"
#include "train/train_data.h"

namespace qlora {
namespace {

using namespace testing_util;
using json = nlohmann::json;

// fp32 against PyTorch's fp32: summation order only (as the SFT parity tests).
constexpr double kTol = 2e-5;

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::string pref_dir() { return fixtures() + "/preference/"; }

// The case's trainer settings as a qlora config over the case's JSONL file.
TrainConfig config_of(const json& fx) {
  const json& c = fx["config"];
  const std::string m = fx["method"];
  TrainConfig cfg;
  cfg.model_name_or_path = fixtures() + "/models/pref_tiny";
  cfg.train_file = pref_dir() + fx["dataset"].get<std::string>();
  cfg.rl = parse_objective(m, "method");
  cfg.beta = c["beta"];
  if (m == "dpo") {
    cfg.loss_type = parse_dpo_loss(c["loss_type"][0].get<std::string>(), "loss_type");
    cfg.label_smoothing = c.value("label_smoothing", 0.0);
  }
  if (m == "simpo") {
    cfg.simpo_gamma = c["simpo_gamma"];
    cfg.cpo_alpha = c["cpo_alpha"];
    cfg.label_smoothing = c.value("label_smoothing", 0.0);
  }
  if (m == "kto") {
    cfg.desirable_weight = c["desirable_weight"];
    cfg.undesirable_weight = c["undesirable_weight"];
  }
  cfg.max_length = c["max_length"];
  cfg.truncation = Truncation::TruncateRight;  // TRL's keep_start
  cfg.per_device_train_batch_size = c["per_device_train_batch_size"];
  cfg.lora_dropout = 0;
  cfg.r = 4;
  cfg.lora_alpha = 8;
  finalize_train_config(cfg);
  return cfg;
}

std::vector<int32_t> ids_of(const json& v) { return v.get<std::vector<int32_t>>(); }

// Document d of an example's row.
std::vector<int32_t> document(const Example& e, size_t d) {
  size_t at = 0;
  for (size_t k = 0; k < d; k++) at += size_t(e.doc_lens[k]);
  return std::vector<int32_t>(e.ids.begin() + std::ptrdiff_t(at), e.ids.begin() + std::ptrdiff_t(at + size_t(e.doc_lens[d])));
}

class PreferenceParity : public ::testing::TestWithParam<std::string> {};

TEST_P(PreferenceParity, RowsMatchTrlsTokens) {
  const json fx = read_json(pref_dir() + GetParam() + ".json");
  const TrainConfig cfg = config_of(fx);
  const TrainData data = load_train_data(cfg, open_tokenizer_source(cfg.model_name_or_path), [](const std::string&) {});
  const json& ex = fx["examples"];
  ASSERT_EQ(data.train.size(), ex.size());
  const bool kto = fx["method"] == "kto";
  for (size_t i = 0; i < ex.size(); i++) {
    SCOPED_TRACE("row " + std::to_string(i));
    const Example& e = data.train[i];
    ASSERT_EQ(e.doc_lens.size(), 2u);
    EXPECT_EQ(document(e, 0), ids_of(ex[i][kto ? "input_ids" : "chosen_input_ids"]));
    EXPECT_EQ(document(e, 1), ids_of(ex[i][kto ? "kl_input_ids" : "rejected_input_ids"]));
    // The completion is what TRL scores: its tokens carry labels, the prompt's do not (ORPO aside).
    int64_t completion = 0;
    for (size_t t = 0; t < size_t(e.doc_lens[0]); t++) completion += e.roles[t] != DocRole::Prompt;
    EXPECT_EQ(completion, ex[i][kto ? "n_completion" : "chosen_n_completion"].get<int64_t>());
  }
}

TEST_P(PreferenceParity, TwoStepsMatchTrl) {
  const json fx = read_json(pref_dir() + GetParam() + ".json");
  SafetensorsArchive tensors(pref_dir() + GetParam() + ".safetensors");
  const TrainConfig cfg = config_of(fx);
  const TrainData data = load_train_data(cfg, open_tokenizer_source(cfg.model_name_or_path), [](const std::string&) {});
  const std::vector<Example> train = data.train.materialize();
  std::vector<const Example*> rows;
  for (const Example& e : train) rows.push_back(&e);
  const Batch batch = pad_batch(rows, data.pad_id);

  ModelPlanOptions po;
  po.micro_batch = batch.b;
  po.seq_len = batch.t;
  const EngineSpec spec = engine_spec(cfg);
  TestModel t = make_model_on(make_cpu_backend(), "pref_tiny", po, spec.lora, "preference/init_adapter");
  const PreferenceSpec pspec = *preference_spec(cfg);
  const json& c = fx["config"];
  OptimHyper h{c["adam_beta1"], c["adam_beta2"], c["adam_epsilon"], c["weight_decay"], c["max_grad_norm"]};

  for (int step = 0; step < 2; step++) {
    SCOPED_TRACE("step " + std::to_string(step));
    const json& ref = fx[step == 0 ? "step0" : "step1"];
    PrefMetricMeans metrics;
    const StepResult r = train_step(*t.model, {batch}, h, c["learning_rate"], step, 0,
                                    preference_micro_step(*t.model, pspec, 1, &metrics));
    const double loss = ref["loss"];
    EXPECT_NEAR(r.loss, loss, kTol * std::max(1.0, std::fabs(loss)));
    EXPECT_NEAR(r.grad_norm, ref["metrics"]["grad_norm"].get<double>(), kTol * ref["metrics"]["grad_norm"].get<double>());
    const auto means = metrics.means();
    int compared = 0;
    for (const std::string& k : preference_metric_names()) {
      if (!ref["metrics"].contains(k)) {
        EXPECT_EQ(means.count(k), 0u) << k << " is reported but TRL does not log it";
        continue;
      }
      ASSERT_EQ(means.count(k), 1u) << k;
      const double want = ref["metrics"][k];
      EXPECT_NEAR(means.at(k), want, kTol * std::max(1.0, std::fabs(want))) << k;
      compared++;
    }
    EXPECT_GE(compared, 5);
    if (step > 0) continue;
    // Every LoRA gradient of step 0, and the weights after its AdamW update. The first update moves
    // each element by about lr * sign(g): elements whose gradient is within float noise of zero can
    // move either way, so the weights are compared where |g| is above 1e-4 of the tensor's largest.
    int checked = 0;
    for (auto& p : t.model->trainable_params()) {
      std::vector<float> g(size_t(p.g.numel())), w(size_t(p.w.numel()));
      t.be->copy_to_host(g.data(), p.g.data, g.size() * 4);
      t.be->copy_to_host(w.data(), p.w.data, w.size() * 4);
      const std::vector<float> gref = floats(tensors, "grad." + p.peft_key);
      const std::vector<float> wref = floats(tensors, "after1." + p.peft_key);
      double gmax = 0;
      for (float v : gref) gmax = std::max(gmax, double(std::fabs(v)));
      ASSERT_GT(gmax, 0) << p.peft_key;
      EXPECT_LT(rel_err(g, gref), kTol) << p.peft_key;
      for (size_t i = 0; i < w.size(); i++) {
        if (std::fabs(gref[i]) > 1e-4 * gmax) {
          ASSERT_NEAR(w[i], wref[i], 1e-6) << p.peft_key << "[" << i << "]";
        }
      }
      checked++;
    }
    EXPECT_EQ(checked, 2 * 7 * t.model->config().n_layer);
  }
}

INSTANTIATE_TEST_SUITE_P(Trl, PreferenceParity,
                         ::testing::Values("dpo_sigmoid_text", "dpo_sigmoid_chat", "dpo_sigmoid_implicit", "dpo_ipo",
                                           "dpo_hinge", "dpo_robust", "dpo_truncated", "orpo", "simpo", "kto"));

}  // namespace
}  // namespace qlora
