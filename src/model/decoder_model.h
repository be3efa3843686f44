// DecoderModel: a decoder-only transformer (Llama, Mistral, Qwen, Gemma, Phi-3, Mixtral, Qwen3-MoE,
// gpt-oss, ...) with LoRA adapters: forward and hand-written backward over a Backend. Its parts:
// the frozen base (model/base_weights.h), the adapters (model/adapters.h), the saved activations
// and workspaces resolved from the memory plan (model/decoder_parts.h), the KV cache
// (model/kv_cache.h). The step reads top to bottom: decoder_model.cpp (batch, forward, step),
// decoder_layer.cpp (one layer forward and backward), decoder_moe.cpp (experts and router),
// decoder_head.cpp (final norm, LM head, loss, logits, decode).
#pragma once
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/comm.h"
#include "model/adapters.h"
#include "model/arena.h"
#include "model/base_weights.h"
#include "model/batch.h"
#include "model/kv_cache.h"
#include "model/llama_config.h"
#include "model/lora.h"
#include "model/model_plan.h"
#include "model/tensor_source.h"
#include "quant/quantize.h"

namespace qlora {

// Wall time of forward_backward split at the forward/backward boundary (see set_step_times).
struct StepTimes {
  double forward_s = 0;   // embedding, decoder layers, final norm, LM head and loss
  double backward_s = 0;  // LM-head dgrad, final-norm and decoder-layer backward (incl. recompute)
};

class DecoderModel {
 public:
  DecoderModel(const LlamaConfig& cfg, Backend& be, const ModelPlanOptions& plan_opts, const LoraSpec& lora);
  ~DecoderModel();

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
  bool quantized_base() const { return base_->quantized(); }
  const QuantParams& base_quant() const { return base_->quant(); }
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
  void set_base_device(DeviceReducer* device) { base_->set_device(device); }
  bool base_sharded() const { return base_->sharded(); }
  // Bytes of decoder-layer base this rank stores (the sum of its layers.<l>.base.shard), and the
  // bytes of whole layers all-gathered since the model was built (the engine's side of the
  // planner's "all-gather base layers" volume).
  int64_t base_shard_bytes() const { return base_->shard_bytes(); }
  int64_t base_blob_bytes() const { return base_->blob_bytes(); }  // one whole layer's blob (fsdp)
  int64_t gathered_base_bytes() const { return base_->gathered_bytes(); }
  // The trained tensors: the LoRA adapters, or under full fine-tuning (ModelPlanOptions::method
  // full) every weight, by its Hugging Face name. init_trainable: PEFT's init (A Kaiming-uniform
  // with a=sqrt(5), B zeros), or for full fine-tuning zeroed gradients and moments (the weights
  // are the loaded base).
  void init_trainable(uint64_t seed);
  std::vector<TrainParam>& trainable_params() { return full() ? base_->params() : adapters_->params(); }
  bool full() const { return base_->trained(); }
  const LoraSpec& lora() const { return adapters_->spec(); }
  void zero_grads();

  // Forward + backward of one micro-batch. LoRA grads "+=" d(loss_sum * grad_scale), and with the
  // router's load-balancing loss (LlamaConfig::router_aux_loss_coef) "+=" d(coef * aux_weight * aux).
  // Returns the summed token loss of the micro-batch (not scaled; aux: last_aux_loss()).
  // dropout_seed selects the mask.
  double forward_backward(const Batch& batch, float grad_scale, uint64_t dropout_seed, double aux_weight = 1.0);
  // The load-balancing loss (unweighted, without the coefficient) of the last forward_backward; 0
  // without one.
  double last_aux_loss() const { return moe_.aux_loss; }
  // Timing for benchmarks: while set, each forward_backward adds its forward and backward wall
  // times to *t, synchronizing the backend at each boundary. Null (the default) turns it off.
  void set_step_times(StepTimes* t) { timing_.times = t; }
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
  void set_adapters_enabled(bool on) { adapters_->set_enabled(on); }
  bool adapters_enabled() const { return adapters_->enabled(); }
  // Layers of the quantized base dequantized since the model was built: the engine's side of
  // dequant_layers_per_micro_step, which the planner's speed model counts.
  int64_t dequantized_layers() const { return base_->dequantized_layers(); }
  // Mixture of experts: tokens each expert received, (n_layer x n_experts) row-major, summed over the
  // training forwards with adapters on (not recomputes, decodes or a reference model's forwards)
  // since the last reset. Empty for a dense model.
  const std::vector<int64_t>& routed_tokens() const { return moe_.routed; }
  // The load-balancing losses of the training forwards since the last reset: their sum and count.
  std::pair<double, int64_t> aux_losses() const { return {moe_.aux_sum, moe_.aux_count}; }
  void reset_routed_tokens() {
    std::fill(moe_.routed.begin(), moe_.routed.end(), 0);
    moe_.aux_sum = 0, moe_.aux_count = 0;
  }
  // Full logits (N,V) copied to host, for tests on small inputs.
  std::vector<float> logits(const Batch& batch);

