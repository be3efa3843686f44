// LlamaModel: the decoder with LoRA adapters, forward and hand-written backward over a Backend.
// The whole training step reads top to bottom in llama_model.cpp.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/arena.h"
#include "model/batch.h"
#include "model/llama_config.h"
#include "model/lora.h"
#include "model/model_plan.h"

namespace qlora {

// Fills dst (row-major f32, `shape`) with the Hugging Face tensor `hf_name`; errors name the tensor.
struct TensorSource {
  std::function<bool(const std::string& hf_name)> has;
  std::function<void(const std::string& hf_name, const std::vector<int64_t>& shape, float* dst)> read_f32;
  std::string description;  // "model dir /path", for messages
};

struct LoraParam {
  std::string name;   // "layers.3.q_proj.lora_A"
  std::string peft_key;  // "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"
  Tensor w, g, m, v;  // parameter, gradient, AdamW moments (F32, same shape)
};

class LlamaModel {
 public:
  LlamaModel(const LlamaConfig& cfg, Backend& be, const ModelPlanOptions& plan_opts, const LoraSpec& lora);
  ~LlamaModel();

  const LlamaConfig& config() const { return cfg_; }
  const MemoryPlan& plan() const { return plan_; }
  Arena& arena() { return *arena_; }
  Backend& backend() { return be_; }
  int64_t max_tokens() const { return opts_.micro_batch * opts_.seq_len; }

  // Frozen base weights from a tensor source (safetensors, GGUF, ...).
  void load_base(const TensorSource& src);
  // PEFT init: A Kaiming-uniform (a=sqrt(5)), B zeros.
  void init_lora(uint64_t seed);
  std::vector<LoraParam>& lora_params() { return lora_params_; }
  const LoraSpec& lora() const { return lora_; }
  void zero_grads();

  // Forward + backward of one micro-batch. LoRA grads "+=" d(loss_sum * grad_scale).
  // Returns the summed token loss of the micro-batch (not scaled). dropout_seed selects the mask.
  double forward_backward(const Batch& batch, float grad_scale, uint64_t dropout_seed);
  // Forward only (no dropout): summed token loss.
  double forward_loss(const Batch& batch);
  // Full logits (N,V) copied to host, for tests and generation on small inputs.
  std::vector<float> logits(const Batch& batch);

 private:
  struct Acts;  // views of one layer's saved activations
  Acts acts(int64_t layer, int64_t n) const;
  Tensor rows(const std::string& name, int64_t n) const;
  Tensor base_weight(int64_t layer, int proj);
  int lora_index(int64_t layer, int proj) const;
  void upload_batch(const Batch& batch);
  void layer_fwd(int64_t layer, int64_t n, bool train, uint64_t seed);
  void layer_bwd(int64_t layer, int64_t n, uint64_t seed);
  void linear_fwd(const Tensor& y, const Tensor& x, int64_t layer, int proj, const Acts& a, bool train, uint64_t seed);
  void linear_bwd(const Tensor& dx, bool accumulate, const Tensor& dy, const Tensor& x, int64_t layer, int proj,
                  const Acts& a, uint64_t seed);
  double head_and_loss(int64_t n, bool backward, float grad_scale);
  void forward(const Batch& batch, bool train, uint64_t seed);

  LlamaConfig cfg_;
  Backend& be_;
  ModelPlanOptions opts_;
  LoraSpec lora_;
  MemoryPlan plan_;
  std::unique_ptr<Arena> arena_;
  std::vector<LoraParam> lora_params_;
  std::vector<int> lora_slot_;  // (layer*7 + proj) -> index into lora_params_ of lora_A, or -1
  bool ckpt_ = false;
  const int32_t* d_tokens_ = nullptr;
  const int32_t* d_targets_ = nullptr;
  const int32_t* d_positions_ = nullptr;
  const int32_t* d_seg_ = nullptr;
  int64_t cur_b_ = 0, cur_t_ = 0;
};

}  // namespace qlora
