// Speed model: compute, memory traffic, communication and offload time of one optimizer step.
#include "plan/speed_model.h"

#include <algorithm>

#include "backend/cuda_scratch.h"

#include "model/backend_plan.h"
#include "model/experts.h"
#include "model/model_plan.h"
#include "model/quant_bytes.h"
#include "plan/attention_path.h"
#include "plan/planner.h"

namespace qlora {

namespace {

// Bytes per parameter the base GEMMs read, when the stored base must first be converted to the
// GEMM dtype (dequantize, or cast to fp8/fp4); 0 when the GEMM consumes the stored format.
double gemm_operand_bytes(BasePrecision base, GemmDtype gemm) {
  if (gemm == GemmDtype::Bf16) return base == BasePrecision::Bf16 ? 0.0 : 2.0;
  if (gemm == GemmDtype::Fp8) return base == BasePrecision::Fp8 ? 0.0 : 1.0;
  return base == BasePrecision::Nvfp4 || base == BasePrecision::Mxfp4 ? 0.0 : 0.5 + 1.0 / 16;  // e2m1 codes + e4m3 scale per 16
}

// An (out,in) weight stored in precision p (the base's, or a MoE model's experts').
double stored_bytes(const PlanRequest& r, int64_t out, int64_t in, BasePrecision p) {
  if (is_quantized(p)) return double(quantized_weight_bytes(p, out, in, r.quant_blocksize, r.double_quant.value_or(false)));
  return double(out) * double(in) * dtype_size(storage_dtype(p));
}

int64_t elements(const PlannedBuffer& b) { return b.bytes / dtype_size(b.dtype); }

}  // namespace

double collective_seconds(double bytes, double factor, const Topology& topo, const GpuSpec& gpu, double eff) {
  const double G = topo.gpus_per_node, M = topo.nodes;
  double t = 0;
  if (G > 1) t += factor * (G - 1) / G * bytes / (gpu.link_bw * eff);
  if (M > 1) t += factor * (M - 1) / M * (bytes / G) / (gpu.net_bw * eff);
  return t;
}

namespace {

// A layer's FLOPs in one pass (the LM head is not a layer's).
double layer_flops(const FlopParts& p) { return p.base + p.lora + p.attn; }

// One optimizer step's estimate: the request's derived quantities, shared by the terms, and one
// member function per term, each filling in its part of `e` from what the terms before it computed
// (run() calls them in order and sums them).
struct StepModel {
  const PlanRequest& r;
  const ModelPlanOptions& opts;
  const MemoryPlan& replica;
  const PlanAssumptions& a;
  const LlamaConfig& c;
  const bool full;
  const bool recompute;
  const int world;
  const double ga;
  const double tok_gpu;  // per GPU per step

  FlopOptions fo;
  bool dq_own = false;  // the attention backward's dq in its own pass
  AttentionPath path;
  // The base GEMMs' FLOPs and rates (their time, and the dequantization hidden under it).
  GemmDtype gemm = GemmDtype::Bf16;
  bool lowp_base_gemm = false;
  double base_flops = 0, bf16_base = 0, bf16_peak = 0, base_peak = 0, base_eff = 0;
  double t_cpu_work = 0;  // the CPU's dequantization and cross-entropy, at calibrated rates
  int64_t trainable = 0, weight_bytes = 0;  // trainable parameters; one replica's weight and LoRA bytes
  double t_compute = 0;                     // GEMMs, attention, memory traffic and exposed dequantization
  SpeedEstimate e;

  StepModel(const PlanRequest& req, const ModelPlanOptions& o, const MemoryPlan& rep, const PlanAssumptions& as)
      : r(req),
        opts(o),
        replica(rep),
        a(as),
        c(req.model),
        full(req.method == Method::Full),
        recompute(recomputes(req.checkpointing)),
        world(req.topo.world()),
        ga(double(req.grad_accum)),
        tok_gpu(tokens_per_micro_step(req) * ga) {}

  // Tokens per GPU per micro-step.
  static double tokens_per_micro_step(const PlanRequest& req) { return double(req.micro_batch) * double(req.seq_len); }