  // Generation through the training forward (the same layer_fwd, on this backend, with the base
  // as held for training and LoRA applied unmerged). Keys and values go to the planned KV cache
  // (ModelPlanOptions::kv_cache_tokens positions). decode() appends tokens at positions
  // kv_position()... (a prompt in chunks of seq_len) and returns the logits (V) after the last one.
  int64_t kv_capacity() const { return opts_.kv_cache_tokens; }
  int64_t kv_position() const { return kv_.pos; }
  void kv_reset() { kv_.pos = 0; }
  const std::vector<float>& decode(const std::vector<int32_t>& ids);


 private:
  struct Acts;        // views of one layer's saved activations
  struct LayerViews;  // one layer's activations, input and output, resolved once
  struct StepViews;   // workspaces, head and loss buffers, resolved once
  struct StepInputs;  // one forward's micro-batch on the device (upload_batch), passed down
  void resolve_views();
  void check_host_memory() const;
  Acts acts(int64_t layer, int64_t n) const;
  StepInputs upload_batch(const Batch& batch, bool decoding);
  // recompute: backward's re-run of a checkpointed layer; its output (the next layer's input, which
  // backward does not read) goes to ws.tmp, leaving the next layer's input or slot untouched.
  void layer_fwd(const StepInputs& in, int64_t layer, int64_t n, bool train, uint64_t seed, bool recompute = false);
  void layer_bwd(const StepInputs& in, int64_t layer, int64_t n, uint64_t seed);
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
  // Calls f(e, r0, m, slot) for each expert e with rows [r0, r0 + m) of the routing's offsets, in
  // order, its weights in base expert_weight(.., slot); quantized experts: the next such expert is
  // dequantized into the other slot ahead, beside f's ops.
  void for_each_routed_expert(int64_t layer, const std::vector<int32_t>& offsets,
                              const std::function<void(int64_t e, int64_t r0, int64_t m, int slot)>& f);
  const std::vector<int32_t>& expert_offsets(const Acts& a);  // the routing's offsets (E+1), copied to host
  // The norm ops' weight offset: 1 for Gemma's (1 + w) norms, else 0.
  float norm_offset() const { return cfg_.norm_unit_offset ? 1.0f : 0.0f; }
  void softcap_logits(std::vector<float>& logits) const;
  // Gemma's embedding scale sqrt(hidden_size), rounded to the compute dtype as transformers casts it.
  float embed_scale() const;
  // weigh: backward with per-position weights (forward_backward_weighted); row_losses: the
  // labeled positions' token losses, copied out.
  double head_and_loss(const StepInputs& in, int64_t n, bool backward, float grad_scale,
                       const RowWeightFn* weigh = nullptr, std::vector<float>* row_losses = nullptr);
  // forward_backward with a scalar gradient scale, or with per-position weights when weigh is set.
  double step_with(const Batch& batch, float grad_scale, const RowWeightFn* weigh, uint64_t seed, double aux_weight);
  void router_aux_loss(double aux_weight);  // after a training forward: moe_.aux_loss, moe.aux_grad
  StepInputs forward(const Batch& batch, bool train, uint64_t seed, bool decoding = false);
  double synced_now();  // seconds on a steady clock, after backend().synchronize()

  LlamaConfig cfg_;
  Backend& be_;
  ModelPlanOptions opts_;
  MemoryPlan plan_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<BaseWeights> base_;  // the frozen weights
  std::unique_ptr<Adapters> adapters_;  // LoRA
  std::vector<LayerViews> layers_;
  std::unique_ptr<StepViews> views_;
  bool ckpt_ = false;
  int64_t mlp_rows_ = 0;  // rows of the MLP's buffers (mlp_rows); below max_tokens(): the MLP runs in tiles
  // gradient_checkpointing: offload. Layer l's input lives in device slot act.offload_slot.{l % 2};
  // the inputs of layers 0 .. n_layer-3 also go to host memory (host_x[l]) in the forward and
  // come back a layer ahead in the backward (step_with); the last two never leave the slots.
  struct Offload {
    bool on = false;
    std::vector<void*> host_x;
  } offload_;
  struct Rope {
    bool long_factors = false;  // rope.inv_freq holds LongRoPE's long factors (else the short)
    float scale = 1.0f;         // cos/sin factor (rope_attention_scale)
  } rope_;
  KvCache kv_;
  // Mixture of experts: the routing's offsets on the host; tokens per expert (routed_tokens());
  // the load-balancing loss (last_aux_loss(), aux_losses()), gathered when aux_on.
  struct MoeStats {
    std::vector<int32_t> offsets_host;
    std::vector<int64_t> routed;
    double aux_loss = 0, aux_sum = 0;
    int64_t aux_count = 0;
    bool aux_on = false;
  } moe_;
  struct Timing {
    StepTimes* times = nullptr;  // set_step_times
    double head_bwd_s = 0;       // LM-head backward time inside head_and_loss (timing on)
  } timing_;
};

}  // namespace qlora
