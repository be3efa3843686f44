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
  std::vector<std::string> targets;  // subset of all_linear_targets()

  // PEFT: alpha / r, or alpha / sqrt(r) with rsLoRA.
  float scale() const;
  // Expands "all-linear" and validates names; a name that matches no projection is an error.
  static std::vector<std::string> resolve_targets(const std::vector<std::string>& names);
};

// "layers.3.q_proj" -> "base_model.model.model.layers.3.self_attn.q_proj"
std::string peft_module_name(int64_t layer, const std::string& proj);
// Hugging Face weight name of a planned base buffer ("layers.3.q_proj" -> "model.layers.3.self_attn.q_proj.weight").
std::string hf_weight_name(const std::string& plan_name);

}  // namespace qlora
