// The decoder's LoRA adapters: one {A, B} pair per adapted module (a projection, a fused qkv_proj /
// gate_up_proj, or an expert stack), each parameter with its gradient and AdamW moments, found by
// (layer, projection) or (layer, expert kind). The planned buffers are "layers.<l>.<module>.lora_A"
// and ".lora_B" (model_plan.cpp); their PEFT names come with them.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/arena.h"
#include "model/llama_config.h"
#include "model/lora.h"
#include "model/model_plan.h"

namespace qlora {

// A trained tensor: a LoRA A or B, or under full fine-tuning a weight of the model.
struct TrainParam {
  std::string name;   // "layers.3.q_proj.lora_A"; full fine-tuning: the weight's buffer, "layers.3.q_proj"
  // "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"; full fine-tuning: the Hugging
  // Face name, "model.layers.3.self_attn.q_proj.weight"
  std::string peft_key;
  Tensor w, g, m, v;  // parameter, gradient, AdamW moments (F32, same shape; with ZeRO-1 m and v
                      // hold only this rank's share: 1-D, ceil(numel / ranks) elements)
  // An expert stack's lora_B: the number of experts. The engine holds expert e's (out, r) rows at
  // e * out; PEFT's tensor is (out, r * experts) with expert e's column j at j * experts + e
  // (model/peft_io.h converts). 0 for every other parameter, whose layout is PEFT's.
  int64_t experts = 0;
  // gpt-oss's gate_up_proj: PEFT's output o is gate's row o/2 (even o) or up's (odd o), where the
  // engine holds each expert's gate rows, then its up rows.
  bool interleaved = false;
  // AdamW's weight decay applies (HF Trainer: not to biases and norm weights).
  bool decay = true;
};

// HF Trainer's rule (get_decay_parameter_names): no weight decay for a bias or a norm's weight.
bool decays(const std::string& hf_name);

class Adapters {
 public:
  // spec's targets already in the model's modules (lora_targets_for); the arena holds what
  // the plan gave the spec.
  Adapters(const LlamaConfig& cfg, const LoraSpec& spec, const ModelPlanOptions& opts, Arena& arena);

  struct Pair {
    const TrainParam& A;
    const TrainParam& B;
  };
  // The adapter on layer l's projection p (a fused module's, for each projection it spans), or -1.
  int index(int64_t l, int p) const { return slot_[size_t(l * 7 + p)]; }
  // The adapter on layer l's expert stack of kind k (expert_lora_kinds() order), or -1.
  int expert_index(int64_t l, int k) const { return expert_[size_t(l * 2 + k)]; }
  Pair pair(int i) const { return {params_[size_t(i)], params_[size_t(i) + 1]}; }
  // Projection p's module: its first and last projection, and p's first row in the module's B
  // (a fused module spans several; otherwise p itself and 0).
  int first(int p) const { return first_[size_t(p)]; }
  int last(int p) const { return last_[size_t(p)]; }
  int64_t row0(int p) const { return row0_[size_t(p)]; }
  const std::string& module(int p) const { return name_[size_t(p)]; }

  const LoraSpec& spec() const { return spec_; }
  std::vector<TrainParam>& params() { return params_; }
  // PEFT init: A Kaiming-uniform (a=sqrt(5)), B zeros; gradients and moments zeroed.
  void init(Backend& be, uint64_t seed);
  void zero_grads(Backend& be);
  // Off: every forward runs the frozen base alone (peft's disable_adapter). On by default.
  bool enabled() const { return on_; }
  void set_enabled(bool on) { on_ = on; }

 private:
  void add_pair(Arena& arena, const ModelPlanOptions& opts, const std::string& base, const std::string& peft_module,
                int64_t experts, bool interleaved);

  LoraSpec spec_;
  // The parameters, each module's lora_A followed by its lora_B (pair() reads that order).
  std::vector<TrainParam> params_;
  std::vector<int> slot_;    // (layer*7 + proj) -> index of its module's lora_A in params_, or -1
  std::vector<int> expert_;  // (layer*2 + kind) -> index of its lora_A in params_, or -1
  std::array<std::string, 7> name_;
  std::array<int, 7> first_{}, last_{};
  std::array<int64_t, 7> row0_{};
  bool on_ = true;
};

}  // namespace qlora
