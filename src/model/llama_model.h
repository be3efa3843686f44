// LlamaModel: the decoder with LoRA adapters, forward and hand-written backward over a Backend.
// The whole training step reads top to bottom in llama_model.cpp.
#pragma once
#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/comm.h"
#include "model/arena.h"
#include "model/batch.h"
#include "model/llama_config.h"
#include "model/lora.h"
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

// Wall time of forward_backward split at the forward/backward boundary (see set_step_times).
struct StepTimes {
  double forward_s = 0;   // embedding, decoder layers, final norm, LM head and loss
  double backward_s = 0;  // LM-head dgrad, final-norm and decoder-layer backward (incl. recompute)
};

struct LoraParam {
  std::string name;   // "layers.3.q_proj.lora_A"
  std::string peft_key;  // "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"
  Tensor w, g, m, v;  // parameter, gradient, AdamW moments (F32, same shape; with ZeRO-1 m and v
                      // hold only this rank's share: 1-D, ceil(numel / ranks) elements)
  // An expert stack's lora_B: the number of experts. The engine holds expert e's (out, r) rows at
  // e * out; PEFT's tensor is (out, r * experts) with expert e's column j at j * experts + e
  // (model/peft_io.h converts). 0 for every other parameter, whose layout is PEFT's.
  int64_t experts = 0;
  // gpt-oss's gate_up_proj: PEFT's output o is gate's row o/2 (even o) or up's (odd o), where the
  // engine holds each expert's gate rows, then its up rows.
  bool interleaved = false;
};

class LlamaModel {
 public:
  LlamaModel(const LlamaConfig& cfg, Backend& be, const ModelPlanOptions& plan_opts, const LoraSpec& lora);
  ~LlamaModel();

  const LlamaConfig& config() const { return cfg_; }
  const MemoryPlan& plan() const { return plan_; }
  const ModelPlanOptions& options() const { return opts_; }  // as resolved (compute dtype, GEMM dtype, MLP tile)
  Arena& arena() { return *arena_; }
  Backend& backend() { return be_; }
  int64_t max_tokens() const { return opts_.micro_batch * opts_.seq_len; }

  // Frozen base weights from a tensor source (safetensors, GGUF, ...). With a quantized base
  // precision each projection is read in f32, quantized and stored, one at a time (never the
  // whole model in f32); a checkpoint already stored in exactly that format is copied as it is.
  void load_base(const TensorSource& src);
  // Quantized base (nf4, fp4, nvfp4, mxfp4, fp8): the storage format of the 7 projections.
  bool quantized_base() const { return quantized_base_; }
  const QuantParams& base_quant() const { return base_quant_; }
  // Host copy of a quantized projection as stored in the arena (proj: "q_proj" ... "down_proj").
  // Under fsdp it gathers the layer first: a collective, every rank must call it.
  QuantizedTensor base_quantized(int64_t layer, const std::string& proj);
  // Host f32 copy of a frozen float tensor by its planned name ("embed_tokens", "norm", "lm_head",
  // "layers.3.input_layernorm", "layers.3.q_proj.bias", ...), converted from the arena's dtype.
  std::vector<float> weight_f32(const std::string& name);
  // sharding fsdp (ModelPlanOptions::base_shards > 0): this rank holds its byte share of each decoder
  // layer's frozen projections; a layer is all-gathered over `comm` into a fsdp.gather slot before
  // it is used (prepare_layer), so every rank must run the same forwards and backwards. One shard
  // needs no Comm (the gather is a copy). The Comm must outlive the model.
  void set_base_comm(Comm& comm);
  // On GPU ranks: gather through `device` (NCCL) straight into the device slot instead of through
  // host memory over the Comm; the same ranks as the Comm, and it must outlive the model.
  void set_base_device(DeviceReducer* device) { base_device_ = device; }
  bool base_sharded() const { return fsdp_; }
  // Bytes of decoder-layer base this rank stores (the sum of its layers.<l>.base.shard), and the
  // bytes of whole layers all-gathered since the model was built (the engine's side of the
  // planner's "all-gather base layers" volume).
  int64_t base_shard_bytes() const;
  int64_t base_blob_bytes() const { return blob_.total; }  // one whole layer's blob (fsdp)
  int64_t gathered_base_bytes() const { return gathered_bytes_; }
  // PEFT init: A Kaiming-uniform (a=sqrt(5)), B zeros.
  void init_lora(uint64_t seed);
  std::vector<LoraParam>& lora_params() { return lora_params_; }
  const LoraSpec& lora() const { return lora_; }
  void zero_grads();

