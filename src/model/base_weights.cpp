// The decoder's frozen base: loading (quantizing or copying as stored), fsdp shards and their
// gathers, and the dequantization double buffer.
#include "model/base_weights.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/experts.h"
#include "model/fused_projections.h"
#include "model/gemm_dtype.h"
#include "model/mxfp4_experts.h"
#include "model/projection_index.h"
#include "model/quant_bytes.h"
#include "model/tensor_views.h"
#include "quant/fp4_gemm.h"

namespace qlora {

static bool same_quant(QuantParams a, QuantParams b) {
  return a.format == b.format && quant_blocksize(a) == quant_blocksize(b) && a.double_quant == b.double_quant &&
         a.fp8_scaling == b.fp8_scaling && a.mx_scale_rule == b.mx_scale_rule;
}

void adopt_stored_quantization(ModelPlanOptions& o, const TensorSource& src) {
  if (!o.expert_precision && src.stored_expert_quant)  // gpt-oss: its MXFP4 experts as shipped
    o.expert_precision = base_precision_of(*src.stored_expert_quant);
  if (o.base_precision || !src.stored_quant) return;
  const QuantParams& p = *src.stored_quant;
  const std::optional<BasePrecision> b = base_precision_of(p);
  if (!b)
    fail(ErrorKind::Unsupported, src.description, std::string("the base is stored as ") + quant_format_name(p.format) +
             (p.format == QuantFormat::FP8_E4M3 ? " with block scales" : "") +
             ", a format the engine does not train on",
         "set base_precision (fp8, nf4, fp4, nvfp4 or mxfp4: the weights are dequantized and re-quantized at load, "
         "or bf16/fp32), or re-quantize the model with `qlora quantize`");
  o.base_precision = *b;
  o.quant_blocksize = quant_blocksize(p);
  o.double_quant = p.double_quant;
  if (o.method == Method::Lora) o.method = Method::Qlora;
}

// "layers.3.q_proj" -> "q_proj"
static std::string projection_of(const std::string& buffer) { return buffer.substr(buffer.find('.', 7) + 1); }

BaseWeights::BaseWeights(const LlamaConfig& cfg, Backend& be, const ModelPlanOptions& opts, Arena& arena,
                         const MemoryPlan& plan)
    : cfg_(cfg), be_(be), opts_(opts), arena_(arena), quant_io_(be) {
  if (is_quantized(base_of(opts_))) {
    quantized_base_ = true;
    base_quant_ = base_quant_params(base_of(opts_), opts_.quant_blocksize, opts_.double_quant);
    base_quant_.blocksize = quant_blocksize(base_quant_);
  }
  if (const BasePrecision ep = opts_.expert_precision.value_or(base_of(opts_)); cfg_.moe() && is_quantized(ep)) {
    quantized_experts_ = true;
    expert_quant_ = base_quant_params(ep, opts_.quant_blocksize, opts_.double_quant);
    expert_quant_.blocksize = quant_blocksize(expert_quant_);
  }
  fsdp_ = opts_.base_shards > 0;
  if (fsdp_) {
    blob_ = layer_base_blob(cfg_, opts_);
    shard_ = slice_of(size_t(blob_.total), int(opts_.base_shard_rank), int(opts_.base_shards));
    if (opts_.base_shards == 1) {
      own_comm_ = make_single_comm();
      base_comm_ = own_comm_.get();
    }
  }
  resolve(plan);
}

void BaseWeights::resolve(const MemoryPlan& plan) {
  const Arena& ar = arena_;
  auto opt = [&](const std::string& name) { return ar.has(name) ? ar.get(name) : Tensor(); };
  dq_.slots = opt("ws.dequant");
  if (dq_.slots.data) dq_.slot = dq_.slots.dim(1);
  if (cfg_.moe()) dq_.expert_slots = opt("ws.expert_dequant");
  int64_t at = 0;
  for (int p = 0; p < 7; p++) {
    dq_.offset[p] = at;
    const auto [out, in] = projection_shape(cfg_, kProj[p]);
    at += out * in;
  }
  // fsdp: a layer's projections live in its fsdp.gather slot (l % 2) once gathered.
  gather_ = fsdp_ ? static_cast<uint8_t*>(ar.raw("fsdp.gather")) : nullptr;
  if (fsdp_)
    for (int64_t l = 0; l < cfg_.n_layer; l++)
      shard_ptr_.push_back(static_cast<const uint8_t*>(ar.raw("layers." + std::to_string(l) + ".base.shard")));
  const bool full = opts_.method == Method::Full;
  layers_.clear();
  grads_.assign(size_t(cfg_.n_layer), LayerWeights{});
  for (int64_t l = 0; l < cfg_.n_layer; l++) {
    layers_.push_back(resolve_layer(l, ""));
    if (full) grads_[size_t(l)] = resolve_layer(l, ".grad");
  }
  if (!full) return;
  for (const auto& b : plan.buffers) {
    if (b.category != MemCategory::Weights) continue;
    TrainParam p;
    p.name = b.name;
    p.peft_key = hf_weight_name(b.name);
    p.w = ar.get(b.name);
    p.g = ar.get(b.name + ".grad");
    p.m = ar.get(b.name + ".adam_m");
    p.v = ar.get(b.name + ".adam_v");
    p.decay = decays(p.peft_key);
    params_.push_back(p);
  }
}

LayerWeights BaseWeights::resolve_layer(int64_t l, const std::string& suffix) const {
  const Arena& ar = arena_;
  auto get = [&](const std::string& name) { return ar.get(name + suffix); };
  const bool weights = suffix.empty();
  const DType float_base = storage_dtype(base_of(opts_));
  LayerWeights L;
  const std::string lp = "layers." + std::to_string(l) + ".";
  if (cfg_.qk_norm) {
    L.q_norm_w = get(lp + "q_norm");
    L.k_norm_w = get(lp + "k_norm");
  }
  if (cfg_.moe()) {
    L.router = get(lp + "router");
    if (cfg_.moe_biases) L.router_bias = get(lp + "router.bias");
    for (int k = 0; k < 3; k++) {
      const std::string stack = lp + "experts." + expert_kinds()[size_t(k)];
      if (quantized_experts_) L.experts_packed[k] = static_cast<const uint8_t*>(ar.raw(stack));
      else L.experts[k] = get(stack);
      if (cfg_.moe_biases) L.expert_bias[k] = get(stack + ".bias");
    }
  }
  L.ln1_w = get(lp + "input_layernorm");
  // Llama's post_attention_layernorm is the MLP's input norm; Gemma's sits on o_proj's output
  // and pre_feedforward_layernorm is the MLP's.
  if (cfg_.sandwich_norms) {
    L.ln2_w = get(lp + "pre_feedforward_layernorm");
    L.post_attn_w = get(lp + "post_attention_layernorm");
    L.post_ff_w = get(lp + "post_feedforward_layernorm");
  } else {
    L.ln2_w = get(lp + "post_attention_layernorm");
  }
  for (int p = 0; p < int(dense_projections(cfg_).size()); p++) {  // a MoE layer's MLP: router and experts above
    if (fsdp_ && weights) {
      uint8_t* at = gather_ + (l % 2) * blob_.total + blob_.offset[p];
      const auto [out, in] = projection_shape(cfg_, kProj[p]);
      if (quantized_base_) L.packed[p] = at;
      else L.w[p] = Tensor(at, float_base, {out, in});
    } else if (quantized_base_ && weights) {
      L.packed[p] = ar.raw(lp + kProj[p]);
      if (opts_.gemm_dtype == GemmDtype::Fp4) L.gemm_scales[p] = ar.raw(lp + kProj[p] + ".gemm_scales");
    } else {
      L.w[p] = get(lp + kProj[p]);
    }
  }
  if (cfg_.attention_bias)
    for (int p = 0; p <= V; p++) L.bias[p] = get(lp + kProj[p] + ".bias");
  if (cfg_.o_proj_bias) L.bias[O] = get(lp + "o_proj.bias");
  if (cfg_.attention_sinks) L.sinks = get(lp + "sinks");
  return L;
}

void BaseWeights::set_comm(Comm& comm) {
  if (fsdp_ && (comm.size() != opts_.base_shards || comm.rank() != opts_.base_shard_rank))
    fail(ErrorKind::Internal, "fsdp", "the model was planned as rank " + std::to_string(opts_.base_shard_rank) + " of " +
                                          std::to_string(opts_.base_shards) + ", the Comm is rank " +
                                          std::to_string(comm.rank()) + " of " + std::to_string(comm.size()));
  base_comm_ = &comm;
}


// fsdp: layer l's seven projections stored as planned into one host blob, of which this rank keeps
// its share. Every rank reads the whole layer (the source is on every node) and keeps 1/N of it.
void BaseWeights::load_layer_shard(const TensorSource& src, int64_t l, bool stored_as_planned, const std::string& buffer) {
  std::vector<uint8_t> blob(size_t(blob_.total), 0);
  std::vector<float> host;
  for (int p = 0; p < 7; p++) {
    const std::string hf = hf_weight_name("layers." + std::to_string(l) + "." + kProj[p]);
    const auto [rows, cols] = projection_shape(cfg_, kProj[p]);
    uint8_t* dst = blob.data() + blob_.offset[p];
    if (quantized_base_) {
      QuantizedTensor q;
      if (!(stored_as_planned && src.read_quantized(hf, rows, cols, q))) {
        host.resize(size_t(rows * cols));
        src.read_f32(hf, {rows, cols}, host.data());
        q = quantize_ref(host.data(), rows, cols, base_quant_);
      } else if (!same_quant(q.params, base_quant_) || q.rows != rows || q.cols != cols) {
        fail(ErrorKind::Format, src.description + ": tensor '" + hf + "'",
             "is stored differently from the rest of the checkpoint's projections", "re-quantize the model with `qlora quantize`");
      }
      pack_quantized(q, dst);
      continue;
    }
    host.resize(size_t(rows * cols));
    src.read_f32(hf, {rows, cols}, host.data());
    const DType dt = layers_[size_t(l)].w[p].dtype;
    if (dt == DType::F32) std::memcpy(dst, host.data(), host.size() * 4);
    else convert_from_f32(dt, host.data(), dst, rows * cols);
  }
  if (shard_.count > 0) be_.copy_to_device(arena_.raw(buffer), blob.data() + shard_.begin, shard_.count);
}

void BaseWeights::gather(int64_t l) {
  if (!fsdp_ || l < 0 || l >= cfg_.n_layer || gather_layer_[size_t(l % 2)] == l) return;
  if (!base_comm_)
    fail(ErrorKind::Internal, "fsdp", "the base is sharded over " + std::to_string(opts_.base_shards) +
                                          " ranks but the model has no Comm to gather it with", "call set_base_comm");
  uint8_t* slot = gather_ + (l % 2) * blob_.total;
  const size_t n = size_t(blob_.total);
  if (be_.device() == DeviceKind::Cpu) {  // device memory is host memory: MPI reads and writes the arena
    base_comm_->allgather_shards(shard_ptr_[size_t(l)], slot, n);
  } else if (base_device_) {
    // NCCL from the shard into the slot, device to device; the slot's last reader (a dequantization,
    // maybe on a side stream) must be done first, and the gather is waited for before any reader.
    be_.synchronize();
    base_device_->allgather_shards(shard_ptr_[size_t(l)], slot, n);
  } else {
    // Through host memory: the slot's last reader (a dequantization, maybe on a side stream) must
    // be done before the slot is overwritten.
    be_.synchronize();
    shard_host_.resize(shard_.count);
    gather_host_.resize(n);
    if (shard_.count > 0) be_.copy_to_host(shard_host_.data(), shard_ptr_[size_t(l)], shard_.count);
    base_comm_->allgather_shards(shard_host_.data(), gather_host_.data(), n);
    be_.copy_to_device(slot, gather_host_.data(), n);
  }
  gather_layer_[size_t(l % 2)] = l;
  gathered_bytes_ += int64_t(n);
}

void BaseWeights::load(const TensorSource& checkpoint, const MemoryPlan& plan) {
  // Phi-3's qkv_proj / gate_up_proj by parts; a MoE layer's experts as stacks.
  const TensorSource src = experts_source(cfg_, unfused_source(cfg_, checkpoint));
  dq_.layer.fill(-1);
  gather_layer_.fill(-1);
  // A checkpoint stored in exactly the planned format is copied; any other source is quantized here.
  const bool stored_as_planned = quantized_base_ && src.stored_quant && src.read_quantized &&
                                 same_quant(*src.stored_quant, base_quant_);
  std::vector<float> host;  // one tensor in f32 at a time
  for (const auto& b : plan.buffers) {
    if (b.category != MemCategory::Weights) continue;
    if (b.name.size() > 12 && b.name.compare(b.name.size() - 12, 12, ".gemm_scales") == 0) continue;  // with its projection
    if (fsdp_ && b.name.size() > 11 && b.name.compare(b.name.size() - 11, 11, ".base.shard") == 0) {
      load_layer_shard(src, std::stoll(b.name.substr(7)), stored_as_planned, b.name);
      continue;
    }
    if (b.dtype == DType::U8 && b.name.find(".experts.") != std::string::npos) {  // a stack of quantized experts
      load_expert_stack(src, b.name);
      continue;
    }
    const std::string hf = hf_weight_name(b.name);
    if (b.dtype == DType::U8) {  // a quantized projection (planned with add_bytes)
      QLORA_ASSERT(quantized_base_);
      const auto [rows, cols] = projection_shape(cfg_, projection_of(b.name));
      QuantizedTensor q;
      if (stored_as_planned && src.read_quantized(hf, rows, cols, q)) {
        if (!same_quant(q.params, base_quant_) || q.rows != rows || q.cols != cols)
          fail(ErrorKind::Format, src.description + ": tensor '" + hf + "'",
               "is stored differently from the rest of the checkpoint's projections",
               "re-quantize the model with `qlora quantize`");
      } else {
        host.resize(size_t(rows * cols));
        src.read_f32(hf, {rows, cols}, host.data());
        q = quantize_ref(host.data(), rows, cols, base_quant_);
      }
      quant_io_.store(q, arena_.raw(b.name));
      if (opts_.gemm_dtype == GemmDtype::Fp4) {  // repacked once: the FP4 GEMM's scales beside the stored codes
        const std::vector<uint8_t> sf = fp4_gemm_scales(q);
        be_.copy_to_device(arena_.raw(b.name + ".gemm_scales"), sf.data(), sf.size());
      }
      continue;
    }
    int64_t n = 1;
    for (int64_t s : b.shape) n *= s;
    Tensor t = arena_.get(b.name);
    if (t.dtype == DType::F32 && be_.device() == DeviceKind::Cpu) {  // host memory: no staging copy
      src.read_f32(hf, b.shape, static_cast<float*>(t.data));
      continue;
    }
    host.resize(size_t(n));
    src.read_f32(hf, b.shape, host.data());
    if (t.dtype == DType::F32) {
      be_.copy_to_device(t.data, host.data(), size_t(n) * 4);
    } else {
      std::vector<uint8_t> conv(size_t(n * dtype_size(t.dtype)));
      convert_from_f32(t.dtype, host.data(), conv.data(), n);
      be_.copy_to_device(t.data, conv.data(), conv.size());
    }
  }
}

// "layers.<l>.experts.<kind>" stored quantized: a checkpoint that ships the stack in exactly that
// format (gpt-oss's MXFP4) is copied expert by expert; else each expert is read in f32 (a
// checkpoint stored quantized is dequantized by its source), quantized and stored at its stride,
// one at a time (gpt-oss's fused stack: read once, whole).
void BaseWeights::load_expert_stack(const TensorSource& src, const std::string& buffer) {
  const int64_t l = std::stoll(buffer.substr(7)), E = cfg_.n_experts;
  const std::string kind = buffer.substr(buffer.rfind('.') + 1), stack = hf_weight_name(buffer);
  const auto [rows, cols] = expert_shape(cfg_, kind);
  const int64_t stride = expert_stride_bytes(cfg_, kind, expert_quant_);
  auto* dst = static_cast<uint8_t*>(arena_.raw(buffer));
  QuantizedTensor all;
  if (src.stored_expert_quant && same_quant(*src.stored_expert_quant, expert_quant_) && src.read_quantized &&
      src.read_quantized(stack, E * rows, cols, all)) {
    for (int64_t e = 0; e < E; e++) quant_io_.store(mxfp4_rows(all, e * rows, rows), dst + e * stride);
    return;
  }
  const bool per_expert = src.has(hf_expert_name(cfg_, l, 0, kind));
  std::vector<float> host(size_t((per_expert ? 1 : E) * rows * cols));
  if (!per_expert) src.read_f32(stack, {E, rows, cols}, host.data());
  for (int64_t e = 0; e < E; e++) {
    const float* w = host.data() + (per_expert ? 0 : e * rows * cols);
    if (per_expert) src.read_f32(hf_expert_name(cfg_, l, e, kind), {rows, cols}, host.data());
    quant_io_.store(quantize_ref(w, rows, cols, expert_quant_), dst + e * stride);
  }
}

QuantizedTensor BaseWeights::quantized_projection(int64_t l, const std::string& proj) {
  if (!quantized_base_) fail(ErrorKind::Internal, "base_quantized", "the base is not quantized");
  const auto [rows, cols] = projection_shape(cfg_, proj);
  QuantizedTensor q;
  if (fsdp_) {
    gather(l);
    const auto& t = all_linear_targets();
    const size_t p = size_t(std::find(t.begin(), t.end(), proj) - t.begin());
    QLORA_ASSERT(p < 7);
    quant_io_.load(layers_[size_t(l)].packed[p], base_quant_, rows, cols, q);
    return q;
  }
  quant_io_.load(arena_.raw("layers." + std::to_string(l) + "." + proj), base_quant_, rows, cols, q);
  return q;
}

std::vector<float> BaseWeights::float_tensor(const std::string& name) const {
  const Tensor t = arena_.get(name);
  if (t.dtype == DType::U8) fail(ErrorKind::Internal, "weight_f32", "'" + name + "' is stored quantized");
  std::vector<float> out(size_t(t.numel()));
  if (t.dtype == DType::F32) {
    be_.copy_to_host(out.data(), t.data, out.size() * 4);
  } else {
    std::vector<uint8_t> raw(size_t(t.nbytes()));
    be_.copy_to_host(raw.data(), t.data, raw.size());
    convert_to_f32(t.dtype, raw.data(), out.data(), t.numel());
  }
  return out;
}

// Dequantizes layer l's seven projections into its ws.dequant slot (l % 2) unless the slot holds
// them already. ahead: the layer is needed only after the ops issued next, so the backend may run
// the dequantization beside them (on a GPU, a side stream); the first op that reads it waits for it.
// fsdp: the layer's blob is gathered first (a float base is used as gathered).
void BaseWeights::prepare(int64_t l, bool ahead) {
  if (!quantized_base_) return gather(l);
  if (l < 0 || l >= cfg_.n_layer || dq_.layer[size_t(l % 2)] == l) return;
  gather(l);
  const LayerWeights& L = layers_[size_t(l)];
  const int64_t es = dtype_size(dq_.slots.dtype);
  char* slot = static_cast<char*>(dq_.slots.data) + (l % 2) * dq_.slot * es;
  for (int p = 0; p < int(dense_projections(cfg_).size()); p++) {  // a MoE layer's experts: prepare_expert
    const auto [out, in] = projection_shape(cfg_, kProj[p]);
    be_.dequantize({.out = Tensor(slot + dq_.offset[p] * es, dq_.slots.dtype, {out, in}), .src = L.packed[p],
                    .params = base_quant_, .rows = out, .cols = in, .prefetch = ahead});
  }
  dq_.layer[size_t(l % 2)] = l;
  dq_.count++;
}

// The (out,in) weight of a projection in the compute dtype: a quantized projection from its layer's
// ws.dequant slot (prepare).
Tensor BaseWeights::weight(int64_t l, int p) {
  const LayerWeights& L = layers_[size_t(l)];
  prepare(l, false);  // a no-op when the forward or backward loop has prepared it
  if (!quantized_base_) return L.w[p];
  const auto [out, in] = projection_shape(cfg_, kProj[p]);
  Tensor w = dq_.slots;
  w.data = static_cast<char*>(w.data) + ((l % 2) * dq_.slot + dq_.offset[p]) * dtype_size(w.dtype);
  return as_matrix(w, out, in);
}

Tensor BaseWeights::expert_weight(int64_t l, int k, int64_t e, int slot) const {
  const auto [out, in] = expert_shape(cfg_, expert_kinds()[size_t(k)]);
  if (quantized_experts_) {  // slot: gate, up, down, each F x C
    Tensor w = dq_.expert_slots;
    w.data = static_cast<char*>(w.data) + (slot * dq_.expert_slots.dim(1) + k * out * in) * dtype_size(w.dtype);
    return as_matrix(w, out, in);
  }
  Tensor w = layers_[size_t(l)].experts[k];
  w.data = static_cast<char*>(w.data) + e * out * in * dtype_size(w.dtype);
  return as_matrix(w, out, in);
}

void BaseWeights::prepare_expert(int64_t l, int64_t e, int slot, bool ahead) {
  if (!quantized_experts_) return;
  for (int k = 0; k < 3; k++) {
    const std::string& kind = expert_kinds()[size_t(k)];
    const auto [out, in] = expert_shape(cfg_, kind);
    const uint8_t* src = layers_[size_t(l)].experts_packed[k] + e * expert_stride_bytes(cfg_, kind, expert_quant_);
    be_.dequantize({.out = expert_weight(l, k, e, slot), .src = src, .params = expert_quant_, .rows = out, .cols = in,
                    .prefetch = ahead});
  }
}


}  // namespace qlora
