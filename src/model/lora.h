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

  // PEFT: alpha / r, or alpha / sqrt(r) with rsLoRA.
  float scale() const;
  // Expands "all-linear" (to the seven projections) and validates names; a name that matches no
  // projection or fused module is an error.
  static std::vector<std::string> resolve_targets(const std::vector<std::string>& names);
};

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