  // Forward + backward of one micro-batch. LoRA grads "+=" d(loss_sum * grad_scale), and with the
  // router's load-balancing loss (LlamaConfig::router_aux_loss_coef) "+=" d(coef * aux_weight * aux).
  // Returns the summed token loss of the micro-batch (not scaled; aux: last_aux_loss()).
  // dropout_seed selects the mask.
  double forward_backward(const Batch& batch, float grad_scale, uint64_t dropout_seed, double aux_weight = 1.0);
  // The load-balancing loss (unweighted, without the coefficient) of the last forward_backward; 0
  // without one.
  double last_aux_loss() const { return aux_loss_; }
  // Timing for benchmarks: while set, each forward_backward adds its forward and backward wall
  // times to *t, synchronizing the backend at each boundary. Null (the default) turns it off.
  void set_step_times(StepTimes* t) { times_ = t; }
  // Forward only (no dropout): summed token loss.
  double forward_loss(const Batch& batch);

  // Objectives that are not a sum of token losses (preference training) see the token losses of
  // the labeled positions, in batch order, and answer with d(objective)/d(token loss) per position.
  using RowWeightFn = std::function<std::vector<float>(const std::vector<float>& row_losses)>;
  // Forward, then `weigh` over the labeled positions' token losses, then backward with those
  // weights: LoRA grads "+=" the gradient of sum_i weight_i * loss_i. Returns the summed token loss.
  double forward_backward_weighted(const Batch& batch, const RowWeightFn& weigh, uint64_t dropout_seed);
  // Forward only (no dropout): the token losses of the labeled positions, in batch order.
  std::vector<float> token_losses(const Batch& batch);
  // Off: every forward runs the frozen base alone, as if no adapter were attached (the reference
  // model of preference training; peft's disable_adapter). On by default.
  void set_adapters_enabled(bool on) { adapters_on_ = on; }
  bool adapters_enabled() const { return adapters_on_; }
  // Layers of the quantized base dequantized since the model was built: the engine's side of
  // dequant_layers_per_micro_step, which the planner's speed model counts.
  int64_t dequantized_layers() const { return dequantized_layers_; }
  // Mixture of experts: tokens each expert received, (n_layer x n_experts) row-major, summed over the
  // training forwards with adapters on (not recomputes, decodes or a reference model's forwards)
  // since the last reset. Empty for a dense model.
  const std::vector<int64_t>& routed_tokens() const { return routed_; }
  // The load-balancing losses of the training forwards since the last reset: their sum and count.
  std::pair<double, int64_t> aux_losses() const { return {aux_sum_, aux_count_}; }
  void reset_routed_tokens() {
    std::fill(routed_.begin(), routed_.end(), 0);
    aux_sum_ = 0, aux_count_ = 0;
  }
  // Full logits (N,V) copied to host, for tests on small inputs.
  std::vector<float> logits(const Batch& batch);

  // Generation through the training forward (the same layer_fwd, on this backend, with the base
  // as held for training and LoRA applied unmerged). Keys and values go to the planned KV cache
  // (ModelPlanOptions::kv_cache_tokens positions). decode() appends tokens at positions
  // kv_position()... (a prompt in chunks of seq_len) and returns the logits (V) after the last one.
  int64_t kv_capacity() const { return opts_.kv_cache_tokens; }
  int64_t kv_position() const { return kv_pos_; }
  void kv_reset() { kv_pos_ = 0; }
  const std::vector<float>& decode(const std::vector<int32_t>& ids);

