// LoRA hyper-parameters with PEFT semantics, and PEFT adapter file names.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/llama_config.h"

namespace qlora {

struct LoraSpec {
  int64_t r = 16;
  double alpha = 32;
  double dropout = 0.0;       // on the LoRA input only
  bool use_rslora = false;
  // LoRA modules: projections (q_proj ... down_proj) or, in models that fuse them, qkv_proj and
  // gate_up_proj; lora_targets_for() puts them in the model's terms.
  std::vector<std::string> targets;
  // LoRA on a mixture-of-experts model's stacked experts, PEFT's target_parameters on
  // mlp.experts.gate_up_proj and mlp.experts.down_proj (lora.ParamWrapper): "gate_up_proj" and/or
  // "down_proj", in that order. Each expert gets its own rank-r pair; gate_up_proj's covers gate's
  // rows, then up's.
  std::vector<std::string> expert_targets;

  // PEFT: alpha / r, or alpha / sqrt(r) with rsLoRA.
  float scale() const;
  // Expands "all-linear" (to the seven projections) and validates names; a name that matches no
  // projection or fused module is an error.
  static std::vector<std::string> resolve_targets(const std::vector<std::string>& names);
  // PEFT target_parameters names ("mlp.experts.gate_up_proj", or a suffix of it such as
  // "experts.down_proj", as PEFT matches them) -> expert_targets; anything else is an Error(Config)
  // naming `key`.
  static std::vector<std::string> resolve_expert_targets(const std::vector<std::string>& names, const std::string& key);
};

// The stacked expert weights LoRA can target, in PEFT's nesting order (the order transformers'
// expert modules register them): gate_up_proj, down_proj.
const std::vector<std::string>& expert_lora_kinds();
// (out, in) of one expert's weight: gate_up_proj (2 x expert_intermediate_size, hidden_size), gate's
// rows first; down_proj (hidden_size, expert_intermediate_size).
std::pair<int64_t, int64_t> expert_lora_shape(const LlamaConfig& c, const std::string& kind);
// Expert targets on a model without experts are an Error naming target_parameters; so is
// `dropout` above 0 beside them (PEFT's ParamWrapper refuses it: dropout cannot be factored out of
// the folded weight). Merging passes no dropout: it only reads the adapter.
void check_expert_targets(const LlamaConfig& c, const std::vector<std::string>& expert_targets, double dropout = 0);
// PEFT's module name of layer `layer`'s expert adapter of `kind`:
// "base_model.model.model.layers.3.mlp.experts", plus ".base_layer" for gate_up_proj when down_proj
// is adapted too (PEFT wraps the first parameter first, so the second wrapper holds it).
std::string peft_expert_module_name(const LlamaConfig& c, int64_t layer, const std::string& kind, const LoraSpec& s);
// The spec's expert targets as PEFT's target_parameters ("mlp.experts.gate_up_proj", ...).
std::vector<std::string> peft_target_parameters(const LoraSpec& s);

// The LoRA modules of a model in layer order: the seven projections, or with fused projections
// qkv_proj, o_proj, gate_up_proj, down_proj (what PEFT's all-linear finds in those models); a
// mixture-of-experts model's attention q_proj, k_proj, v_proj, o_proj (PEFT's all-linear there also
// adapts the experts and the router, which the engine does not: lora_targets_for refuses it).
std::vector<std::string> lora_modules(const LlamaConfig& c);
// The projections (all_linear_targets names) a LoRA module covers, in the order of its output rows.
std::vector<std::string> module_projections(const LlamaConfig& c, const std::string& module);
// Resolved targets (LoraSpec::resolve_targets) in the model's modules: in a fused model q/k/v
// become qkv_proj (all three or none) and gate/up gate_up_proj; a fused name in a model without
// fusion, or a part of a fused module, is an Error(Config) naming target_modules.
std::vector<std::string> lora_targets_for(const LlamaConfig& c, const std::vector<std::string>& targets);

// Layer 3's q_proj -> "base_model.model.model.layers.3.self_attn.q_proj" (a multimodal model's
// text model: "base_model.model.model.language_model.layers.3.self_attn.q_proj", as PEFT names it).
std::string peft_module_name(const LlamaConfig& c, int64_t layer, const std::string& proj);
// Hugging Face weight name of a planned base buffer ("layers.3.q_proj" -> "model.layers.3.self_attn.q_proj.weight").
std::string hf_weight_name(const std::string& plan_name);

}  // namespace qlora
