// Shared helpers for model tests: build a model on any backend from a fixture directory, read
// fixture tensors, compare results.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "model/decoder_model.h"
#include "model/peft_io.h"
#include "model/quant_bytes.h"
#include "model/modes.h"
#include "text/dataset.h"
#include "train/model_source.h"

namespace qlora::testing_util {

inline std::string fixtures() { return QLORA_FIXTURES; }

struct TestModel {
  std::unique_ptr<Backend> be;
  ModelSource src;
  std::unique_ptr<DecoderModel> model;
};

// The model of tests/fixtures/models/<variant> on `be` with `po` and `lora`, its base loaded and
// its adapters initialized; with `adapter`, the adapter weights then loaded from that PEFT
// directory under tests/fixtures (a trained adapter, B != 0, so LoRA contributes from the start).
inline TestModel make_model_on(std::unique_ptr<Backend> be, const std::string& variant, const ModelPlanOptions& po,
                               const LoraSpec& lora, const std::string& adapter = "") {
  TestModel t;
  t.be = std::move(be);
  t.src = open_model_source(fixtures() + "/models/" + variant);
  ModelPlanOptions o = po;  // gpt-oss: its MXFP4 experts as shipped, as the trainer takes them
  if (!o.expert_precision && t.src.tensors.stored_expert_quant)
    o.expert_precision = base_precision_of(*t.src.tensors.stored_expert_quant);
  t.model = std::make_unique<DecoderModel>(t.src.config, *t.be, o, lora);
  t.model->load_base(t.src.tensors);
  t.model->init_trainable(1);
  if (!adapter.empty()) load_peft_adapter(fixtures() + "/" + adapter, *t.model);
  return t;
}

inline TestModel make_model(const std::string& variant, LoraSpec lora, int64_t mb, int64_t seq,
                            const std::string& ckpt = "none", int64_t ce_chunk = 1024) {
  ModelPlanOptions po;
  po.micro_batch = mb;
  po.seq_len = seq;
  po.checkpointing = parse_checkpointing(ckpt, "checkpointing");
  po.ce_chunk = ce_chunk;
  return make_model_on(make_cpu_backend(), variant, po, lora);
}

inline LoraSpec fixture_lora() {
  LoraSpec s;
  s.r = 4;
  s.alpha = 8;
  s.targets = LoraSpec::resolve_targets({"all-linear"});
  return s;
}
// The fixture adapter's targets for a variant: all-linear, or the attention's four on the
// mixture-of-experts fixtures (where all-linear would adapt the experts, which the engine refuses).
inline LoraSpec fixture_lora(const std::string& variant) {
  LoraSpec s = fixture_lora();
  if (variant == "mixtral" || variant == "qwen3_moe" || variant == "mixtral_aux" || variant == "qwen3_moe_norm")
    s.targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
  if (variant == "qwen3_moe_experts") {  // LoRA on the stacked experts too (PEFT's target_parameters)
    s.targets = {"q_proj", "v_proj"};
    s.expert_targets = {"gate_up_proj", "down_proj"};
  }
  if (variant == "gpt_oss") {  // the attention's q, v and o (biased) and both expert stacks
    s.targets = {"q_proj", "v_proj", "o_proj"};
    s.expert_targets = {"gate_up_proj", "down_proj"};
  }
  return s;
}

inline std::vector<int32_t> ints(const SafetensorsArchive& ar, const std::string& name) {
  const TensorInfo& ti = ar.get(name);
  std::vector<int32_t> v(size_t(ti.nbytes / 4));
  std::memcpy(v.data(), ti.data, size_t(ti.nbytes));
  return v;
}

inline std::vector<float> floats(const SafetensorsArchive& ar, const std::string& name) {
  const TensorInfo& ti = ar.get(name);
  int64_t n = 1;
  for (auto s : ti.shape) n *= s;
  std::vector<float> v(static_cast<size_t>(n));
  ar.read_f32(name, v.data(), ti.shape);
  return v;
}

// max |a-b| / max|b|: relative to the largest element of this reference tensor (its own scale,
// not 1, so small gradients are held to the same relative precision as large ones). An all-zero
// reference only matches an all-zero result.
// An f32 tensor of a model's backend, copied to the host.
inline std::vector<float> host_copy(DecoderModel& m, const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  m.backend().copy_to_host(v.data(), t.data, v.size() * 4);
  return v;
}

// The CPU engine's logits for one row of `ids` on a model (directory or GGUF) with the PEFT adapter
// in `adapter`, or with a rank-4 LoRA on o_proj (every family keeps it unfused) that adds nothing.
inline std::vector<float> source_logits(const std::string& model, const std::string& adapter,
                                        const std::vector<int32_t>& ids) {
  ModelSource src = open_model_source(model);
  auto be = make_cpu_backend();
  LoraSpec lora;
  if (adapter.empty()) {
    lora.r = 4;
    lora.alpha = 8;
    lora.targets = LoraSpec::resolve_targets({"o_proj"});
  } else {
    lora = read_peft_adapter_config(adapter + "/adapter_config.json");
  }
  ModelPlanOptions po;
  po.micro_batch = 1;
  po.seq_len = int64_t(ids.size());
  DecoderModel m(src.config, *be, po, lora);
  m.load_base(src.tensors);
  if (adapter.empty()) m.init_trainable(7);  // B = 0: adds nothing
  else load_peft_adapter(adapter, m);
  return m.logits(Batch::from_hf(1, int64_t(ids.size()), ids, ids));
}

// The engine's logits (V per position) against another implementation's (llama.cpp, transformers) as
// the fixture scripts record them per position (top_ids, top_logits, logsumexp): the largest
// difference over the recorded logits and the logsumexp, the positions whose top token is the
// record's, and those where the record's top two are more than `margin` apart and the engine's top
// token is another.
struct RecordedLogitsGap {
  double max_diff = 0;
  int top1_equal = 0;
  std::vector<size_t> top1_wrong_with_margin;
};
inline RecordedLogitsGap recorded_logits_gap(const std::vector<float>& lg, const nlohmann::json& rows, double margin) {
  RecordedLogitsGap g;
  const size_t V = rows.empty() ? 0 : lg.size() / rows.size();
  for (size_t t = 0; t < rows.size(); t++) {
    const nlohmann::json& r = rows[t];
    const float* row = lg.data() + t * V;
    const auto top_ids = r["top_ids"].get<std::vector<int64_t>>();
    const auto top = r["top_logits"].get<std::vector<double>>();
    for (size_t k = 0; k < top_ids.size(); k++) g.max_diff = std::max(g.max_diff, std::abs(row[top_ids[k]] - top[k]));
    const double m = *std::max_element(row, row + V);
    double s = 0;
    for (size_t v = 0; v < V; v++) s += std::exp(double(row[v]) - m);
    g.max_diff = std::max(g.max_diff, std::abs(m + std::log(s) - r["logsumexp"].get<double>()));
    const bool same = std::max_element(row, row + V) - row == top_ids[0];
    g.top1_equal += same;
    if (!same && top.size() > 1 && top[0] - top[1] > margin) g.top1_wrong_with_margin.push_back(t);
  }
  return g;
}

// The same between two such records of one token sequence (over the ids both list at a position).
inline double records_gap(const nlohmann::json& a, const nlohmann::json& b) {
  double g = 0;
  for (size_t t = 0; t < a.size(); t++) {
    const auto ia = a[t]["top_ids"].get<std::vector<int64_t>>(), ib = b[t]["top_ids"].get<std::vector<int64_t>>();
    const auto la = a[t]["top_logits"].get<std::vector<double>>(), lb = b[t]["top_logits"].get<std::vector<double>>();
    for (size_t i = 0; i < ia.size(); i++)
      for (size_t j = 0; j < ib.size(); j++)
        if (ia[i] == ib[j]) g = std::max(g, std::abs(la[i] - lb[j]));
    g = std::max(g, std::abs(a[t]["logsumexp"].get<double>() - b[t]["logsumexp"].get<double>()));
  }
  return g;
}

inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, scale = 0;
  for (size_t i = 0; i < a.size(); i++) {
    m = std::max(m, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  if (a.size() != b.size()) return INFINITY;
  return scale > 0 ? m / scale : (m > 0 ? INFINITY : 0.0);
}

// Two micro-batches of 2 x 12 tokens, every fifth label masked.
inline std::vector<Batch> small_micro_batches(int64_t vocab) {
  std::vector<Batch> mbs;
  for (int j = 0; j < 2; j++) {
    std::vector<int32_t> ids(24), labels(24);
    for (int i = 0; i < 24; i++) {
      ids[size_t(i)] = int32_t((i * 7 + j * 13 + 3) % vocab);
      labels[size_t(i)] = i % 5 == 0 ? -100 : int32_t((i * 11 + j + 1) % vocab);
    }
    mbs.push_back(Batch::from_hf(2, 12, ids, labels));
  }
  return mbs;
}

// Preference rows for model tests: row i is a prompt of shapes[i][0] random tokens followed by
// two completions of shapes[i][1] and shapes[i][2] random tokens, each a document of its own, with
// the roles `method` gives them (KTO: the first desirable in even rows, undesirable in odd ones,
// then a KL probe; ORPO also labels the chosen's prompt after its first token).
inline std::vector<Example> preference_rows(Objective method, Rng& rng, int64_t vocab,
                                            const std::vector<std::array<int, 3>>& shapes) {
  std::vector<Example> rows(shapes.size());
  for (size_t i = 0; i < shapes.size(); i++) {
    std::vector<int32_t> prompt(size_t(shapes[i][0]));
    for (auto& v : prompt) v = int32_t(rng.below(uint64_t(vocab)));
    for (int d = 0; d < 2; d++) {
      const DocRole role = method == Objective::Kto
                               ? (d == 0 ? (i % 2 ? DocRole::Undesirable : DocRole::Desirable) : DocRole::KlProbe)
                               : (d == 0 ? DocRole::Chosen : DocRole::Rejected);
      for (size_t k = 0; k < prompt.size(); k++) {
        rows[i].ids.push_back(prompt[k]);
        rows[i].labels.push_back(method == Objective::Orpo && d == 0 && k > 0 ? prompt[k] : kNoLoss);
        rows[i].roles.push_back(DocRole::Prompt);
      }
      for (int k = 0; k < shapes[i][1 + d]; k++) {
        const int32_t v = int32_t(rng.below(uint64_t(vocab)));
        rows[i].ids.push_back(v);
        rows[i].labels.push_back(v);
        rows[i].roles.push_back(role);
      }
      rows[i].doc_lens.push_back(int32_t(prompt.size()) + shapes[i][1 + d]);
    }
  }
  return rows;
}

}  // namespace qlora::testing_util