  SpeedEstimate run();
  void count_flops();
  void describe_attention();
  void count_tokens();
  void base_gemm_rates();
  void gemm_and_attention_time();
  void base_dequant_traffic();
  void elementwise_traffic();
  void activation_quant_traffic();
  void cross_entropy_traffic();
  void optimizer_traffic();
  void memory_time();
  void add_collective(const std::string& what, double bytes, double factor, double times);
  void communication_time();
  void offload_time();
};

// FLOPs per token of the passes the step runs.
void StepModel::count_flops() {
  fo.method = r.method;
  fo.lora_r = r.lora.r;
  fo.targets = r.lora.targets;
  fo.expert_targets = r.lora.expert_targets;
  fo.attn_len = r.packing && r.avg_doc_len > 0 ? r.avg_doc_len : r.seq_len;
  // Preference rows hold two documents (prompt + each completion), each attending within itself
  // (they are never packed further).
  if (is_preference(r.objective)) fo.attn_len = std::max<int64_t>(1, r.seq_len / 2);
  fo.recompute = recompute;
  fo.reference = uses_reference(r.objective) && !r.reference_precomputed;
  // Soft-capped scores (Gemma 2) and head dims over 128 take dq in its own pass on the GPU
  // whatever the mode, which prices the own kernels; gpt-oss's sinks run on them too (cuDNN's
  // graphs have no sinks).
  dq_own =
      opts.attn_dq == AttnDq::Recompute || cuda_plan::attention_dq_own_pass(c.head_dim, c.attn_logit_softcapping > 0);
  fo.dq_recompute = dq_own && !r.gpu.is_cpu;
  fo.dkv_split = cuda_plan::attention_dkv_split(c.head_dim) && !r.gpu.is_cpu;
  e.per_token = flops_per_token(c, fo);
}

// The attention implementation the engine runs, and its description for reports.
void StepModel::describe_attention() {
  path = attention_path(r.gpu, a, dq_own ? AttnDq::Recompute : opts.attn_dq, c.attention_sinks);
  e.attention_path = path.description;
  if (c.sliding_window > 0 && !r.gpu.is_cpu) {  // cuDNN's diagonal band, or the own kernel's window mask
    int64_t windowed = 0;
    for (int64_t l = 0; l < c.n_layer; l++) windowed += c.window_of(l) > 0;
    const std::string layers = std::to_string(windowed) + (windowed == 1 ? " layer" : " layers");
    e.attention_path += ", a sliding window of " + std::to_string(c.sliding_window) + " keys on " + layers +
                        (path.name == "cudnn" ? " (cuDNN's diagonal band)" : "");
  }
}

// Tokens and FLOPs of one step, all GPUs.
void StepModel::count_tokens() {
  e.tokens_per_step = tok_gpu * world;
  const double useful_frac = !r.packing && r.avg_doc_len > 0 ? double(r.avg_doc_len) / double(r.seq_len) : 1.0;
  e.useful_tokens_per_step = e.tokens_per_step * useful_frac;
  e.flops_per_step = e.per_token.total() * e.tokens_per_step;
}

// The base GEMMs' FLOPs per token and the rates they run at.
void StepModel::base_gemm_rates() {
  const FlopCounts& f = e.per_token;
  base_flops = f.fwd.base + f.bwd.base + f.recompute.base + f.reference.base;
  // The engine's FP8/FP4 base GEMMs (an fp8 base with --gemm-dtype fp8, an NVFP4/MXFP4 base with
  // fp4: the resolved gemm_dtype) cover the forward and its recompute; the
  // backward's dy W runs in bf16 on the dequantized layer.
  gemm = opts.gemm_dtype;
  lowp_base_gemm = gemm != GemmDtype::Bf16;
  bf16_base = lowp_base_gemm ? f.bwd.base : 0.0;  // base FLOPs at the bf16 rate
  bf16_peak = r.gpu.bf16_tflops * 1e12;
  base_peak = r.gpu.peak_tflops(r.gemm_dtype) * 1e12;
  base_eff = r.gemm_dtype == GemmDtype::Bf16 ? a.gemm_efficiency : a.lowp_gemm_efficiency;
}

// Compute: base GEMMs at the chosen tensor-core dtype; LoRA, LM head and attention in bf16.
void StepModel::gemm_and_attention_time() {
  const FlopCounts& f = e.per_token;
  const double bf16_flops = f.fwd.head + f.bwd.head + f.recompute.head + f.reference.head + f.fwd.lora + f.bwd.lora +
                            f.recompute.lora;
  const double attn_flops = f.fwd.attn + f.bwd.attn + f.recompute.attn + f.reference.attn;
  if (r.gpu.is_cpu) {  // calibrated rates are achieved rates: no efficiency factor
    const double lora_flops = f.fwd.lora + f.bwd.lora + f.recompute.lora;
    e.t_gemm = tok_gpu * ((base_flops + bf16_flops - lora_flops) / bf16_peak + lora_flops / (r.gpu.lora_tflops * 1e12));
    e.t_attn = tok_gpu * attn_flops / (r.gpu.attn_tflops * 1e12);
  } else {
    e.t_gemm = tok_gpu * ((base_flops - bf16_base) / (base_peak * base_eff) +
                          (bf16_flops + bf16_base) / (bf16_peak * a.gemm_efficiency));
    e.t_attn = tok_gpu * attn_flops / (bf16_peak * path.efficiency);
  }
}

// Memory-bound traffic per GPU per step. The base is converted to the GEMM dtype a layer at a
// time into two layer slots, as the engine does: dequant_layers_per_micro_step layers per
// micro-step (2L - 4: a layer once for the forward, once for its recompute and gradients, the
// two layers at each turn kept), each reading the stored bytes and writing the GEMM operand.
// With FP8 base GEMMs only the backward dequantizes (to bf16), each layer once.
// The reference forward (DPO, KTO) dequantizes every layer once more (3L - 4), where the
// forward GEMMs read a dequantized layer.
void StepModel::base_dequant_traffic() {
  const double layers = double(dequant_layers_per_micro_step(c.n_layer, gemm)) +
                        (fo.reference && gemm == GemmDtype::Bf16 ? double(c.n_layer) : 0.0);
  const double operand =
      r.gpu.is_cpu ? 0.0 : gemm_operand_bytes(r.base(), lowp_base_gemm ? GemmDtype::Bf16 : r.gemm_dtype);
  double convert = 0, dequant_elems = 0;  // one layer
  if (operand > 0 || (r.gpu.is_cpu && is_quantized(r.base())))
    for (const auto& t : dense_projections(c)) {
      auto [out, in] = projection_shape(c, t);
      convert += stored_bytes(r, out, in, r.base()) + operand * double(out) * double(in);
      dequant_elems += double(out) * double(in);
    }
  // A mixture-of-experts layer dequantizes each expert that has tokens (at these token counts:
  // every one) before its GEMMs, in the forward, in the recompute and in the backward: per
  // micro-step (2 + recompute) L times, where the attention's rule above does 2L - 4.
  // Each expert's is issued beside the previous expert's GEMMs (two slots), as the layers' are.
  double expert_convert = 0, expert_elems = 0;  // per micro-step
  const BasePrecision ep = r.expert_precision.value_or(r.base());
  const double expert_operand = r.gpu.is_cpu ? 0.0 : gemm_operand_bytes(ep, GemmDtype::Bf16);
  if (c.moe() && (expert_operand > 0 || (r.gpu.is_cpu && is_quantized(ep)))) {
    const double expert_layers = double(c.n_layer) * (2.0 + (recompute ? 1.0 : 0.0) + (fo.reference ? 1.0 : 0.0));
    for (const auto& k : expert_kinds()) {
      auto [out, in] = expert_shape(c, k);
      expert_convert += double(c.n_experts) * expert_layers *
                        (stored_bytes(r, out, in, ep) + expert_operand * double(out) * double(in));
      expert_elems += double(c.n_experts) * expert_layers * double(out) * double(in);
    }
  }
  // The CPU dequantizes with its cores (a calibrated rate), a GPU is bandwidth-bound.
  if (r.gpu.is_cpu) t_cpu_work += (dequant_elems * layers + expert_elems) * ga / r.gpu.dequant_elems_per_s;
  else e.memory_bytes.push_back({"base weight dequant/cast", (convert * layers + expert_convert) * ga});
  // On a GPU the next layer's dequantization runs on a side stream beside this layer's GEMMs.
  const double t_base_gemm =
      r.gpu.is_cpu ? 0.0
                   : tok_gpu * ((base_flops - bf16_base) / (base_peak * base_eff) +
                                bf16_base / (bf16_peak * a.gemm_efficiency));
  if (!r.gpu.is_cpu) {
    e.t_dequant = (convert * layers + expert_convert) * ga / (r.gpu.mem_bw * a.memory_bw_efficiency);
    e.t_dequant_exposed = std::max(0.0, e.t_dequant - a.dequant_overlap * t_base_gemm);
  }
}

// Norms, RoPE, SwiGLU, residual adds: read+write of (2 norms + 2 residuals: 10C, RoPE on q,k:
// 2(q+kv), Qwen3's per-head q/k norms: another 2(q+kv), SwiGLU: 3F; Gemma's two norms on the
// blocks' outputs: another 4C) per token per layer in the compute dtype, once forward, twice
// backward, once recompute.
void StepModel::elementwise_traffic() {
  const double act_bytes = r.gpu.is_cpu ? 4.0 : 2.0;
  const int64_t qk = (c.qk_norm ? 4 : 2) * (c.q_dim() + c.kv_dim());
  // A mixture-of-experts layer: SwiGLU on each chosen expert's rows, and the tokens gathered into
  // the experts' layout and summed back (4C per choice: gather read/write, expert output, combine).
  const int64_t mlp_ew = c.moe() ? c.experts_per_tok * (3 * c.expert_intermediate_size + 4 * c.hidden_size)
                                 : 3 * c.intermediate_size;
  const double ew = act_bytes * double((c.sandwich_norms ? 14 : 10) * c.hidden_size + qk + mlp_ew);
  e.memory_bytes.push_back(
      {"elementwise (norm, rope, swiglu, residual)",
       ew * double(c.n_layer) * (3.0 + (recompute ? 1.0 : 0.0) + (fo.reference ? 1.0 : 0.0)) * tok_gpu});
}

// FP8/FP4 base GEMMs quantize each projection's bf16 input per call (forward and recompute): the
// amax pass and the quantize pass each read it, and the codes (1 byte; fp4: half a byte and an
// e4m3 scale per 16) are written and read once by the GEMM. As the engine does it: q, k, v and
// gate, up each quantize their shared input again.
void StepModel::activation_quant_traffic() {
  if (lowp_base_gemm && !r.gpu.is_cpu) {
    const double code = gemm == GemmDtype::Fp8 ? 1.0 : 0.5 + 1.0 / 16.0;
    double per_token = 0;
    for (const auto& t : dense_projections(c))
      per_token += double(projection_shape(c, t).second) * (2.0 * 2.0 + 2.0 * code);
    e.memory_bytes.push_back({std::string("activation quantization (") + gemm_dtype_name(gemm) + " GEMMs)",
                              per_token * double(c.n_layer) * (1.0 + (recompute ? 1.0 : 0.0)) * tok_gpu});
  }
}

// Chunked CE: write fp32 logits, read for softmax/grad in place, read for the dX GEMM. On the
// CPU the exponentials, not the bytes, bound it: a calibrated logits-per-second rate.
// The reference forward computes the logits once more (written and read: 2 of the 3 passes).
void StepModel::cross_entropy_traffic() {
  const double ce_passes = fo.reference ? 5.0 / 3.0 : 1.0;
  if (r.gpu.is_cpu) t_cpu_work += ce_passes * double(c.vocab_size) * tok_gpu / r.gpu.ce_elems_per_s;
  else e.memory_bytes.push_back({"cross-entropy logits", ce_passes * 3.0 * 4.0 * double(c.vocab_size) * tok_gpu});
}

// The optimizer step's and the gradients' traffic over the trainable parameters.
void StepModel::optimizer_traffic() {
  for (const auto& b : replica.buffers) {
    if (b.category == MemCategory::Weights || b.category == MemCategory::Lora) weight_bytes += b.bytes;
    if (full ? (b.category == MemCategory::Weights) : (b.category == MemCategory::Lora)) trainable += elements(b);
  }
  const double os = double(dtype_size(r.optimizer_dtype));
  const double opt_share = shards_category(r.sharding, MemCategory::Optimizer) ? 1.0 / world : 1.0;
  // AdamW: read/write master (or LoRA fp32 param), read grad, read/write m and v, zero the grad;
  // full fine-tuning also writes the bf16 working copy.
  const double adam_bytes_per_param = 8 + 4 + 4 * os + 4 + (full ? 2 : 0);
  e.memory_bytes.push_back({"optimizer step", double(trainable) * opt_share * adam_bytes_per_param});
  if (full)  // weight-gradient GEMMs accumulate into fp32 gradients: read + write per micro-step
    e.memory_bytes.push_back({"gradient accumulation", 8.0 * double(trainable) * ga});
}

// The memory-bound traffic's time, and the CPU's calibrated work.
void StepModel::memory_time() {
  double mem_total = 0;  // the dequantization's bytes are timed apart (t_dequant)
  for (const auto& [k, v] : e.memory_bytes)
    if (r.gpu.is_cpu || k != "base weight dequant/cast") mem_total += v;
  e.t_memory = mem_total / (r.gpu.mem_bw * (r.gpu.is_cpu ? 1.0 : a.memory_bw_efficiency)) + t_cpu_work;
}

// A collective over `bytes`, run `times` per step.
void StepModel::add_collective(const std::string& what, double bytes, double factor, double times) {
  e.comm_bytes.push_back({what, bytes * factor * times});
  e.t_comm += times * collective_seconds(bytes, factor, r.topo, r.gpu, a.comm_efficiency);
}

// Communication per step.
void StepModel::communication_time() {
  if (world > 1) {
    const double grads = 4.0 * double(trainable);                  // fp32 gradients
    const double params = (full ? 2.0 : 4.0) * double(trainable);  // updated working copy
    switch (r.sharding) {
      case Sharding::None: add_collective("all-reduce gradients", grads, 2, 1); break;
      case Sharding::Zero1:
        add_collective("reduce-scatter gradients", grads, 1, 1);
        add_collective("all-gather updated parameters", params, 1, 1);
        break;
      case Sharding::Zero2:
        add_collective("reduce-scatter gradients (per micro-step)", grads, 1, ga);
        add_collective("all-gather updated parameters", params, 1, 1);
        break;
      case Sharding::Zero3:
        add_collective("all-gather parameters (forward + backward, per micro-step)", double(weight_bytes), 1, 2 * ga);
        add_collective("reduce-scatter gradients (per micro-step)", grads, 1, ga);
        break;
      case Sharding::Fsdp: {
        add_collective("reduce-scatter gradients", grads, 1, 1);
        add_collective("all-gather updated parameters", params, 1, 1);
        // Each layer's stored base bytes, gathered where the engine needs them (DecoderModel::
        // prepare_layer): into two slots like the dequantization's, so as often, 2L - 4 layers
        // per micro-step in steady state (the forward's last two and the backward's first two
        // are reused), whatever the GEMM dtype.
        const double blob = double(layer_base_blob(c, opts).total);
        const double gathers =
            double(dequant_layers_per_micro_step(c.n_layer)) + (fo.reference ? double(c.n_layer) : 0.0);
        add_collective("all-gather base layers (per micro-step)", blob, 1, gathers * ga);
        break;
      }
    }
  }
}

// Activation offload as the engine schedules it (DecoderModel::forward, forward_backward): each
// offloaded layer input (a host buffer) goes to the host while its own layer runs forward and
// comes back while the layer above recomputes and backpropagates, one copy in flight each way;
// a copy longer than the compute beside it stalls the next layer by the difference. A layer's
// forward and backward times are the micro-step's compute split by the layers' FLOPs.
void StepModel::offload_time() {
  const FlopCounts& f = e.per_token;
  e.t_offload = e.t_offload_exposed = 0;
  const double per_layer = t_compute / ga / std::max(1.0, double(c.n_layer)) / std::max(1e-30, f.total());
  const double t_fwd_layer = per_layer * layer_flops(f.fwd);
  const double t_bwd_layer = per_layer * (layer_flops(f.bwd) + layer_flops(f.recompute));
  for (const auto& b : replica.buffers)
    if (b.host && !is_backend_buffer(b)) {  // not the backend's upload staging
      const double copy = double(b.bytes) / (r.gpu.host_bw * a.comm_efficiency);
      e.t_offload += 2.0 * copy * ga;
      e.t_offload_exposed += ga * (std::max(0.0, copy - a.offload_overlap * t_fwd_layer) +
                                   std::max(0.0, copy - a.offload_overlap * t_bwd_layer));
    }
}

// The terms in order, then the step time: compute, and what communication and offload leave exposed.
SpeedEstimate StepModel::run() {
  count_flops();
  describe_attention();
  count_tokens();
  base_gemm_rates();
  gemm_and_attention_time();
  base_dequant_traffic();
  elementwise_traffic();
  activation_quant_traffic();
  cross_entropy_traffic();
  optimizer_traffic();
  memory_time();
  communication_time();
  t_compute = e.t_gemm + e.t_attn + e.t_memory + e.t_dequant_exposed;
  e.t_comm_exposed = std::max(0.0, e.t_comm - a.comm_overlap * t_compute);
  offload_time();

  e.step_time_s = t_compute + e.t_comm_exposed + e.t_offload_exposed;
  e.tokens_per_second = e.useful_tokens_per_step / e.step_time_s;
  e.tokens_per_second_per_gpu = e.tokens_per_second / world;
  e.mfu = e.per_token.model() * tok_gpu / (e.step_time_s * bf16_peak);
  return std::move(e);
}

}  // namespace

SpeedEstimate estimate_speed(const PlanRequest& r, const ModelPlanOptions& opts, const MemoryPlan& replica,
                             const PlanAssumptions& a) {
  return StepModel(r, opts, replica, a).run();
}

}  // namespace qlora