 private:
  struct Acts;        // views of one layer's saved activations
  struct LayerViews;  // everything one layer's step touches, resolved once
  struct StepViews;   // workspaces, head and loss buffers, resolved once
  void resolve_views();
  void check_host_memory() const;
  Acts acts(int64_t layer, int64_t n) const;
  Tensor base_weight(int64_t layer, int proj);
  int lora_index(int64_t layer, int proj) const;
  // A module's adapter from the index of its lora_A in lora_params_ (lora_index, expert_lora_).
  struct LoraPair {
    const LoraParam& A;
    const LoraParam& B;
  };
  LoraPair lora_pair(int a_index) const;
  void upload_batch(const Batch& batch);
  // recompute: backward's re-run of a checkpointed layer; its output (the next layer's input, which
  // backward does not read) goes to ws.tmp, leaving the next layer's input or slot untouched.
  void layer_fwd(int64_t layer, int64_t n, bool train, uint64_t seed, bool recompute = false);
  void layer_bwd(int64_t layer, int64_t n, uint64_t seed);
  // row0: x, y, dx and dy are rows [row0, row0 + rows) of the micro-batch (an MLP tile): the
  // LoRA intermediate and the dropout mask are those rows of the whole tensor's.
  void linear_fwd(const Tensor& y, const Tensor& x, int64_t layer, int proj, const Acts& a, bool train, uint64_t seed,
                  int64_t row0 = 0);
  void linear_bwd(const Tensor& dx, bool accumulate, const Tensor& dy, const Tensor& x, int64_t layer, int proj,
                  const Acts& a, uint64_t seed, bool need_dx = true, int64_t row0 = 0);
  // Only the LoRA intermediate h = dropout(x) A^T of rows [row0, ...) (the recompute of an MLP tile
  // needs down_proj's, not its output).
  void lora_h_fwd(const Tensor& x, int64_t layer, int proj, const Acts& a, bool train, uint64_t seed, int64_t row0);
  struct MlpTile {
    Tensor ln2, gate, up, h;
  };
  MlpTile mlp_tile_fwd(const Acts& a, int64_t layer, int64_t t0, int64_t m, bool train, uint64_t seed);
  void mlp_fwd_tiled(const Acts& a, const Tensor& next, int64_t layer, int64_t n, bool train, uint64_t seed);
  void mlp_bwd_tiled(const Acts& a, int64_t layer, int64_t n, uint64_t seed);
  void mlp_out_fwd(const Acts& a, const Tensor& out, const Tensor& h, int64_t layer, int64_t row0, bool train,
                   uint64_t seed);
  // Mixture of experts: out (N,C) "=" the routed experts' weighted sum for the N rows of a.ln2
  // (moe_fwd); ws.dln "=" d(ln2) from d(out) in ws.dres, through the experts and the router
  // (moe_bwd). The experts' GEMMs run over each expert's rows of the expert-sorted layout.
  void moe_fwd(const Acts& a, const Tensor& out, int64_t layer, int64_t n, bool count);
  void moe_bwd(const Acts& a, int64_t layer, int64_t n);
  // Expert e's weight of kind k (0 gate, 1 up, 2 down); a quantized base: as prepare_expert left it
  // in ws.expert_dequant slot `slot`.
  Tensor expert_weight(int64_t layer, int kind, int64_t expert, int slot) const;
  // A quantized base: the expert's three weights dequantized into slot `slot`; ahead: beside the
  // ops issued next (DequantizeArgs::prefetch), read only after them.
  void prepare_expert(int64_t layer, int64_t expert, int slot, bool ahead);
  // Calls f(e, r0, m, slot) for each expert e with rows [r0, r0 + m) of the routing's offsets, in
  // order, its weights in expert_weight(.., slot); a quantized base dequantizes the next such
  // expert into the other slot ahead, beside f's ops.
  void for_each_routed_expert(int64_t layer, const std::vector<int32_t>& offsets,
                              const std::function<void(int64_t e, int64_t r0, int64_t m, int slot)>& f);
  void load_expert_stack(const TensorSource& src, const std::string& buffer);
  const std::vector<int32_t>& expert_offsets(const Acts& a);  // the routing's offsets (E+1), copied to host
  std::vector<int32_t> offsets_host_;
  std::vector<int64_t> routed_;  // routed_tokens()
  // The norm ops' weight offset: 1 for Gemma's (1 + w) norms, else 0.
  float norm_offset() const { return cfg_.norm_unit_offset ? 1.0f : 0.0f; }
  void softcap_logits(std::vector<float>& logits) const;
  // Gemma's embedding scale sqrt(hidden_size), rounded to the compute dtype as transformers casts it.
  float embed_scale() const;
  // weigh: backward with per-position weights (forward_backward_weighted); row_losses: the
  // labeled positions' token losses, copied out.
  double head_and_loss(int64_t n, bool backward, float grad_scale, const RowWeightFn* weigh = nullptr,
                       std::vector<float>* row_losses = nullptr);
  // forward_backward with a scalar gradient scale, or with per-position weights when weigh is set.
  double step_with(const Batch& batch, float grad_scale, const RowWeightFn* weigh, uint64_t seed, double aux_weight);
  void router_aux_loss(double aux_weight);  // after a training forward: aux_loss_, moe.aux_grad
  void forward(const Batch& batch, bool train, uint64_t seed);

