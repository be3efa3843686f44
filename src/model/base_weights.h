// The decoder's frozen base weights: what each layer reads (norms, projections, biases, router,
// experts), stored as planned (f32/bf16, or quantized: nf4, fp4, nvfp4, mxfp4, fp8), and the
// machinery that makes a stored projection usable by a GEMM: dequantization into a two-layer
// double buffer (ws.dequant), and under sharding fsdp the all-gather of a layer's shards into
// a two-layer gather slot (fsdp.gather). The step asks for layer(l) and weight(l, proj).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/adapters.h"
#include "core/comm.h"
#include "model/arena.h"
#include "model/llama_config.h"
#include "model/model_plan.h"
#include "model/quantized_weights.h"
#include "model/tensor_source.h"
#include "quant/quantize.h"

namespace qlora {

// Makes the plan store the base as the checkpoint does when the options leave base_precision unset,
// so a pre-quantized checkpoint is trained as QLoRA on its own bytes instead of being dequantized;
// likewise the experts' precision (expert_precision unset) of a checkpoint that ships its experts
// quantized (gpt-oss's MXFP4), which keep their bytes beside the float attention.
void adopt_stored_quantization(ModelPlanOptions& o, const TensorSource& src);

// One decoder layer's frozen tensors, resolved from the plan once (projection index p: q, k, v, o,
// gate, up, down).
struct LayerWeights {
  Tensor ln1_w, ln2_w;           // (C) the attention's and the MLP's input norms
  Tensor post_attn_w, post_ff_w; // (C) sandwich_norms: the norms on o_proj's and down_proj's outputs
  Tensor q_norm_w, k_norm_w;     // (head_dim), qk_norm models
  Tensor w[7];                   // float base weights (out,in); empty when quantized
  const void* packed[7] = {};    // quantized base: the packed projection
  const void* gemm_scales[7] = {};  // gemm_dtype fp4: the projection's GEMM scales (quant/fp4_gemm.h)
  Tensor bias[4];                // q/k/v biases (attention_bias models), o's (o_proj_bias); empty: none
  Tensor sinks;                  // (Hq) F32 attention sinks (gpt-oss)
  Tensor router, router_bias;    // mixture of experts: (E,C) and, moe_biases, (E)
  Tensor experts[3];             // gate_proj, up_proj, down_proj stacked over the experts: (E,out,in)
  Tensor expert_bias[3];         // moe_biases: their output biases, (E,out)
  const uint8_t* experts_packed[3] = {};  // quantized experts: the stacks of packed experts
};

class BaseWeights {
 public:
  // opts as resolved by the model (gemm_dtype); the arena holds the plan's buffers.
  BaseWeights(const LlamaConfig& cfg, Backend& be, const ModelPlanOptions& opts, Arena& arena, const MemoryPlan& plan);

  // From a tensor source (safetensors, GGUF, ...). With a quantized base precision each projection
  // is read in f32, quantized and stored, one at a time (never the whole model in f32); a
  // checkpoint already stored in exactly that format is copied as it is.
  void load(const TensorSource& src, const MemoryPlan& plan);

  const LayerWeights& layer(int64_t l) const { return layers_[size_t(l)]; }
  // Full fine-tuning (ModelPlanOptions::method full): the gradients of layer l's weights, in the
  // same fields ("+=" by the backward); every field empty when the weights are frozen.
  const LayerWeights& grad(int64_t l) const { return grads_[size_t(l)]; }
  // Full fine-tuning: every weight with its gradient and AdamW moments, in plan order, named by
  // its Hugging Face name (TrainParam::peft_key); empty when the weights are frozen.
  std::vector<TrainParam>& params() { return params_; }
  bool trained() const { return !params_.empty(); }
  // The (out,in) weight of projection p in the compute dtype: a quantized projection from its
  // layer's ws.dequant slot (prepare), a float one as stored (under fsdp: as gathered).
  Tensor weight(int64_t l, int p);
  // Dequantizes layer l's projections into its ws.dequant slot (l % 2) unless the slot holds them
  // already. ahead: the layer is needed only after the ops issued next, so the backend may run the
  // dequantization beside them; the first op that reads it waits for it. fsdp: gathered first.
  void prepare(int64_t l, bool ahead);
  // fsdp: layer l's blob all-gathered into fsdp.gather slot l % 2 unless the slot holds it already.
  void gather(int64_t l);
  // Expert e's weight of kind k (0 gate, 1 up, 2 down); quantized experts: as prepare_expert left
  // them in ws.expert_dequant slot `slot`.
  Tensor expert_weight(int64_t l, int k, int64_t e, int slot) const;
  // Quantized experts: expert e's three weights dequantized into slot `slot`; ahead as in prepare.
  void prepare_expert(int64_t l, int64_t e, int slot, bool ahead);

