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

// Every name a target may take, in layer order (the seven projections and the fused modules).
static const std::vector<std::string>& known_modules() {
  static const std::vector<std::string> v = {"q_proj",    "k_proj",  "v_proj",       "qkv_proj", "o_proj",
                                             "gate_proj", "up_proj", "gate_up_proj", "down_proj"};
  return v;
}

std::vector<std::string> LoraSpec::resolve_targets(const std::vector<std::string>& names) {
  const auto& all = all_linear_targets();
  const auto& known = known_modules();
  std::vector<std::string> out;
  for (const auto& n : names) {
    if (n == "all-linear" || n == "all_linear" || n == "all") return all;
    if (std::find(known.begin(), known.end(), n) == known.end()) {
      std::string list;
      for (const auto& a : known) list += (list.empty() ? "" : ", ") + a;
      fail(ErrorKind::Config, "target_modules", "'" + n + "' matches no module of this model",
           "valid targets: " + list + ", or all-linear");
    }
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  if (out.empty()) fail(ErrorKind::Config, "target_modules", "no LoRA target modules given", "e.g. all-linear");
  // Keep the model's projection order so parameter order is independent of how the user listed them.
  std::vector<std::string> ordered;
  for (const auto& a : known)
    if (std::find(out.begin(), out.end(), a) != out.end()) ordered.push_back(a);
  return ordered;
}

const std::vector<std::string>& expert_lora_kinds() {
  static const std::vector<std::string> k = {"gate_up_proj", "down_proj"};
  return k;
}

std::vector<std::string> LoraSpec::resolve_expert_targets(const std::vector<std::string>& names, const std::string& key) {
  std::vector<std::string> found;
  for (const auto& n : names) {
    bool ok = false;
    for (const auto& k : expert_lora_kinds()) {
      const std::string full = "mlp.experts." + k;  // PEFT: the name or a dotted suffix of the parameter's
      if (n == full || (n.size() < full.size() && full.compare(full.size() - n.size(), n.size(), n) == 0 &&
                        full[full.size() - n.size() - 1] == '.')) {
        ok = true;
        if (std::find(found.begin(), found.end(), k) == found.end()) found.push_back(k);
      }
    }
    if (!ok)
      fail(ErrorKind::Config, key, "'" + n + "' is no stacked expert weight this engine adapts",
           "target_parameters takes mlp.experts.gate_up_proj and mlp.experts.down_proj (mixture-of-experts models)");
  }
  std::vector<std::string> ordered;
  for (const auto& k : expert_lora_kinds())
    if (std::find(found.begin(), found.end(), k) != found.end()) ordered.push_back(k);
  return ordered;
}

std::pair<int64_t, int64_t> expert_lora_shape(const LlamaConfig& c, const std::string& kind) {
  if (kind == "gate_up_proj") return {2 * c.expert_intermediate_size, c.hidden_size};
  if (kind == "down_proj") return {c.hidden_size, c.expert_intermediate_size};
  fail(ErrorKind::Internal, "expert lora", "unknown expert weight '" + kind + "'");
}

void check_expert_targets(const LlamaConfig& c, const std::vector<std::string>& expert_targets, double dropout) {
  if (expert_targets.empty()) return;
  if (!c.moe())
    fail(ErrorKind::Config, "target_parameters",
         "LoRA on stacked experts (mlp.experts." + expert_targets[0] + ") needs a mixture-of-experts model; " +
             c.model_type + " has none",
         "remove target_parameters (target_modules adapts this model's projections)");
  if (dropout > 0)
    fail(ErrorKind::Unsupported, "lora_dropout " + std::to_string(dropout),
         "LoRA on the experts (target_parameters) has no dropout: PEFT's ParamWrapper refuses it, as dropout cannot "
         "be factored out of the folded expert weight",
         "set lora_dropout: 0, or leave the experts out of target_parameters");
}

std::string peft_expert_module_name(const LlamaConfig& c, int64_t layer, const std::string& kind, const LoraSpec& s) {
  const bool nested = kind == "gate_up_proj" && std::find(s.expert_targets.begin(), s.expert_targets.end(),
                                                          "down_proj") != s.expert_targets.end();
  (void)c;
  return "base_model.model.model.layers." + std::to_string(layer) + ".mlp.experts" + (nested ? ".base_layer" : "");
}

std::vector<std::string> peft_target_parameters(const LoraSpec& s) {
  std::vector<std::string> v;
  for (const auto& k : s.expert_targets) v.push_back("mlp.experts." + k);
  std::sort(v.begin(), v.end());  // PEFT stores them sorted
  return v;
}

std::vector<std::string> lora_modules(const LlamaConfig& c) {
  std::vector<std::string> m;
  if (c.fused_qkv) m.push_back("qkv_proj");
  else m.insert(m.end(), {"q_proj", "k_proj", "v_proj"});
  m.push_back("o_proj");
  if (c.moe()) return m;  // the experts and the router take no adapter (yet)
  if (c.fused_gate_up) m.push_back("gate_up_proj");
  else m.insert(m.end(), {"gate_proj", "up_proj"});
  m.push_back("down_proj");
  return m;
}

std::vector<std::string> module_projections(const LlamaConfig& c, const std::string& module) {
  if (module == "qkv_proj" && c.fused_qkv) return {"q_proj", "k_proj", "v_proj"};
  if (module == "gate_up_proj" && c.fused_gate_up) return {"gate_proj", "up_proj"};
  const auto& all = all_linear_targets();
  if (std::find(all.begin(), all.end(), module) != all.end()) return {module};
  fail(ErrorKind::Internal, "lora module", "'" + module + "' is no module of this model");
}

std::vector<std::string> lora_targets_for(const LlamaConfig& c, const std::vector<std::string>& targets) {
  auto has = [&](const std::string& t) { return std::find(targets.begin(), targets.end(), t) != targets.end(); };
  const std::vector<std::string> mods = lora_modules(c);
  std::string list;
  for (const auto& m : mods) list += (list.empty() ? "" : ", ") + m;
  std::vector<std::string> out;
  // In a mixture-of-experts model the experts are stacked parameters, which PEFT adapts through
  // target_parameters, not target_modules; all-linear there (PEFT 0.21 on transformers 5's MoE
  // blocks) also wraps the router, which the engine keeps frozen. Its modules are then the
  // attention's, which the checks below handle as any model's.
  if (c.moe() && (has("gate_proj") || has("up_proj") || has("down_proj")))
    fail(ErrorKind::Unsupported, "target_modules",
         std::string(targets.size() == all_linear_targets().size() ? "all-linear" : "a MLP projection") +
             " on a mixture-of-experts model (" + c.model_type +
             ") asks for LoRA on its experts through target_modules (PEFT's all-linear adapts the router too, "
             "which the engine keeps frozen)",
         "target the attention (" + list +
             ") in target_modules, and the experts with target_parameters: [mlp.experts.gate_up_proj, "
             "mlp.experts.down_proj]");
  for (const auto& t : targets)
    if (std::find(mods.begin(), mods.end(), t) == mods.end() && !(c.fused_qkv && (t == "q_proj" || t == "k_proj" || t == "v_proj")) &&
        !(c.fused_gate_up && (t == "gate_proj" || t == "up_proj")))
      fail(ErrorKind::Config, "target_modules", "'" + t + "' matches no module of this " + c.model_type + " model",
           "its LoRA modules: " + list + (c.moe() ? "" : ", or all-linear"));
  for (const auto& m : mods) {
    if (has(m)) {
      out.push_back(m);
      continue;
    }
    const std::vector<std::string> parts = module_projections(c, m);
    if (parts.size() == 1) continue;
    size_t n = 0;
    for (const auto& p : parts) n += has(p);
    if (n == parts.size()) out.push_back(m);  // all-linear, or every part named
    else if (n > 0)
      fail(ErrorKind::Config, "target_modules",
           "this " + c.model_type + " model fuses " + parts[0] + (parts.size() == 3 ? ", " + parts[1] + " and " : " and ") +
               parts.back() + " into " + m + ", which one adapter covers whole",
           "target " + m);
  }
  return out;
}

static std::string hf_module(int64_t layer, const std::string& proj) {
  const bool attn = proj == "q_proj" || proj == "k_proj" || proj == "v_proj" || proj == "o_proj" ||
                    proj == "qkv_proj" || proj == "q_norm" || proj == "k_norm";
  return "model.layers." + std::to_string(layer) + (attn ? ".self_attn." : ".mlp.") + proj;
}

std::string peft_module_name(const LlamaConfig& c, int64_t layer, const std::string& proj) {
  const std::string m = hf_module(layer, proj);  // "model.layers..."
  return "base_model.model." + (c.multimodal.empty() ? m : "model.language_model." + m.substr(6));
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
  // A mixture-of-experts layer's router and expert stacks (model/experts.h reads them).
  if (rest == "router") return "model.layers." + std::to_string(l) + ".mlp.router.weight";
  if (rest == "sinks") return "model.layers." + std::to_string(l) + ".self_attn.sinks";  // gpt-oss
  if (rest.rfind("experts.", 0) == 0) return "model.layers." + std::to_string(l) + ".mlp." + rest;
  auto dot = rest.find('.');
  std::string proj = rest.substr(0, dot);
  std::string suffix = dot == std::string::npos ? "weight" : rest.substr(dot + 1);
  return hf_module(l, proj) + "." + suffix;
}

}  // namespace qlora
