// LoRA spec helpers and PEFT / Hugging Face name mapping.
#include "model/lora.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/model_plan.h"

namespace qlora {

float LoraSpec::scale() const {
  return float(use_rslora ? alpha / std::sqrt(double(r)) : alpha / double(r));
}

std::vector<std::string> LoraSpec::resolve_targets(const std::vector<std::string>& names) {
  const auto& all = all_linear_targets();
  std::vector<std::string> out;
  for (const auto& n : names) {
    if (n == "all-linear" || n == "all_linear" || n == "all") return all;
    if (std::find(all.begin(), all.end(), n) == all.end()) {
      std::string list;
      for (const auto& a : all) list += (list.empty() ? "" : ", ") + a;
      fail(ErrorKind::Config, "target_modules", "'" + n + "' matches no module of this model",
           "valid targets: " + list + ", or all-linear");
    }
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  if (out.empty()) fail(ErrorKind::Config, "target_modules", "no LoRA target modules given", "e.g. all-linear");
  // Keep the model's projection order so parameter order is independent of how the user listed them.
  std::vector<std::string> ordered;
  for (const auto& a : all)
    if (std::find(out.begin(), out.end(), a) != out.end()) ordered.push_back(a);
  return ordered;
}

static std::string hf_module(int64_t layer, const std::string& proj) {
  const bool attn = proj == "q_proj" || proj == "k_proj" || proj == "v_proj" || proj == "o_proj" ||
                    proj == "q_norm" || proj == "k_norm";
  return "model.layers." + std::to_string(layer) + (attn ? ".self_attn." : ".mlp.") + proj;
}

std::string peft_module_name(int64_t layer, const std::string& proj) {
  return "base_model.model." + hf_module(layer, proj);
}

std::string hf_weight_name(const std::string& n) {
  if (n == "embed_tokens") return "model.embed_tokens.weight";
  if (n == "norm") return "model.norm.weight";
  if (n == "lm_head") return "lm_head.weight";
  // layers.<l>.<rest>
  auto p1 = n.find('.'), p2 = n.find('.', p1 + 1);
  if (n.rfind("layers.", 0) != 0 || p2 == std::string::npos) fail(ErrorKind::Internal, "names", "unmapped buffer " + n);
  int64_t l = std::stoll(n.substr(p1 + 1, p2 - p1 - 1));
  std::string rest = n.substr(p2 + 1);
  if (rest == "input_layernorm" || rest == "post_attention_layernorm" || rest == "pre_feedforward_layernorm" ||
      rest == "post_feedforward_layernorm")
    return "model.layers." + std::to_string(l) + "." + rest + ".weight";
  auto dot = rest.find('.');
  std::string proj = rest.substr(0, dot);
  std::string suffix = dot == std::string::npos ? "weight" : rest.substr(dot + 1);
  return hf_module(l, proj) + "." + suffix;
}

}  // namespace qlora
