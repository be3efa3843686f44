// The LoRA registry: which module each projection's adapter is, and the planned A/B buffers.
#include "model/adapters.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "model/projection_index.h"

namespace qlora {

Adapters::Adapters(const LlamaConfig& cfg, const LoraSpec& spec, const ModelPlanOptions& opts, Arena& arena)
    : spec_(spec) {
  // Each projection's LoRA module: the projections it spans and this one's rows of its B (itself
  // alone unless a module spans it; a MoE layer's MLP projections are in none and take no adapter).
  for (int p = 0; p < 7; p++) name_[size_t(p)] = kProj[p], first_[size_t(p)] = last_[size_t(p)] = p;
  auto index_of = [](const std::string& proj) {
    return int(std::find(std::begin(kProj), std::end(kProj), proj) - std::begin(kProj));
  };
  for (const auto& m : lora_modules(cfg)) {
    const std::vector<std::string> parts = module_projections(cfg, m);
    int64_t row0 = 0;
    for (const auto& part : parts) {
      const int p = index_of(part);
      name_[size_t(p)] = m;
      first_[size_t(p)] = index_of(parts.front());
      last_[size_t(p)] = index_of(parts.back());
      row0_[size_t(p)] = row0;
      row0 += projection_shape(cfg, part).first;
    }
  }
  slot_.assign(size_t(cfg.n_layer * 7), -1);
  for (int64_t l = 0; l < cfg.n_layer; l++)
    for (int p = 0; p < 7; p++) {
      if (first_[size_t(p)] != p) {  // a later projection of a fused module: the module's adapter
        slot_[size_t(l * 7 + p)] = slot_[size_t(l * 7 + first_[size_t(p)])];
        continue;
      }
      const std::string base = "layers." + std::to_string(l) + "." + name_[size_t(p)] + ".";
      if (!arena.has(base + "lora_A")) continue;
      slot_[size_t(l * 7 + p)] = int(params_.size());
      add_pair(arena, opts, base, peft_module_name(cfg, l, name_[size_t(p)]), 0, false);
    }
  // LoRA on the stacked experts: one A (E*r, in) and B (E*out, r) per layer and kind, after the
  // layer order of the projections' adapters (model_plan.cpp plans them so).
  expert_.assign(size_t(cfg.n_layer * 2), -1);
  for (int64_t l = 0; l < cfg.n_layer; l++)
    for (int k = 0; k < 2; k++) {
      const std::string& kind = expert_lora_kinds()[size_t(k)];
      const std::string base = "layers." + std::to_string(l) + ".experts." + kind + ".";
      if (!arena.has(base + "lora_A")) continue;
      expert_[size_t(l * 2 + k)] = int(params_.size());
      // gpt-oss's gate_up_proj interleaves gate's and up's outputs (PEFT's B rows follow it).
      add_pair(arena, opts, base, peft_expert_module_name(cfg, l, kind, spec_), cfg.n_experts,
               cfg.model_type == "gpt_oss" && kind == "gate_up_proj");
    }
}

bool decays(const std::string& n) {
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("bias") || has("layernorm") || has("rmsnorm")) return false;
  // "(^|.)norm(.|$)" and "_norm(.|$)": model.norm.weight, q_norm, k_norm
  for (size_t at = n.find("norm"); at != std::string::npos; at = n.find("norm", at + 1)) {
    const bool after = at + 4 == n.size() || n[at + 4] == '.';
    const bool before = at == 0 || n[at - 1] == '.' || n[at - 1] == '_';
    if (after && before) return false;
  }
  return true;
}

// A module's lora_A and lora_B (planned under `base`), with their gradients and AdamW moments.
void Adapters::add_pair(Arena& arena, const ModelPlanOptions& opts, const std::string& base,
                        const std::string& peft_module, int64_t experts, bool interleaved) {
  for (const char* ab : {"lora_A", "lora_B"}) {
    TrainParam lp;
    lp.name = base + ab;
    lp.peft_key = peft_module + "." + ab + ".weight";
    lp.w = arena.get(lp.name);
    lp.g = arena.get(lp.name + ".grad");
    const std::string shard = opts.optimizer_shards > 1 ? ".shard" : "";  // ZeRO-1: this rank's share
    lp.m = arena.get(lp.name + ".adam_m" + shard);
    lp.v = arena.get(lp.name + ".adam_v" + shard);
    if (std::string(ab) == "lora_B") lp.experts = experts, lp.interleaved = interleaved;
    params_.push_back(lp);
  }
}

void Adapters::init(Backend& be, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> host;
  for (auto& p : params_) {
    host.assign(size_t(p.w.numel()), 0.0f);
    if (p.name.size() >= 6 && p.name.compare(p.name.size() - 6, 6, "lora_A") == 0) {
      // kaiming_uniform_(a=sqrt(5)) on (r, in): bound = 1/sqrt(in)
      const float bound = 1.0f / std::sqrt(float(p.w.dim(1)));
      for (auto& v : host) v = rng.uniform(-bound, bound);
    }
    be.copy_to_device(p.w.data, host.data(), host.size() * 4);
    be.memset0(p.m.data, size_t(p.m.nbytes()));
    be.memset0(p.v.data, size_t(p.v.nbytes()));
  }
  zero_grads(be);
}

void Adapters::zero_grads(Backend& be) {
  for (auto& p : params_) be.memset0(p.g.data, size_t(p.g.nbytes()));
}

}  // namespace qlora