  LlamaConfig cfg_;
  Backend& be_;
  ModelPlanOptions opts_;
  LoraSpec lora_;
  MemoryPlan plan_;
  std::unique_ptr<Arena> arena_;
  std::vector<LoraParam> lora_params_;
  std::vector<int> expert_lora_;  // (layer*2 + kind in expert_lora_kinds()) -> index of its lora_A in lora_params_, or -1
  std::vector<int> lora_slot_;  // (layer*7 + proj) -> index into lora_params_ of its module's lora_A, or -1
  // Per projection: its LoRA module's name, first and last projection, and this projection's first
  // row in the module's B (a fused qkv_proj / gate_up_proj spans several; otherwise itself, 0).
  std::array<std::string, 7> mod_name_;
  std::array<int, 7> mod_first_{}, mod_last_{};
  std::array<int64_t, 7> mod_row0_{};
  std::vector<LayerViews> layers_;
  std::unique_ptr<StepViews> views_;
  bool ckpt_ = false;
  int64_t mlp_rows_ = 0;  // rows of the MLP's buffers (mlp_rows); below max_tokens(): the MLP runs in tiles
  // gradient_checkpointing: offload. Layer l's input lives in device slot act.offload_slot.{l % 2};
  // the inputs of layers 0 .. n_layer-3 also go to host memory (host_x_[l]) in the forward and
  // come back a layer ahead in the backward (forward_backward); the last two never leave the slots.
  bool offload_ = false;
  std::vector<void*> host_x_;
  const int32_t* d_tokens_ = nullptr;
  const int32_t* d_targets_ = nullptr;
  const int32_t* d_label_rows_ = nullptr;     // positions with a label (null when every position has one)
  const int32_t* d_label_targets_ = nullptr;  // their targets
  int64_t n_labeled_ = 0;
  const int32_t* d_positions_ = nullptr;
  const int32_t* d_seg_ = nullptr;
  int64_t n_docs_ = 0;  // documents of the packed batch (runs of equal seg per row), for attention
  int64_t cur_b_ = 0, cur_t_ = 0;
  bool quantized_base_ = false;
  QuantParams base_quant_;          // blocksize resolved
  // Mixture of experts stored quantized (ModelPlanOptions::expert_precision, else the base's), and
  // how (blocksize resolved): gpt-oss's MXFP4 experts beside a float attention.
  bool quantized_experts_ = false;
  QuantParams expert_quant_;
  QuantizedWeightIo quant_io_;
  std::array<int64_t, 2> slot_layer_{-1, -1};  // the layer each ws.dequant slot holds (layer l: slot l % 2), -1 none
  int64_t dequantized_layers_ = 0;              // layers dequantized so far (dequantized_layers())
  void prepare_layer(int64_t layer, bool ahead);
  // fsdp: layer l's blob all-gathered into fsdp.gather slot l % 2 unless the slot holds it already.
  void gather_layer(int64_t layer);
  void load_layer_shard(const TensorSource& src, int64_t layer, bool stored_as_planned, const std::string& buffer);
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
  bool decoding_ = false;           // forward() is a decode() chunk: k/v live in the KV cache
  int64_t kv_pos_ = 0;              // positions in the KV cache
  bool rope_long_ = false;          // rope.inv_freq holds LongRoPE's long factors (else the short)
  float rope_scale_ = 1.0f;         // cos/sin factor (rope_attention_scale)
  std::vector<Tensor> kv_k_, kv_v_;  // per layer (kv_cache_tokens, kv_dim); empty without a cache
  std::vector<float> decode_logits_;  // (V) after the last decoded token
  bool adapters_on_ = true;         // set_adapters_enabled
  StepTimes* times_ = nullptr;      // set_step_times
  double head_bwd_s_ = 0;           // LM-head backward time inside head_and_loss (timing on)
  double aux_loss_ = 0;             // last_aux_loss()
  double aux_sum_ = 0;              // aux_losses()
  int64_t aux_count_ = 0;
  bool aux_on_ = false;             // this step's forward gathers router statistics (aux loss)
  double synced_now();              // seconds on a steady clock, after backend().synchronize()
};

}  // namespace qlora