  bool quantized() const { return quantized_base_; }
  const QuantParams& quant() const { return base_quant_; }
  QuantizedTensor quantized_projection(int64_t l, const std::string& proj);
  std::vector<float> float_tensor(const std::string& name) const;

  void set_comm(Comm& comm);
  void set_device(DeviceReducer* device) { base_device_ = device; }
  bool sharded() const { return fsdp_; }
  int64_t shard_bytes() const { return fsdp_ ? int64_t(shard_.count) * cfg_.n_layer : 0; }
  int64_t blob_bytes() const { return blob_.total; }
  int64_t gathered_bytes() const { return gathered_bytes_; }
  int64_t dequantized_layers() const { return dq_.count; }

 private:
  void resolve(const MemoryPlan& plan);
  // Layer l's tensors: the weights (suffix "") or, full fine-tuning, their gradients (".grad").
  LayerWeights resolve_layer(int64_t l, const std::string& suffix) const;
  void load_layer_shard(const TensorSource& src, int64_t layer, bool stored_as_planned, const std::string& buffer);
  void load_expert_stack(const TensorSource& src, const std::string& buffer);

  const LlamaConfig& cfg_;
  Backend& be_;
  const ModelPlanOptions& opts_;
  Arena& arena_;
  std::vector<LayerWeights> layers_, grads_;
  std::vector<TrainParam> params_;
  bool quantized_base_ = false;
  QuantParams base_quant_;  // blocksize resolved
  // Mixture of experts stored quantized (ModelPlanOptions::expert_precision, else the base's), and
  // how (blocksize resolved): gpt-oss's MXFP4 experts beside a float attention.
  bool quantized_experts_ = false;
  QuantParams expert_quant_;
  mutable QuantizedWeightIo quant_io_;
  // The dequantization double buffer: ws.dequant (2 slots of one layer's projections, each at its
  // offset) and ws.expert_dequant (2 slots of one expert's gate, up, down).
  struct Dequant {
    Tensor slots, expert_slots;
    int64_t offset[7] = {};  // element offset of each projection inside a slot
    int64_t slot = 0;        // elements per slot
    std::array<int64_t, 2> layer{-1, -1};  // the layer each slot holds (layer l: slot l % 2), -1 none
    int64_t count = 0;                      // layers dequantized so far
  } dq_;
  // sharding fsdp: this rank's share of each layer's blob, gathered into fsdp.gather before use.
  bool fsdp_ = false;
  LayerBaseBlob blob_;                            // one layer's projections as stored, back to back
  Slice shard_;                                   // this rank's share of a layer's blob
  Comm* base_comm_ = nullptr;
  DeviceReducer* base_device_ = nullptr;          // GPU ranks with NCCL: gathers in device memory
  std::unique_ptr<Comm> own_comm_;                // one shard: the single-process Comm
  std::array<int64_t, 2> gather_layer_{-1, -1};   // the layer each fsdp.gather slot holds, -1 none
  int64_t gathered_bytes_ = 0;
  std::vector<const uint8_t*> shard_ptr_;         // per layer: this rank's share in the arena
  uint8_t* gather_ = nullptr;                     // fsdp.gather (2, blob_.total)
  std::vector<uint8_t> gather_host_, shard_host_;  // off the CPU: host staging of one gather
};

}  // namespace qlora
