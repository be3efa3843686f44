// The Llama decoder with LoRA: forward, hand-written backward, chunked cross-entropy.
// Backward comments mark each output as "=" (overwritten) or "+=" (accumulated).
#include "model/llama_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/rng.h"
#include "model/backend_plan.h"
#include "model/engine_limits.h"
#include "model/experts.h"
#include "model/fused_projections.h"
#include "model/gemm_dtype.h"
#include "model/mxfp4_experts.h"
#include "model/quant_bytes.h"
#include "quant/fp4_gemm.h"

namespace qlora {

enum Proj { Q = 0, K, V, O, G, U, D };
static const char* kProj[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

struct LlamaModel::Acts {
  Tensor x, ln1, rstd1, q, k, v, att, lse, xmid, ln2, rstd2, gate, up, h;
  Tensor q_raw, k_raw, rstd_q, rstd_k;  // qk_norm: q, k before the per-head norm; its 1/rms per head
  // sandwich_norms: o_proj's output before its norm (xmid = x + norm(attn_out)) and down_proj's
  // (one MLP tile's rows), with each norm's 1/rms (N)
  Tensor attn_out, rstd_pa, mlp_out, rstd_pf;
  Tensor lora_h[7];
  Tensor moe_lora_h[2];  // the experts' LoRA intermediates x A_e^T per routed row (gate_up_proj, down_proj)
  // Mixture of experts: router logits (N,E); the routing (MoeRouteArgs: expert, weight, row, token,
  // row_weight, offsets); the experts' inputs and outputs in the expert-sorted layout (N*K, C). gate,
  // up and h above then hold N*K rows of expert_intermediate_size.
  Tensor moe_logits, moe_expert, moe_weight, moe_row, moe_token, moe_row_weight, moe_offsets, moe_x, moe_y;
};

// Every buffer one layer's step touches, resolved from the plan once when the model is built
// (full row count; each step narrows the views to its N rows), so the step does no lookups.
struct LlamaModel::LayerViews {
  Acts a;                        // saved activations (checkpointing: the shared act.cur.* set)
  Tensor next;                   // the next layer's input, or act.final_x
  Tensor ln1_w, ln2_w;           // (C) the attention's and the MLP's input norms
  Tensor post_attn_w, post_ff_w; // (C) sandwich_norms: the norms on o_proj's and down_proj's outputs
  Tensor inv_freq;               // this layer's RoPE frequencies (rope.inv_freq or, local layers, rope.inv_freq_local)
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
struct LlamaModel::StepViews {
  Tensor dres, dln, tmp, dgate, dup, datt, dq, dk, dv, lora_dh, lora_xd, dequant, inv_freq;
  Tensor moe_dy, moe_dlogits, moe_dw;  // mixture of experts
  Tensor moe_lora_dh;                  // s dy B_e per routed row (LoRA on the experts)
  Tensor expert_dequant;               // quantized base: one expert's gate, up and down
  Tensor embed, final_x, final_ln, final_rstd, norm, head, chunk, losses;
  // The micro-batch's int32 inputs on the device, and the mixture of experts' load-balancing
  // statistics (moe.router_stats (2,E), moe.aux_grad (E), batch.mask (N); with its loss only).
  Tensor batch_tokens, batch_targets, batch_positions, batch_seg, batch_label_rows, batch_label_targets;
  Tensor router_stats, aux_grad, batch_mask;
  int64_t dequant_offset[7] = {};  // element offset of each projection inside a ws.dequant slot
  int64_t dequant_slot = 0;        // elements per slot (one layer)
};

static Tensor with_rows(Tensor t, int64_t n) {
  t.shape[0] = n;
  return t;
}
// Rows [r0, r0 + n) of a row-major (rows, cols) tensor.
static Tensor row_slice(Tensor t, int64_t r0, int64_t n) {
  const int64_t cols = t.ndim > 1 ? t.numel() / t.shape[0] : 1;
  t.data = static_cast<char*>(t.data) + r0 * cols * int64_t(dtype_size(t.dtype));
  t.shape[0] = n;
  return t;
}
// Columns [0, cols) of a (rows, wide) workspace viewed as a dense (rows, cols) matrix.
static Tensor as_matrix(Tensor t, int64_t rows, int64_t cols) {
  t.ndim = 2;
  t.shape = {rows, cols, 0, 0};
  return t;
}

LlamaModel::LlamaModel(const LlamaConfig& cfg, Backend& be, const ModelPlanOptions& o, const LoraSpec& lora)
    : cfg_(cfg), be_(be), opts_(o), lora_(lora), quant_io_(be) {
  cfg_.validate(cfg_.name);
  lora_.targets = lora_targets_for(cfg_, lora_.targets);  // in the model's modules (fused qkv_proj ...)
  // Each projection's LoRA module: the projections it spans and this one's rows of its B (itself
  // alone unless a module spans it; a MoE layer's MLP projections are in none and take no adapter).
  for (int p = 0; p < 7; p++) mod_name_[size_t(p)] = kProj[p], mod_first_[size_t(p)] = mod_last_[size_t(p)] = p;
  for (const auto& m : lora_modules(cfg_)) {
    const std::vector<std::string> parts = module_projections(cfg_, m);
    int64_t row0 = 0;
    auto index = [](const std::string& proj) {
      return int(std::find(std::begin(kProj), std::end(kProj), proj) - std::begin(kProj));
    };
    for (const auto& part : parts) {
      const int p = index(part);
      mod_name_[size_t(p)] = m;
      mod_first_[size_t(p)] = index(parts.front());
      mod_last_[size_t(p)] = index(parts.back());
      mod_row0_[size_t(p)] = row0;
      row0 += projection_shape(cfg_, part).first;
    }
  }
  if (opts_.method == Method::Full)
    fail(ErrorKind::Unsupported, "method", "full fine-tuning is planned but not implemented by the engine",
         "use method lora or qlora");
  opts_.compute_dtype = be_.compute_dtype();
  opts_.lora = lora_;
  ckpt_ = recomputes(opts_.checkpointing);
  mlp_rows_ = mlp_rows(opts_, cfg_);
  {
    GemmCaps caps{be_.has_fp8_gemm(), be_.has_fp4_gemm(), "the " + be_.name() + " backend's device"};
    opts_.gemm_dtype = resolve_gemm_dtype(opts_, cfg_, caps);  // an Error(Config) before anything is allocated
  }
  // What the engine does not implement here, before anything is allocated or any step runs.
  if (const auto limits = engine_limits(cfg_, opts_, be_.device()); !limits.empty())
    fail(ErrorKind::Unsupported, limits[0].where, limits[0].what, limits[0].hint);
  routed_.assign(size_t(cfg_.moe() ? cfg_.n_layer * cfg_.n_experts : 0), 0);
  offload_ = opts_.checkpointing == Checkpointing::Offload;
  // On the CUDA backend the plan also holds the backend's own memory (workspace, op scratch).
  plan_engine_buffers(plan_, cfg_, opts_, be_.plans_own_memory() ? DeviceKind::Cuda : DeviceKind::Cpu);
  check_host_memory();
  arena_ = std::make_unique<Arena>(be_, plan_);
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

  // A module's lora_A and lora_B (planned under `base`), with their gradients and AdamW moments.
  auto add_lora_pair = [&](const std::string& base, const std::string& peft_module, int64_t experts,
                           bool interleaved = false) {
    for (const char* ab : {"lora_A", "lora_B"}) {
      LoraParam lp;
      lp.name = base + ab;
      lp.peft_key = peft_module + "." + ab + ".weight";
      lp.w = arena_->get(lp.name);
      lp.g = arena_->get(lp.name + ".grad");
      const std::string shard = opts_.optimizer_shards > 1 ? ".shard" : "";  // ZeRO-1: this rank's share
      lp.m = arena_->get(lp.name + ".adam_m" + shard);
      lp.v = arena_->get(lp.name + ".adam_v" + shard);
      if (std::string(ab) == "lora_B") lp.experts = experts, lp.interleaved = interleaved;
      lora_params_.push_back(lp);
    }
  };
  lora_slot_.assign(size_t(cfg_.n_layer * 7), -1);
  for (int64_t l = 0; l < cfg_.n_layer; l++)
    for (int p = 0; p < 7; p++) {
      if (mod_first_[size_t(p)] != p) {  // a later projection of a fused module: the module's adapter
        lora_slot_[size_t(l * 7 + p)] = lora_slot_[size_t(l * 7 + mod_first_[size_t(p)])];
        continue;
      }
      const std::string& mod = mod_name_[size_t(p)];
      const std::string base = "layers." + std::to_string(l) + "." + mod + ".";
      if (!arena_->has(base + "lora_A")) continue;
      lora_slot_[size_t(l * 7 + p)] = int(lora_params_.size());
      add_lora_pair(base, peft_module_name(cfg_, l, mod), 0);
    }
  // LoRA on the stacked experts: one A (E*r, in) and B (E*out, r) per layer and kind, after the
  // layer order of the projections' adapters (model_plan.cpp plans them so).
  expert_lora_.assign(size_t(cfg_.n_layer * 2), -1);
  for (int64_t l = 0; l < cfg_.n_layer; l++)
    for (int k = 0; k < 2; k++) {
      const std::string& kind = expert_lora_kinds()[size_t(k)];
      const std::string base = "layers." + std::to_string(l) + ".experts." + kind + ".";
      if (!arena_->has(base + "lora_A")) continue;
      expert_lora_[size_t(l * 2 + k)] = int(lora_params_.size());
      // gpt-oss's gate_up_proj interleaves gate's and up's outputs (PEFT's B rows follow it).
      add_lora_pair(base, peft_expert_module_name(cfg_, l, kind, lora_), cfg_.n_experts,
                    cfg_.model_type == "gpt_oss" && kind == "gate_up_proj");
    }
  std::vector<float> inv = rope_inv_freq(cfg_);  // LongRoPE: the short factors until a batch needs the long
  be_.copy_to_device(arena_->raw("rope.inv_freq"), inv.data(), inv.size() * 4);
  rope_long_ = false;
  rope_scale_ = rope_attention_scale(cfg_);
  if (cfg_.rope_local_theta > 0) {
    inv = rope_local_inv_freq(cfg_);
    be_.copy_to_device(arena_->raw("rope.inv_freq_local"), inv.data(), inv.size() * 4);
  }
  resolve_views();
}

void LlamaModel::resolve_views() {
  const Arena& ar = *arena_;
  auto opt = [&](const std::string& name) { return ar.has(name) ? ar.get(name) : Tensor(); };
  views_ = std::make_unique<StepViews>();
  StepViews& v = *views_;
  static const std::pair<Tensor StepViews::*, const char*> kStep[] = {
      {&StepViews::dres, "ws.dres"},   {&StepViews::dln, "ws.dln"},     {&StepViews::tmp, "ws.tmp"},
      {&StepViews::dgate, "ws.dgate"}, {&StepViews::dup, "ws.dup"},     {&StepViews::datt, "ws.datt"},
      {&StepViews::dq, "ws.dq"},       {&StepViews::dk, "ws.dk"},       {&StepViews::dv, "ws.dv"},
      {&StepViews::inv_freq, "rope.inv_freq"}, {&StepViews::embed, "embed_tokens"},
      {&StepViews::final_x, "act.final_x"},
      {&StepViews::final_rstd, "act.final_rstd"}, {&StepViews::norm, "norm"},
      {&StepViews::chunk, "logits.chunk"},     {&StepViews::losses, "logits.losses"}};
  for (const auto& [member, name] : kStep) v.*member = ar.get(name);
  if (cfg_.moe()) {
    v.moe_dy = ar.get("ws.moe_dy");
    v.moe_dlogits = ar.get("ws.moe_dlogits");
    v.moe_dw = ar.get("ws.moe_dw");
    v.expert_dequant = opt("ws.expert_dequant");
  }
  // act.final_ln, or (the plan's choice) the first N x C values of ws.datt.
  v.final_ln = ar.has("act.final_ln") ? ar.get("act.final_ln") : as_matrix(v.datt, max_tokens(), cfg_.hidden_size);
  v.lora_dh = opt("ws.lora_dh");
  v.moe_lora_dh = opt("ws.moe_lora_dh");
  v.lora_xd = opt("ws.lora_xd");
  v.dequant = opt("ws.dequant");
  if (v.dequant.data) v.dequant_slot = v.dequant.dim(1);
  v.head = ar.get(cfg_.tie_word_embeddings ? "embed_tokens" : "lm_head");
  static const std::pair<Tensor StepViews::*, const char*> kBatch[] = {
      {&StepViews::batch_tokens, "batch.tokens"},         {&StepViews::batch_targets, "batch.targets"},
      {&StepViews::batch_positions, "batch.positions"},   {&StepViews::batch_seg, "batch.seg"},
      {&StepViews::batch_label_rows, "batch.label_rows"}, {&StepViews::batch_label_targets, "batch.label_targets"}};
  for (const auto& [member, name] : kBatch) v.*member = ar.get(name);
  v.router_stats = opt("moe.router_stats");
  v.aux_grad = opt("moe.aux_grad");
  v.batch_mask = opt("batch.mask");
  int64_t at = 0;
  for (int p = 0; p < 7; p++) {
    v.dequant_offset[p] = at;
    const auto [out, in] = projection_shape(cfg_, kProj[p]);
    at += out * in;
  }
  layers_.assign(size_t(cfg_.n_layer), LayerViews{});
  // fsdp: a layer's projections live in its fsdp.gather slot (l % 2) once gathered.
  const DType float_base = storage_dtype(base_of(opts_));
  shard_ptr_.clear();
  gather_ = fsdp_ ? static_cast<uint8_t*>(ar.raw("fsdp.gather")) : nullptr;
  // A layer's input: its own buffer, or with offload the device slot of its parity.
  auto layer_input = [&](int64_t l) {
    return offload_ ? ar.get("act.offload_slot." + std::to_string(l % 2)) : ar.get("act.layers." + std::to_string(l) + ".x");
  };
  host_x_.clear();
  for (int64_t l = 0; offload_ && l < cfg_.n_layer - 2; l++) host_x_.push_back(ar.raw("act.layers." + std::to_string(l) + ".x"));
  for (int64_t l = 0; l < cfg_.n_layer; l++) {
    LayerViews& L = layers_[size_t(l)];
    const std::string lp = "layers." + std::to_string(l) + ".";
    const std::string ap = ckpt_ ? std::string("act.cur.") : "act." + lp;
    Acts& a = L.a;
    a.x = layer_input(l);
    static const std::pair<Tensor Acts::*, const char*> kActs[] = {
        {&Acts::ln1, "ln1"}, {&Acts::rstd1, "rstd1"}, {&Acts::q, "q"},        {&Acts::k, "k"},
        {&Acts::v, "v"},     {&Acts::att, "att"},     {&Acts::lse, "lse"},    {&Acts::xmid, "xmid"},
        {&Acts::ln2, "ln2"}, {&Acts::rstd2, "rstd2"}, {&Acts::gate, "gate"}, {&Acts::up, "up"},
        {&Acts::h, "h"}};
    for (const auto& [member, name] : kActs) a.*member = ar.get(ap + name);
    if (cfg_.qk_norm) {
      a.q_raw = ar.get(ap + "q_raw");
      a.k_raw = ar.get(ap + "k_raw");
      a.rstd_q = ar.get(ap + "rstd_q");
      a.rstd_k = ar.get(ap + "rstd_k");
      L.q_norm_w = ar.get(lp + "q_norm");
      L.k_norm_w = ar.get(lp + "k_norm");
    }
    if (cfg_.moe()) {
      static const std::pair<Tensor Acts::*, const char*> kMoe[] = {
          {&Acts::moe_logits, "moe_logits"}, {&Acts::moe_expert, "moe_expert"}, {&Acts::moe_weight, "moe_weight"},
          {&Acts::moe_row, "moe_row"},       {&Acts::moe_token, "moe_token"},   {&Acts::moe_row_weight, "moe_row_weight"},
          {&Acts::moe_offsets, "moe_offsets"}, {&Acts::moe_x, "moe_x"},       {&Acts::moe_y, "moe_y"}};
      for (const auto& [member, name] : kMoe) a.*member = ar.get(ap + name);
      for (int k = 0; k < 2; k++)
        if (expert_lora_[size_t(l * 2 + k)] >= 0)
          a.moe_lora_h[k] = ar.get(ap + "experts." + expert_lora_kinds()[size_t(k)] + ".lora_h");
      L.router = ar.get(lp + "router");
      if (cfg_.moe_biases) L.router_bias = ar.get(lp + "router.bias");
      for (int k = 0; k < 3; k++) {
        const std::string stack = lp + "experts." + expert_kinds()[size_t(k)];
        if (quantized_experts_) L.experts_packed[k] = static_cast<const uint8_t*>(ar.raw(stack));
        else L.experts[k] = ar.get(stack);
        if (cfg_.moe_biases) L.expert_bias[k] = ar.get(stack + ".bias");
      }
    }
    if (cfg_.sandwich_norms) {
      a.attn_out = ar.get(ap + "attn_out");
      a.rstd_pa = ar.get(ap + "rstd_pa");
      a.mlp_out = ar.get(ap + "mlp_out");
      a.rstd_pf = ar.get(ap + "rstd_pf");
    }
    for (int j = 0; j < 7; j++)  // one intermediate per module, shared by a fused module's projections
      if (lora_slot_[size_t(l * 7 + j)] >= 0) a.lora_h[j] = ar.get(ap + mod_name_[size_t(j)] + ".lora_h");
    L.next = l + 1 < cfg_.n_layer ? layer_input(l + 1) : v.final_x;
    L.ln1_w = ar.get(lp + "input_layernorm");
    // Llama's post_attention_layernorm is the MLP's input norm; Gemma's sits on o_proj's output
    // and pre_feedforward_layernorm is the MLP's.
    if (cfg_.sandwich_norms) {
      L.ln2_w = ar.get(lp + "pre_feedforward_layernorm");
      L.post_attn_w = ar.get(lp + "post_attention_layernorm");
      L.post_ff_w = ar.get(lp + "post_feedforward_layernorm");
    } else {
      L.ln2_w = ar.get(lp + "post_attention_layernorm");
    }
    L.inv_freq = cfg_.local_rope(l) ? ar.get("rope.inv_freq_local") : v.inv_freq;
    if (fsdp_) shard_ptr_.push_back(static_cast<const uint8_t*>(ar.raw(lp + "base.shard")));
    for (int p = 0; p < int(dense_projections(cfg_).size()); p++) {  // a MoE layer's MLP: router and experts above
      if (fsdp_) {
        uint8_t* at = gather_ + (l % 2) * blob_.total + blob_.offset[p];
        const auto [out, in] = projection_shape(cfg_, kProj[p]);
        if (quantized_base_) L.packed[p] = at;
        else L.w[p] = Tensor(at, float_base, {out, in});
      } else if (quantized_base_) {
        L.packed[p] = arena_->raw(lp + kProj[p]);
        if (opts_.gemm_dtype == GemmDtype::Fp4) L.gemm_scales[p] = arena_->raw(lp + kProj[p] + ".gemm_scales");
      } else {
        L.w[p] = ar.get(lp + kProj[p]);
      }
    }
    if (cfg_.attention_bias)
      for (int p = 0; p <= V; p++) L.bias[p] = ar.get(lp + kProj[p] + ".bias");
    if (cfg_.o_proj_bias) L.bias[O] = ar.get(lp + "o_proj.bias");
    if (cfg_.attention_sinks) L.sinks = ar.get(lp + "sinks");
  }
  kv_k_.clear();
  kv_v_.clear();
  if (opts_.kv_cache_tokens > 0)
    for (int64_t l = 0; l < cfg_.n_layer; l++) {
      kv_k_.push_back(ar.get("kv.layers." + std::to_string(l) + ".k"));
      kv_v_.push_back(ar.get("kv.layers." + std::to_string(l) + ".v"));
    }
}

LlamaModel::~LlamaModel() = default;

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

void LlamaModel::set_base_comm(Comm& comm) {
  if (fsdp_ && (comm.size() != opts_.base_shards || comm.rank() != opts_.base_shard_rank))
    fail(ErrorKind::Internal, "fsdp", "the model was planned as rank " + std::to_string(opts_.base_shard_rank) + " of " +
                                          std::to_string(opts_.base_shards) + ", the Comm is rank " +
                                          std::to_string(comm.rank()) + " of " + std::to_string(comm.size()));
  base_comm_ = &comm;
}

int64_t LlamaModel::base_shard_bytes() const { return fsdp_ ? int64_t(shard_.count) * cfg_.n_layer : 0; }

// fsdp: layer l's seven projections stored as planned into one host blob, of which this rank keeps
// its share. Every rank reads the whole layer (the source is on every node) and keeps 1/N of it.
void LlamaModel::load_layer_shard(const TensorSource& src, int64_t l, bool stored_as_planned, const std::string& buffer) {
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
  if (shard_.count > 0) be_.copy_to_device(arena_->raw(buffer), blob.data() + shard_.begin, shard_.count);
}

void LlamaModel::gather_layer(int64_t l) {
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

void LlamaModel::load_base(const TensorSource& checkpoint) {
  // Phi-3's qkv_proj / gate_up_proj by parts; a MoE layer's experts as stacks.
  const TensorSource src = experts_source(cfg_, unfused_source(cfg_, checkpoint));
  slot_layer_.fill(-1);
  gather_layer_.fill(-1);
  // A checkpoint stored in exactly the planned format is copied; any other source is quantized here.
  const bool stored_as_planned = quantized_base_ && src.stored_quant && src.read_quantized &&
                                 same_quant(*src.stored_quant, base_quant_);
  std::vector<float> host;  // one tensor in f32 at a time
  for (const auto& b : plan_.buffers) {
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
      quant_io_.store(q, arena_->raw(b.name));
      if (opts_.gemm_dtype == GemmDtype::Fp4) {  // repacked once: the FP4 GEMM's scales beside the stored codes
        const std::vector<uint8_t> sf = fp4_gemm_scales(q);
        be_.copy_to_device(arena_->raw(b.name + ".gemm_scales"), sf.data(), sf.size());
      }
      continue;
    }
    int64_t n = 1;
    for (int64_t s : b.shape) n *= s;
    Tensor t = arena_->get(b.name);
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
void LlamaModel::load_expert_stack(const TensorSource& src, const std::string& buffer) {
  const int64_t l = std::stoll(buffer.substr(7)), E = cfg_.n_experts;
  const std::string kind = buffer.substr(buffer.rfind('.') + 1), stack = hf_weight_name(buffer);
  const auto [rows, cols] = expert_shape(cfg_, kind);
  const int64_t stride = expert_stride_bytes(cfg_, kind, expert_quant_);
  auto* dst = static_cast<uint8_t*>(arena_->raw(buffer));
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

QuantizedTensor LlamaModel::base_quantized(int64_t l, const std::string& proj) {
  if (!quantized_base_) fail(ErrorKind::Internal, "base_quantized", "the base is not quantized");
  const auto [rows, cols] = projection_shape(cfg_, proj);
  QuantizedTensor q;
  if (fsdp_) {
    gather_layer(l);
    const auto& t = all_linear_targets();
    const size_t p = size_t(std::find(t.begin(), t.end(), proj) - t.begin());
    QLORA_ASSERT(p < 7);
    quant_io_.load(layers_[size_t(l)].packed[p], base_quant_, rows, cols, q);
    return q;
  }
  quant_io_.load(arena_->raw("layers." + std::to_string(l) + "." + proj), base_quant_, rows, cols, q);
  return q;
}

std::vector<float> LlamaModel::weight_f32(const std::string& name) {
  const Tensor t = arena_->get(name);
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

void LlamaModel::init_lora(uint64_t seed) {
  Rng rng(seed);
  std::vector<float> host;
  for (auto& p : lora_params_) {
    host.assign(size_t(p.w.numel()), 0.0f);
    if (p.name.size() >= 6 && p.name.compare(p.name.size() - 6, 6, "lora_A") == 0) {
      // kaiming_uniform_(a=sqrt(5)) on (r, in): bound = 1/sqrt(in)
      const float bound = 1.0f / std::sqrt(float(p.w.dim(1)));
      for (auto& v : host) v = rng.uniform(-bound, bound);
    }
    be_.copy_to_device(p.w.data, host.data(), host.size() * 4);
    be_.memset0(p.m.data, size_t(p.m.nbytes()));
    be_.memset0(p.v.data, size_t(p.v.nbytes()));
  }
  zero_grads();
}

float LlamaModel::embed_scale() const {
  const float s = float(std::sqrt(double(cfg_.hidden_size)));
  return opts_.compute_dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(s)) : s;
}

void LlamaModel::zero_grads() {
  for (auto& p : lora_params_) be_.memset0(p.g.data, size_t(p.g.nbytes()));
}

// What the plan needs from the machine's memory: on a GPU the host buffers (offloaded layer
// inputs, pinned, so never swapped), on the CPU everything. More than MemAvailable is refused now,
// before anything is allocated, instead of failing (or being killed) during a step.
void LlamaModel::check_host_memory() const {
  const bool cpu = be_.device() == DeviceKind::Cpu;
  const int64_t need = cpu ? plan_.total_bytes() : plan_.host_bytes();
  const int64_t avail = available_host_bytes();
  if (need == 0 || avail == 0 || need <= avail) return;
  auto gib = [](int64_t b) {
    char s[32];
    std::snprintf(s, sizeof s, "%.2f GiB", double(b) / double(1ll << 30));
    return std::string(s);
  };
  fail(ErrorKind::Config, "memory plan",
       (cpu ? "the run needs " + gib(need) + " of memory"
            : "activation offload keeps " + gib(need) + " of layer inputs in pinned host memory") +
           " and the machine has " + gib(avail) + " available (MemAvailable)",
       ckpt_ ? "use shorter rows (max_length) or a smaller micro-batch, or a machine with more memory"
             : "use gradient_checkpointing: full, shorter rows (max_length) or a smaller micro-batch");
}

LlamaModel::Acts LlamaModel::acts(int64_t l, int64_t n) const {
  Acts a = layers_[size_t(l)].a;
  for (Tensor* t : {&a.x, &a.ln1, &a.rstd1, &a.q, &a.k, &a.v, &a.att, &a.xmid, &a.ln2, &a.rstd2})
    *t = with_rows(*t, n);
  // tiled: one tile; a mixture of experts: one row per (token, choice)
  const int64_t mlp_n = cfg_.moe() ? n * cfg_.experts_per_tok : std::min(n, mlp_rows_);
  for (Tensor* t : {&a.gate, &a.up, &a.h}) *t = with_rows(*t, mlp_n);
  if (cfg_.moe()) {
    a.moe_logits = with_rows(a.moe_logits, n);
    a.moe_x = with_rows(a.moe_x, mlp_n);
    a.moe_y = with_rows(a.moe_y, mlp_n);
    for (Tensor* t : {&a.moe_expert, &a.moe_weight, &a.moe_row, &a.moe_token, &a.moe_row_weight}) *t = with_rows(*t, mlp_n);
  }
  if (cfg_.sandwich_norms) {
    a.attn_out = with_rows(a.attn_out, n);
    a.rstd_pa = with_rows(a.rstd_pa, n);
    a.mlp_out = with_rows(a.mlp_out, std::min(n, mlp_rows_));  // tiled: one tile
    a.rstd_pf = with_rows(a.rstd_pf, n);
  }
  if (cfg_.qk_norm) {
    a.q_raw = with_rows(a.q_raw, n);
    a.k_raw = with_rows(a.k_raw, n);
    a.rstd_q = with_rows(a.rstd_q, n * cfg_.n_head);
    a.rstd_k = with_rows(a.rstd_k, n * cfg_.n_head_kv);
  }
  a.lse = as_matrix(a.lse, cfg_.n_head, n);  // (Hq, N) storage used as (B,Hq,T)
  for (Tensor& t : a.lora_h)
    if (t.data) t = with_rows(t, n);
  return a;
}

// Dequantizes layer l's seven projections into its ws.dequant slot (l % 2) unless the slot holds
// them already. ahead: the layer is needed only after the ops issued next, so the backend may run
// the dequantization beside them (on a GPU, a side stream); the first op that reads it waits for it.
// fsdp: the layer's blob is gathered first (a float base is used as gathered).
void LlamaModel::prepare_layer(int64_t l, bool ahead) {
  if (!quantized_base_) return gather_layer(l);
  if (l < 0 || l >= cfg_.n_layer || slot_layer_[size_t(l % 2)] == l) return;
  gather_layer(l);
  const LayerViews& L = layers_[size_t(l)];
  const int64_t es = dtype_size(views_->dequant.dtype);
  char* slot = static_cast<char*>(views_->dequant.data) + (l % 2) * views_->dequant_slot * es;
  for (int p = 0; p < int(dense_projections(cfg_).size()); p++) {  // a MoE layer's experts: prepare_expert
    const auto [out, in] = projection_shape(cfg_, kProj[p]);
    DequantizeArgs d{Tensor(slot + views_->dequant_offset[p] * es, views_->dequant.dtype, {out, in}), L.packed[p],
                     base_quant_, out, in};
    d.prefetch = ahead;
    be_.dequantize(d);
  }
  slot_layer_[size_t(l % 2)] = l;
  dequantized_layers_++;
}

// The (out,in) weight of a projection in the compute dtype: a quantized projection from its layer's
// ws.dequant slot (prepare_layer).
Tensor LlamaModel::base_weight(int64_t l, int p) {
  const LayerViews& L = layers_[size_t(l)];
  prepare_layer(l, false);  // a no-op when the forward or backward loop has prepared it
  if (!quantized_base_) return L.w[p];
  const auto [out, in] = projection_shape(cfg_, kProj[p]);
  Tensor w = views_->dequant;
  w.data = static_cast<char*>(w.data) + ((l % 2) * views_->dequant_slot + views_->dequant_offset[p]) * dtype_size(w.dtype);
  return as_matrix(w, out, in);
}

int LlamaModel::lora_index(int64_t l, int p) const { return lora_slot_[size_t(l * 7 + p)]; }

static uint64_t dropout_stream(int64_t layer, int proj) { return uint64_t(layer) * 7 + uint64_t(proj); }

// y (N,out) "=" x W^T + bias + s * dropout(x) A^T B^T. A fused module's first projection computes
// the shared h = dropout(x) A^T; each projection adds its rows of B.
void LlamaModel::linear_fwd(const Tensor& y, const Tensor& x, int64_t l, int p, const Acts& a, bool train,
                            uint64_t seed, int64_t row0) {
  const int64_t n = x.dim(0), in = x.dim(1), out = y.dim(1);
  if (opts_.gemm_dtype == GemmDtype::Fp8) {  // the fp8 weight as stored, x quantized to e4m3 (no dequantization)
    gather_layer(l);
    be_.matmul_fp8({.y = y, .x = x, .w = layers_[size_t(l)].packed[p], .m = n, .out = out, .in = in, .amax = Tensor()});
  } else if (opts_.gemm_dtype == GemmDtype::Fp4) {  // the stored e2m1 codes, x quantized to NVFP4 (no dequantization)
    be_.matmul_fp4({.y = y, .x = x, .w = layers_[size_t(l)].packed[p], .w_scales = layers_[size_t(l)].gemm_scales[p],
                    .m = n, .out = out, .in = in});
  } else {
    be_.matmul({.c = y, .a = x, .b = base_weight(l, p), .m = n, .n = out, .k = in, .trans_a = false, .trans_b = true,
                .alpha = 1.0f, .beta = 0.0f});
  }
  if (p <= O && layers_[size_t(l)].bias[p].data) be_.bias_add({.y = y, .bias = layers_[size_t(l)].bias[p], .n = n,
                                                               .m = out});
  const int li = adapters_on_ ? lora_index(l, p) : -1;
  if (li < 0) return;
  const LoraParam& B = lora_pair(li).B;
  if (mod_first_[size_t(p)] == p) lora_h_fwd(x, l, p, a, train, seed, row0);  // h = xd A^T  (N,r)
  const Tensor bw = row_slice(B.w, mod_row0_[size_t(p)], out);  // this projection's rows of B
  be_.matmul({.c = y, .a = row_slice(a.lora_h[p], row0, n), .b = bw, .m = n, .n = out, .k = lora_.r, .trans_a = false,
              .trans_b = true, .alpha = lora_.scale(), .beta = 1.0f});  // y += s h B^T
}

// add_lora_pair pushes a module's lora_A and then its lora_B: the one place that order is known.
LlamaModel::LoraPair LlamaModel::lora_pair(int a_index) const {
  return {lora_params_[size_t(a_index)], lora_params_[size_t(a_index) + 1]};
}

void LlamaModel::lora_h_fwd(const Tensor& x, int64_t l, int p, const Acts& a, bool train, uint64_t seed, int64_t row0) {
  const int64_t n = x.dim(0), in = x.dim(1);
  const LoraParam& A = lora_pair(lora_index(l, p)).A;
  Tensor xin = x;
  if (train && lora_.dropout > 0) {
    xin = as_matrix(views_->lora_xd, n, in);
    be_.dropout_fwd({.out = xin, .x = x, .n = n * in, .p = float(lora_.dropout), .seed = seed,
                     .stream = dropout_stream(l, mod_first_[size_t(p)]), .offset = uint64_t(row0 * in)});
  }
  be_.matmul({.c = row_slice(a.lora_h[p], row0, n), .a = xin, .b = A.w, .m = n, .n = lora_.r, .k = in, .trans_a = false,
              .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
}

// dx (N,in) "=" or "+=" dy W (+ LoRA path); dA, dB "+=". A fused module's projections come in
// order (q, k, v; gate, up) with the same x: each adds its rows' dB and its part of dh = s dy B
// (ws.lora_dh: the first "=", the others "+="), and the last one finishes dA and dx.
void LlamaModel::linear_bwd(const Tensor& dx, bool acc, const Tensor& dy, const Tensor& x, int64_t l, int p,
                            const Acts& a, uint64_t seed, bool need_dx, int64_t row0) {
  const int64_t n = dy.dim(0), out = dy.dim(1), in = dx.dim(1);
  if (need_dx) be_.matmul({.c = dx, .a = dy, .b = base_weight(l, p), .m = n, .n = in, .k = out, .trans_a = false,
                           .trans_b = false, .alpha = 1.0f, .beta = acc ? 1.0f : 0.0f});
  const int li = lora_index(l, p);
  if (li < 0) return;
  const auto& [A, B] = lora_pair(li);
  const int64_t r = lora_.r;
  const float s = lora_.scale();
  const bool drop = lora_.dropout > 0;
  const uint64_t mask_at = uint64_t(row0 * in);
  const uint64_t stream = dropout_stream(l, mod_first_[size_t(p)]);
  const int64_t b0 = mod_row0_[size_t(p)];
  be_.matmul({.c = row_slice(B.g, b0, out), .a = dy, .b = row_slice(a.lora_h[p], row0, n), .m = out, .n = r, .k = n,
              .trans_a = true, .trans_b = false, .alpha = s, .beta = 1.0f});  // dB += s dy^T h
  Tensor dh = as_matrix(views_->lora_dh, n, r);
  be_.matmul({.c = dh, .a = dy, .b = row_slice(B.w, b0, out), .m = n, .n = r, .k = out, .trans_a = false,
              .trans_b = false, .alpha = s, .beta = mod_first_[size_t(p)] == p ? 0.0f : 1.0f});  // dh = (+=) s dy B   (N,r)
  if (mod_last_[size_t(p)] != p) return;
  Tensor xin = x;
  if (drop) {
    xin = as_matrix(views_->lora_xd, n, in);
    be_.dropout_fwd({.out = xin, .x = x, .n = n * in, .p = float(lora_.dropout), .seed = seed, .stream = stream,
                     .offset = mask_at});
  }
  be_.matmul({.c = A.g, .a = dh, .b = xin, .m = r, .n = in, .k = n, .trans_a = true, .trans_b = false, .alpha = 1.0f,
              .beta = 1.0f});  // dA += dh^T xd   (r,in)
  if (!need_dx) return;
  if (!drop) {
    be_.matmul({.c = dx, .a = dh, .b = A.w, .m = n, .n = in, .k = r, .trans_a = false, .trans_b = false, .alpha = 1.0f,
                .beta = 1.0f});  // dx += dh A
  } else {
    Tensor t = as_matrix(views_->lora_xd, n, in);
    be_.matmul({.c = t, .a = dh, .b = A.w, .m = n, .n = in, .k = r, .trans_a = false, .trans_b = false, .alpha = 1.0f,
                .beta = 0.0f});
    be_.dropout_bwd({.out = t, .x = t, .n = n * in, .p = float(lora_.dropout), .seed = seed, .stream = stream,
                     .offset = mask_at});
    be_.add({.y = dx, .x = t, .n = n * in});
  }
}

void LlamaModel::upload_batch(const Batch& batch) {
  const int64_t n = batch.n();
  if (batch.t > opts_.seq_len || n > max_tokens())
    fail(ErrorKind::Internal, "batch", "micro-batch of " + std::to_string(batch.b) + "x" + std::to_string(batch.t) +
                                           " exceeds the planned " + std::to_string(opts_.micro_batch) + "x" +
                                           std::to_string(opts_.seq_len));
  const StepViews& sv = *views_;
  auto up = [&](const Tensor& buffer, const std::vector<int32_t>& v) -> const int32_t* {
    void* d = buffer.data;
    if (v.empty()) return nullptr;
    QLORA_ASSERT(int64_t(v.size()) == n);
    be_.copy_to_device(d, v.data(), size_t(n) * 4);
    return static_cast<const int32_t*>(d);
  };
  d_tokens_ = up(sv.batch_tokens, batch.tokens);
  d_targets_ = up(sv.batch_targets, batch.targets);
  d_positions_ = up(sv.batch_positions, batch.positions);
  // LongRoPE rotates a forward with the long factors when its positions pass the original
  // context (transformers: max(position_ids) + 1 > original_max_position_embeddings), else the short.
  if (cfg_.rope_scaling.type == "longrope" && !batch.positions.empty()) {
    const int64_t max_pos = *std::max_element(batch.positions.begin(), batch.positions.end());
    if (const bool want = rope_uses_long_factors(cfg_, max_pos); want != rope_long_) {
      const std::vector<float> inv = rope_inv_freq(cfg_, want);
      be_.copy_to_device(sv.inv_freq.data, inv.data(), inv.size() * 4);
      rope_long_ = want;
    }
  }
  d_seg_ = up(sv.batch_seg, batch.seg);
  n_docs_ = 0;
  for (int64_t i = 0; i < int64_t(batch.seg.size()); i++)
    n_docs_ += i % batch.t == 0 || batch.seg[size_t(i)] != batch.seg[size_t(i - 1)];
  // The rows that carry a label: SFT batches train on the answers only, and the LM head, the
  // loss and its gradient are computed for those rows alone.
  std::vector<int32_t> rows_l, targets_l;
  for (int64_t i = 0; i < int64_t(batch.targets.size()); i++)
    if (batch.targets[size_t(i)] != -100) {
      rows_l.push_back(int32_t(i));
      targets_l.push_back(batch.targets[size_t(i)]);
    }
  n_labeled_ = batch.targets.empty() ? 0 : int64_t(rows_l.size());
  d_label_rows_ = d_label_targets_ = nullptr;
  if (n_labeled_ < n && n_labeled_ > 0) {
    void* r = sv.batch_label_rows.data;
    void* t = sv.batch_label_targets.data;
    be_.copy_to_device(r, rows_l.data(), rows_l.size() * 4);
    be_.copy_to_device(t, targets_l.data(), targets_l.size() * 4);
    d_label_rows_ = static_cast<const int32_t*>(r);
    d_label_targets_ = static_cast<const int32_t*>(t);
  }
  cur_b_ = batch.b;
  cur_t_ = batch.t;
}

void LlamaModel::layer_fwd(int64_t l, int64_t n, bool train, uint64_t seed, bool recompute) {
  Acts a = acts(l, n);
  const LayerViews& L = layers_[size_t(l)];
  const float eps = float(cfg_.rms_norm_eps), w_off = norm_offset();
  const Tensor inv_freq = L.inv_freq;
  Tensor next = recompute ? as_matrix(views_->tmp, n, cfg_.hidden_size) : with_rows(L.next, n);
  // Attention reads k, v of t_kv positions: this micro-batch's own (training), or, when decoding,
  // the cache rows [0, kv_pos_ + n), the new ones written straight into it by the k/v projections.
  Tensor k_all = a.k, v_all = a.v;
  int64_t t_kv = 0;
  if (decoding_) {
    const int64_t kvd = cfg_.kv_dim(), at = kv_pos_ * kvd * dtype_size(a.k.dtype);
    t_kv = kv_pos_ + n;
    k_all = as_matrix(kv_k_[size_t(l)], t_kv, kvd);
    v_all = as_matrix(kv_v_[size_t(l)], t_kv, kvd);
    a.k = as_matrix(k_all, n, kvd);
    a.v = as_matrix(v_all, n, kvd);
    a.k.data = static_cast<char*>(k_all.data) + at;
    a.v.data = static_cast<char*>(v_all.data) + at;
  }

  be_.rmsnorm_fwd({.out = a.ln1, .rstd = a.rstd1, .x = a.x, .w = L.ln1_w, .n = n, .c = cfg_.hidden_size, .eps = eps,
                   .w_offset = w_off});
  // qk_norm: the projections land in q_raw/k_raw and an RMSNorm over each head (one row of D
  // values per head) writes q and k.
  linear_fwd(cfg_.qk_norm ? a.q_raw : a.q, a.ln1, l, Q, a, train, seed);
  linear_fwd(cfg_.qk_norm ? a.k_raw : a.k, a.ln1, l, K, a, train, seed);
  linear_fwd(a.v, a.ln1, l, V, a, train, seed);
  if (cfg_.qk_norm) {
    const int64_t hd = cfg_.head_dim, hq = n * cfg_.n_head, hk = n * cfg_.n_head_kv;
    be_.rmsnorm_fwd({.out = as_matrix(a.q, hq, hd), .rstd = a.rstd_q, .x = as_matrix(a.q_raw, hq, hd), .w = L.q_norm_w,
                     .n = hq, .c = hd, .eps = eps, .w_offset = w_off});
    be_.rmsnorm_fwd({.out = as_matrix(a.k, hk, hd), .rstd = a.rstd_k, .x = as_matrix(a.k_raw, hk, hd), .w = L.k_norm_w,
                     .n = hk, .c = hd, .eps = eps, .w_offset = w_off});
  }
  be_.rope_fwd({.x = a.q, .inv_freq = inv_freq, .positions = d_positions_, .n = n, .n_head = cfg_.n_head,
                .head_dim = cfg_.head_dim, .rotary_dim = cfg_.rope_dim(), .scale = rope_scale_});
  be_.rope_fwd({.x = a.k, .inv_freq = inv_freq, .positions = d_positions_, .n = n, .n_head = cfg_.n_head_kv,
                .head_dim = cfg_.head_dim, .rotary_dim = cfg_.rope_dim(), .scale = rope_scale_});
  const float scale = cfg_.attn_scale();
  be_.attention_fwd({.out = a.att, .lse = a.lse, .q = a.q, .k = k_all, .v = v_all, .seg = d_seg_, .b = cur_b_,
                     .t = cur_t_, .n_head = cfg_.n_head, .n_head_kv = cfg_.n_head_kv, .head_dim = cfg_.head_dim,
                     .scale = scale, .t_kv = t_kv, .n_docs = n_docs_, .window = cfg_.window_of(l),
                     .softcap = float(cfg_.attn_logit_softcapping), .sinks = L.sinks});
  if (cfg_.sandwich_norms) {
    linear_fwd(a.attn_out, a.att, l, O, a, train, seed);  // xmid = norm(o_proj(att)) ...
    be_.rmsnorm_fwd({.out = a.xmid, .rstd = a.rstd_pa, .x = a.attn_out, .w = L.post_attn_w, .n = n,
                     .c = cfg_.hidden_size, .eps = eps, .w_offset = w_off});
  } else {
    linear_fwd(a.xmid, a.att, l, O, a, train, seed);  // xmid = o_proj(att) ...
  }
  be_.add({.y = a.xmid, .x = a.x, .n = a.xmid.numel()});  // ... + x
  be_.rmsnorm_fwd({.out = a.ln2, .rstd = a.rstd2, .x = a.xmid, .w = L.ln2_w, .n = n, .c = cfg_.hidden_size, .eps = eps,
                   .w_offset = w_off});
  if (cfg_.moe()) {
    moe_fwd(a, next, l, n, train && !recompute && !decoding_ && adapters_on_);  // next = experts(ln2) ...
    be_.add({.y = next, .x = a.xmid, .n = next.numel()});  // ... + xmid
    return;
  }
  if (n > mlp_rows_) {  // over tiles; a recompute leaves the MLP to the backward, tile by tile
    if (!recompute) mlp_fwd_tiled(a, next, l, n, train, seed);
    return;
  }
  linear_fwd(a.gate, a.ln2, l, G, a, train, seed);
  linear_fwd(a.up, a.ln2, l, U, a, train, seed);
  be_.swiglu_fwd({.out = a.h, .gate = a.gate, .up = a.up, .n = a.h.numel(), .act = cfg_.hidden_act,
                  .clamp = cfg_.swiglu_clamp});
  mlp_out_fwd(a, next, a.h, l, 0, train, seed);  // next = [norm](down_proj(h)) ...
  be_.add({.y = next, .x = a.xmid, .n = next.numel()});  // ... + xmid
}

// out (m,C) "=" down_proj(h) for rows [row0, row0 + m), then, with sandwich norms, its norm (the
// projection lands in a.mlp_out, one tile long; the norm's 1/rms in those rows of a.rstd_pf).
void LlamaModel::mlp_out_fwd(const Acts& a, const Tensor& out, const Tensor& h, int64_t l, int64_t row0, bool train,
                             uint64_t seed) {
  if (!cfg_.sandwich_norms) return linear_fwd(out, h, l, D, a, train, seed, row0);
  const int64_t m = h.dim(0);
  const Tensor y = with_rows(a.mlp_out, m);
  linear_fwd(y, h, l, D, a, train, seed, row0);
  be_.rmsnorm_fwd({.out = out, .rstd = row_slice(a.rstd_pf, row0, m), .x = y, .w = layers_[size_t(l)].post_ff_w, .n = m,
                   .c = cfg_.hidden_size, .eps = float(cfg_.rms_norm_eps), .w_offset = norm_offset()});
}

// One tile's rows [t0, t0 + m): its ln2 rows and gate = gate_proj(ln2), up = up_proj(ln2),
// h = swiglu(gate, up) computed into the one-tile buffers.
LlamaModel::MlpTile LlamaModel::mlp_tile_fwd(const Acts& a, int64_t l, int64_t t0, int64_t m, bool train, uint64_t seed) {
  MlpTile t{row_slice(a.ln2, t0, m), with_rows(a.gate, m), with_rows(a.up, m), with_rows(a.h, m)};
  linear_fwd(t.gate, t.ln2, l, G, a, train, seed, t0);
  linear_fwd(t.up, t.ln2, l, U, a, train, seed, t0);
  be_.swiglu_fwd({.out = t.h, .gate = t.gate, .up = t.up, .n = t.h.numel(), .act = cfg_.hidden_act,
                  .clamp = cfg_.swiglu_clamp});
  return t;
}

// next = xmid + down(swiglu(gate(ln2), up(ln2))), mlp_rows_ tokens at a time through the one-tile
// gate/up/h buffers.
void LlamaModel::mlp_fwd_tiled(const Acts& a, const Tensor& next, int64_t l, int64_t n, bool train, uint64_t seed) {
  for (int64_t t0 = 0; t0 < n; t0 += mlp_rows_) {
    const int64_t m = std::min(mlp_rows_, n - t0);
    const Tensor h = mlp_tile_fwd(a, l, t0, m, train, seed).h;
    const Tensor out = row_slice(next, t0, m);
    mlp_out_fwd(a, out, h, l, t0, train, seed);
    be_.add({.y = out, .x = row_slice(a.xmid, t0, m), .n = out.numel()});
  }
}

// The MLP's backward a tile at a time: each tile's gate, up and activation (and down_proj's LoRA
// intermediate) are recomputed from ln2, then back-propagated into that tile's rows of ws.dln;
// the LoRA gradients accumulate over the tiles.
void LlamaModel::mlp_bwd_tiled(const Acts& a, int64_t l, int64_t n, uint64_t seed) {
  const StepViews& w = *views_;
  const LayerViews& L = layers_[size_t(l)];
  const int64_t F = cfg_.intermediate_size, C = cfg_.hidden_size;
  for (int64_t t0 = 0; t0 < n; t0 += mlp_rows_) {
    const int64_t m = std::min(mlp_rows_, n - t0);
    const auto [ln2, gate, up, h] = mlp_tile_fwd(a, l, t0, m, true, seed);
    const Tensor dh = as_matrix(w.tmp, m, F), dgate = with_rows(w.dgate, m), dup = with_rows(w.dup, m);
    const Tensor dln = row_slice(with_rows(w.dln, n), t0, m);
    Tensor dy = row_slice(with_rows(w.dres, n), t0, m);  // d(down_proj's output)
    if (cfg_.sandwich_norms) {
      // The tile's down_proj output and its norm are recomputed (the norm's output into dln's rows,
      // which the gate/up backward overwrites); d(down output) goes to those rows of dln.
      mlp_out_fwd(a, dln, h, l, t0, true, seed);
      be_.rmsnorm_bwd({.dx = dln, .dw = Tensor(), .dout = dy, .x = with_rows(a.mlp_out, m), .w = L.post_ff_w,
                       .rstd = row_slice(a.rstd_pf, t0, m), .n = m, .c = C, .w_offset = norm_offset()});
      dy = dln;
    } else if (lora_index(l, D) >= 0) {
      lora_h_fwd(h, l, D, a, true, seed, t0);
    }
    linear_bwd(dh, false, dy, h, l, D, a, seed, true, t0);  // dh = ; dA,dB +=
    be_.swiglu_bwd({.dgate = dgate, .dup = dup, .dout = dh, .gate = gate, .up = up, .n = m * F, .act = cfg_.hidden_act,
                    .clamp = cfg_.swiglu_clamp});  // dgate, dup =
    linear_bwd(dln, false, dgate, ln2, l, G, a, seed, true, t0);                                  // dln =
    linear_bwd(dln, true, dup, ln2, l, U, a, seed, true, t0);                                     // dln +=
  }
}

Tensor LlamaModel::expert_weight(int64_t l, int k, int64_t e, int slot) const {
  const auto [out, in] = expert_shape(cfg_, expert_kinds()[size_t(k)]);
  if (quantized_experts_) {  // slot: gate, up, down, each F x C
    Tensor w = views_->expert_dequant;
    w.data = static_cast<char*>(w.data) + (slot * views_->expert_dequant.dim(1) + k * out * in) * dtype_size(w.dtype);
    return as_matrix(w, out, in);
  }
  Tensor w = layers_[size_t(l)].experts[k];
  w.data = static_cast<char*>(w.data) + e * out * in * dtype_size(w.dtype);
  return as_matrix(w, out, in);
}

void LlamaModel::prepare_expert(int64_t l, int64_t e, int slot, bool ahead) {
  if (!quantized_experts_) return;
  for (int k = 0; k < 3; k++) {
    const std::string& kind = expert_kinds()[size_t(k)];
    const auto [out, in] = expert_shape(cfg_, kind);
    const uint8_t* src = layers_[size_t(l)].experts_packed[k] + e * expert_stride_bytes(cfg_, kind, expert_quant_);
    DequantizeArgs d{expert_weight(l, k, e, slot), src, expert_quant_, out, in};
    d.prefetch = ahead;
    be_.dequantize(d);
  }
}

void LlamaModel::for_each_routed_expert(int64_t l, const std::vector<int32_t>& off,
                                        const std::function<void(int64_t, int64_t, int64_t, int)>& f) {
  std::vector<int64_t> active;
  for (size_t e = 0; e + 1 < off.size(); e++)
    if (off[e + 1] > off[e]) active.push_back(int64_t(e));
  if (!active.empty()) prepare_expert(l, active[0], 0, false);
  for (size_t i = 0; i < active.size(); i++) {
    const int slot = int(i % 2);
    if (i + 1 < active.size()) prepare_expert(l, active[i + 1], 1 - slot, true);
    const int64_t e = active[i];
    f(e, off[size_t(e)], off[size_t(e) + 1] - off[size_t(e)], slot);
  }
}

const std::vector<int32_t>& LlamaModel::expert_offsets(const Acts& a) {
  offsets_host_.resize(size_t(cfg_.n_experts + 1));
  be_.copy_to_host(offsets_host_.data(), a.moe_offsets.data, offsets_host_.size() * 4);
  return offsets_host_;
}

// out = sum_j weight[t,j] * expert_{e_j}(ln2[t]), expert(x) = down(act(gate x) * up x): the router's
// logits, the top-k routing, the tokens gathered into the expert-sorted layout (each expert's rows
// together), one GEMM per expert and weight over its rows, and the weighted sum back per token.
void LlamaModel::moe_fwd(const Acts& a, const Tensor& out, int64_t l, int64_t n, bool count) {
  const LayerViews& L = layers_[size_t(l)];
  const int64_t E = cfg_.n_experts, K = cfg_.experts_per_tok, C = cfg_.hidden_size, F = cfg_.expert_intermediate_size;
  const int64_t M = n * K;
  be_.matmul({.c = a.moe_logits, .a = a.ln2, .b = L.router, .m = n, .n = E, .k = C, .trans_a = false, .trans_b = true,
              .alpha = 1.0f, .beta = 0.0f});  // logits = ln2 Wr^T  (N,E)
  if (L.router_bias.data) be_.bias_add({.y = a.moe_logits, .bias = L.router_bias, .n = n, .m = E});  // (+ b: gpt-oss)
  be_.moe_route_fwd({.logits = a.moe_logits, .expert = a.moe_expert, .weight = a.moe_weight, .row = a.moe_row,
                     .token = a.moe_token, .row_weight = a.moe_row_weight, .offsets = a.moe_offsets, .n = n,
                     .n_experts = E, .top_k = K, .norm_topk = cfg_.norm_topk_prob});
  const auto* token = static_cast<const int32_t*>(a.moe_token.data);
  be_.gather_rows({.dst = a.moe_x, .src = a.ln2, .scale = Tensor(), .index = token, .m = M, .c = C});  // x_s[r] = ln2[token[r]]
  const std::vector<int32_t>& off = expert_offsets(a);
  if (count)
    for (int64_t e = 0; e < E; e++) routed_[size_t(l * E + e)] += off[size_t(e) + 1] - off[size_t(e)];
  if (count && aux_on_) {  // the load-balancing loss's statistics, summed over the layers
    const Tensor& stats = views_->router_stats;  // (2,E): probability sums, choice counts
    be_.moe_router_stats({.prob_sum = row_slice(stats, 0, 1), .count = row_slice(stats, 1, 1), .logits = a.moe_logits,
                          .expert = a.moe_expert, .mask = with_rows(views_->batch_mask, n), .n = n,
                          .n_experts = E, .top_k = K});
  }
  // The experts' adapters (LoRA on gate_up_proj and down_proj): expert e's rows of A and B.
  const int gu = adapters_on_ ? expert_lora_[size_t(l * 2)] : -1, dn = adapters_on_ ? expert_lora_[size_t(l * 2 + 1)] : -1;
  const int64_t r = lora_.r;
  const float s = lora_.scale();
  // Each expert with rows, over them: gate, up, the activation, down (each plus s (x A_e^T) B_e^T).
  for_each_routed_expert(l, off, [&](int64_t e, int64_t r0, int64_t m, int slot) {
    const Tensor x = row_slice(a.moe_x, r0, m), gate = row_slice(a.gate, r0, m), up = row_slice(a.up, r0, m);
    const Tensor h = row_slice(a.h, r0, m), y = row_slice(a.moe_y, r0, m);
    be_.matmul({.c = gate, .a = x, .b = expert_weight(l, 0, e, slot), .m = m, .n = F, .k = C, .trans_a = false,
                .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
    be_.matmul({.c = up, .a = x, .b = expert_weight(l, 1, e, slot), .m = m, .n = F, .k = C, .trans_a = false,
                .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
    if (cfg_.moe_biases) {  // expert e's rows of the output biases (gpt-oss)
      be_.bias_add({.y = gate, .bias = row_slice(L.expert_bias[0], e, 1), .n = m, .m = F});
      be_.bias_add({.y = up, .bias = row_slice(L.expert_bias[1], e, 1), .n = m, .m = F});
    }
    if (gu >= 0) {  // one A for both; B's first F rows are gate's, the next F up's
      const Tensor xa = row_slice(a.moe_lora_h[0], r0, m), B = lora_pair(gu).B.w;
      be_.matmul({.c = xa, .a = x, .b = row_slice(lora_pair(gu).A.w, e * r, r), .m = m, .n = r, .k = C,
                  .trans_a = false, .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
      be_.matmul({.c = gate, .a = xa, .b = row_slice(B, 2 * e * F, F), .m = m, .n = F, .k = r, .trans_a = false,
                  .trans_b = true, .alpha = s, .beta = 1.0f});
      be_.matmul({.c = up, .a = xa, .b = row_slice(B, 2 * e * F + F, F), .m = m, .n = F, .k = r, .trans_a = false,
                  .trans_b = true, .alpha = s, .beta = 1.0f});
    }
    be_.swiglu_fwd({.out = h, .gate = gate, .up = up, .n = m * F, .act = cfg_.hidden_act, .clamp = cfg_.swiglu_clamp});
    be_.matmul({.c = y, .a = h, .b = expert_weight(l, 2, e, slot), .m = m, .n = C, .k = F, .trans_a = false,
                .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
    if (cfg_.moe_biases) be_.bias_add({.y = y, .bias = row_slice(L.expert_bias[2], e, 1), .n = m, .m = C});  // weighted with the rest
    if (dn >= 0) {
      const Tensor ha = row_slice(a.moe_lora_h[1], r0, m);
      be_.matmul({.c = ha, .a = h, .b = row_slice(lora_pair(dn).A.w, e * r, r), .m = m, .n = r, .k = F,
                  .trans_a = false, .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
      be_.matmul({.c = y, .a = ha, .b = row_slice(lora_pair(dn).B.w, e * C, C), .m = m, .n = C, .k = r,
                  .trans_a = false, .trans_b = true, .alpha = s, .beta = 1.0f});
    }
  });
  be_.combine_rows({.out = out, .src = a.moe_y, .weight = a.moe_weight,
                    .row = static_cast<const int32_t*>(a.moe_row.data), .n = n, .k = K, .c = C, .accumulate = false});
}

// d(out) in ws.dres; ws.dln "=" d(ln2): through each expert (dweight-scaled rows, back through
// down, the activation, gate and up, summed per token) plus the router's path (the routing
// weights' gradient d w[t,j] = d out[t] . y[row[t,j]] through the softmax into the logits, times Wr).
void LlamaModel::moe_bwd(const Acts& a, int64_t l, int64_t n) {
  const LayerViews& L = layers_[size_t(l)];
  const StepViews& w = *views_;
  const int64_t E = cfg_.n_experts, K = cfg_.experts_per_tok, C = cfg_.hidden_size, F = cfg_.expert_intermediate_size;
  const int64_t M = n * K;
  const Tensor dres = with_rows(w.dres, n), dln = with_rows(w.dln, n);
  const auto* row = static_cast<const int32_t*>(a.moe_row.data);
  const Tensor dw = as_matrix(w.moe_dw, n, K), dy = as_matrix(w.moe_dy, M, C);
  be_.row_dots({.out = dw, .a = dres, .b = a.moe_y, .row = row, .n = n, .k = K, .c = C});  // dw[t,j] = dout[t] . y[row[t,j]]
  be_.gather_rows({.dst = dy, .src = dres, .scale = a.moe_row_weight,
                   .index = static_cast<const int32_t*>(a.moe_token.data), .m = M, .c = C});  // dy = w dout
  const Tensor dh = as_matrix(w.tmp, M, F), dgate = as_matrix(w.dgate, M, F), dup = as_matrix(w.dup, M, F);
  const Tensor dx = dy;  // d(expert inputs), over each expert's rows of dy once they are read
  const std::vector<int32_t>& off = expert_offsets(a);
  // The experts' adapters: dB_e += s dy^T (x A_e^T), dd = s dy B_e, dA_e += dd^T x, dx += dd A_e.
  const int gu = expert_lora_[size_t(l * 2)], dn = expert_lora_[size_t(l * 2 + 1)];
  const int64_t r = lora_.r;
  const float s = lora_.scale();
  // Each expert with rows, over them: down, the activation, gate and up.
  for_each_routed_expert(l, off, [&](int64_t e, int64_t r0, int64_t m, int slot) {
    const Tensor dh_e = row_slice(dh, r0, m), dg = row_slice(dgate, r0, m), du = row_slice(dup, r0, m);
    const Tensor dy_e = row_slice(dy, r0, m);
    be_.matmul({.c = dh_e, .a = dy_e, .b = expert_weight(l, 2, e, slot), .m = m, .n = F, .k = C, .trans_a = false,
                .trans_b = false, .alpha = 1.0f, .beta = 0.0f});
    if (dn >= 0) {  // before dy's rows are overwritten by dx below
      const auto& [A, B] = lora_pair(dn);
      const Tensor ha = row_slice(a.moe_lora_h[1], r0, m), dd = row_slice(w.moe_lora_dh, r0, m);
      be_.matmul({.c = row_slice(B.g, e * C, C), .a = dy_e, .b = ha, .m = C, .n = r, .k = m, .trans_a = true,
                  .trans_b = false, .alpha = s, .beta = 1.0f});  // dB_e += s dy^T ha
      be_.matmul({.c = dd, .a = dy_e, .b = row_slice(B.w, e * C, C), .m = m, .n = r, .k = C, .trans_a = false,
                  .trans_b = false, .alpha = s, .beta = 0.0f});  // dd = s dy B_e
      be_.matmul({.c = row_slice(A.g, e * r, r), .a = dd, .b = row_slice(a.h, r0, m), .m = r, .n = F, .k = m,
                  .trans_a = true, .trans_b = false, .alpha = 1.0f, .beta = 1.0f});  // dA_e += dd^T h
      be_.matmul({.c = dh_e, .a = dd, .b = row_slice(A.w, e * r, r), .m = m, .n = F, .k = r, .trans_a = false,
                  .trans_b = false, .alpha = 1.0f, .beta = 1.0f});  // dh += dd A_e
    }
    be_.swiglu_bwd({.dgate = dg, .dup = du, .dout = dh_e, .gate = row_slice(a.gate, r0, m),
                    .up = row_slice(a.up, r0, m), .n = m * F, .act = cfg_.hidden_act, .clamp = cfg_.swiglu_clamp});
    const Tensor d = row_slice(dx, r0, m);
    be_.matmul({.c = d, .a = dg, .b = expert_weight(l, 0, e, slot), .m = m, .n = C, .k = F, .trans_a = false,
                .trans_b = false, .alpha = 1.0f, .beta = 0.0f});
    be_.matmul({.c = d, .a = du, .b = expert_weight(l, 1, e, slot), .m = m, .n = C, .k = F, .trans_a = false,
                .trans_b = false, .alpha = 1.0f, .beta = 1.0f});
    if (gu >= 0) {  // gate's and up's rows of B share one A
      const auto& [A, B] = lora_pair(gu);
      const Tensor xa = row_slice(a.moe_lora_h[0], r0, m), dd = row_slice(w.moe_lora_dh, r0, m);
      be_.matmul({.c = row_slice(B.g, 2 * e * F, F), .a = dg, .b = xa, .m = F, .n = r, .k = m, .trans_a = true,
                  .trans_b = false, .alpha = s, .beta = 1.0f});  // dBg_e += s dg^T xa
      be_.matmul({.c = row_slice(B.g, 2 * e * F + F, F), .a = du, .b = xa, .m = F, .n = r, .k = m, .trans_a = true,
                  .trans_b = false, .alpha = s, .beta = 1.0f});  // dBu_e += s du^T xa
      be_.matmul({.c = dd, .a = dg, .b = row_slice(B.w, 2 * e * F, F), .m = m, .n = r, .k = F, .trans_a = false,
                  .trans_b = false, .alpha = s, .beta = 0.0f});  // dd = s (dg Bg_e
      be_.matmul({.c = dd, .a = du, .b = row_slice(B.w, 2 * e * F + F, F), .m = m, .n = r, .k = F, .trans_a = false,
                  .trans_b = false, .alpha = s, .beta = 1.0f}); //      + du Bu_e)
      be_.matmul({.c = row_slice(A.g, e * r, r), .a = dd, .b = row_slice(a.moe_x, r0, m), .m = r, .n = C, .k = m,
                  .trans_a = true, .trans_b = false, .alpha = 1.0f, .beta = 1.0f});  // dA_e += dd^T x
      be_.matmul({.c = d, .a = dd, .b = row_slice(A.w, e * r, r), .m = m, .n = C, .k = r, .trans_a = false,
                  .trans_b = false, .alpha = 1.0f, .beta = 1.0f});  // dx += dd A_e
    }
  });
  be_.combine_rows({.out = dln, .src = dx, .weight = Tensor(), .row = row, .n = n, .k = K, .c = C, .accumulate = false});  // dln = sum_j dx[row[t,j]]
  const Tensor dlogits = as_matrix(w.moe_dlogits, n, E);
  MoeRouteBwdArgs rb{.dlogits = dlogits, .dweight = dw, .logits = a.moe_logits, .expert = a.moe_expert, .n = n,
                     .n_experts = E, .top_k = K, .norm_topk = cfg_.norm_topk_prob};
  if (aux_on_) rb.aux_grad = views_->aux_grad, rb.mask = with_rows(views_->batch_mask, n);
  be_.moe_route_bwd(rb);
  be_.matmul({.c = dln, .a = dlogits, .b = L.router, .m = n, .n = C, .k = E, .trans_a = false, .trans_b = false,
              .alpha = 1.0f, .beta = 1.0f});  // dln += dlogits Wr
}

// On entry ws.dres holds d(layer output); on exit d(layer input).
void LlamaModel::layer_bwd(int64_t l, int64_t n, uint64_t seed) {
  if (ckpt_) layer_fwd(l, n, true, seed, true);  // recompute this layer's activations from its saved input
  const Acts a = acts(l, n);
  const LayerViews& L = layers_[size_t(l)];
  const StepViews& w = *views_;
  const int64_t C = cfg_.hidden_size, F = cfg_.intermediate_size;
  Tensor dres = with_rows(w.dres, n), dln = with_rows(w.dln, n);
  Tensor tmp_f = as_matrix(w.tmp, n, F), tmp_c = as_matrix(w.tmp, n, C);
  Tensor dgate = with_rows(w.dgate, n), dup = with_rows(w.dup, n);
  const Tensor inv_freq = L.inv_freq;
  const float w_off = norm_offset();

  // MLP: out = xmid + [norm](down(act(gate(ln2)) * up(ln2))), ln2 = rmsnorm(xmid)
  if (cfg_.moe()) {
    moe_bwd(a, l, n);  // dln =
  } else if (n > mlp_rows_) {
    mlp_bwd_tiled(a, l, n, seed);
  } else {
    Tensor dy = dres;  // d(down_proj's output): through the post-MLP norm into dln (free until gate/up's backward)
    if (cfg_.sandwich_norms) {
      be_.rmsnorm_bwd({.dx = dln, .dw = Tensor(), .dout = dres, .x = a.mlp_out, .w = L.post_ff_w, .rstd = a.rstd_pf,
                       .n = n, .c = C, .w_offset = w_off});
      dy = dln;
    }
    linear_bwd(tmp_f, false, dy, a.h, l, D, a, seed);                       // dh = ; dA,dB +=
    be_.swiglu_bwd({.dgate = dgate, .dup = dup, .dout = tmp_f, .gate = a.gate, .up = a.up, .n = n * F,
                    .act = cfg_.hidden_act});  // dgate, dup =
    linear_bwd(dln, false, dgate, a.ln2, l, G, a, seed);                    // dln =
    linear_bwd(dln, true, dup, a.ln2, l, U, a, seed);                       // dln +=
  }
  be_.rmsnorm_bwd({.dx = tmp_c, .dw = Tensor(), .dout = dln, .x = a.xmid, .w = L.ln2_w, .rstd = a.rstd2, .n = n, .c = C,
                   .w_offset = w_off});
  be_.add({.y = dres, .x = tmp_c, .n = n * C});  // dres = d xmid

  // Attention: xmid = x + [norm](o(attn(rope(q(ln1)), rope(k(ln1)), v(ln1)))), ln1 = rmsnorm(x)
  Tensor datt = with_rows(w.datt, n), dq = with_rows(w.dq, n), dk = with_rows(w.dk, n), dv = with_rows(w.dv, n);
  Tensor d_o = dres;  // d(o_proj's output): through the post-attention norm into dln (free again)
  if (cfg_.sandwich_norms) {
    be_.rmsnorm_bwd({.dx = dln, .dw = Tensor(), .dout = dres, .x = a.attn_out, .w = L.post_attn_w, .rstd = a.rstd_pa,
                     .n = n, .c = C, .w_offset = w_off});
    d_o = dln;
  }
  linear_bwd(datt, false, d_o, a.att, l, O, a, seed);                       // datt =
  const float scale = cfg_.attn_scale();
  be_.attention_bwd({.dq = dq, .dk = dk, .dv = dv, .dout = datt, .q = a.q, .k = a.k, .v = a.v, .out = a.att,
                     .lse = a.lse, .seg = d_seg_, .b = cur_b_, .t = cur_t_, .n_head = cfg_.n_head,
                     .n_head_kv = cfg_.n_head_kv, .head_dim = cfg_.head_dim, .scale = scale, .n_docs = n_docs_,
                     .window = cfg_.window_of(l), .softcap = float(cfg_.attn_logit_softcapping),
                     .sinks = L.sinks.data != nullptr, .dq_mode = opts_.attn_dq});  // dq, dk, dv =
  be_.rope_bwd({.x = dq, .inv_freq = inv_freq, .positions = d_positions_, .n = n, .n_head = cfg_.n_head,
                .head_dim = cfg_.head_dim, .rotary_dim = cfg_.rope_dim(), .scale = rope_scale_});
  be_.rope_bwd({.x = dk, .inv_freq = inv_freq, .positions = d_positions_, .n = n, .n_head = cfg_.n_head_kv,
                .head_dim = cfg_.head_dim, .rotary_dim = cfg_.rope_dim(), .scale = rope_scale_});
  // The first layer's input is the frozen embedding: nothing needs its gradient, so layer 0
  // computes only the LoRA gradients of q, k, v (no dgrad GEMMs, no input-norm backward).
  const bool dx = l > 0;
  // qk_norm: back through the per-head norms (frozen weights) into ws.datt, free since
  // attention_bwd; q's gradient is consumed by its projection before k's overwrites it.
  const int64_t hd = cfg_.head_dim, hq = n * cfg_.n_head, hk = n * cfg_.n_head_kv;
  auto through_norm = [&](Tensor& d, const Tensor& raw, const Tensor& w_norm, const Tensor& rstd, int64_t rows, int64_t cols) {
    if (!cfg_.qk_norm) return;
    const Tensor d_raw = as_matrix(w.datt, n, cols);
    be_.rmsnorm_bwd({.dx = as_matrix(d_raw, rows, hd), .dw = Tensor(), .dout = as_matrix(d, rows, hd),
                     .x = as_matrix(raw, rows, hd), .w = w_norm, .rstd = rstd, .n = rows, .c = hd, .w_offset = w_off});  // d_raw =
    d = d_raw;
  };
  through_norm(dq, a.q_raw, L.q_norm_w, a.rstd_q, hq, cfg_.q_dim());
  linear_bwd(dln, false, dq, a.ln1, l, Q, a, seed, dx);                     // dln =
  through_norm(dk, a.k_raw, L.k_norm_w, a.rstd_k, hk, cfg_.kv_dim());
  linear_bwd(dln, true, dk, a.ln1, l, K, a, seed, dx);                      // dln +=
  linear_bwd(dln, true, dv, a.ln1, l, V, a, seed, dx);                      // dln +=
  if (!dx) return;
  be_.rmsnorm_bwd({.dx = tmp_c, .dw = Tensor(), .dout = dln, .x = a.x, .w = L.ln1_w, .rstd = a.rstd1, .n = n, .c = C,
                   .w_offset = w_off});
  be_.add({.y = dres, .x = tmp_c, .n = n * C});  // dres = d x
}

// Final norm, LM head and cross-entropy, one chunk of tokens at a time. Returns the summed loss.
// With backward, leaves d(final_x) in ws.dres. When some positions carry no label, their rows
// are left out: the labeled rows of final_ln are gathered into ws.tmp (the embedding op on a
// table of n rows), run through the head in chunks, and their gradient rows scattered back into
// ws.dln (which is zero elsewhere, as the loss does not depend on those positions).
double LlamaModel::head_and_loss(int64_t n, bool backward, float grad_scale, const RowWeightFn* weigh,
                                 std::vector<float>* row_losses) {
  const int64_t C = cfg_.hidden_size, Vv = cfg_.vocab_size;
  const StepViews& w = *views_;
  Tensor fx = with_rows(w.final_x, n), fln = with_rows(w.final_ln, n), frstd = with_rows(w.final_rstd, n);
  Tensor norm_w = w.norm;
  be_.rmsnorm_fwd({.out = fln, .rstd = frstd, .x = fx, .w = norm_w, .n = n, .c = C, .eps = float(cfg_.rms_norm_eps),
                   .w_offset = norm_offset()});
  Tensor head = w.head;
  Tensor chunk_buf = w.chunk;
  Tensor losses = w.losses;
  Tensor dln = with_rows(w.dln, n);
  const bool subset = d_label_rows_ != nullptr;
  const int64_t m_rows = subset ? n_labeled_ : n;     // rows the head runs on
  const int32_t* targets = subset ? d_label_targets_ : d_targets_;
  Tensor xs = fln, ds = dln;                           // (m_rows, C) head input and its gradient
  if (subset) {
    xs = as_matrix(w.tmp, m_rows, C);  // free until the layers' backward
    be_.embedding_fwd({.out = xs, .table = fln, .tokens = d_label_rows_, .n = m_rows, .c = C, .vocab = n});
    ds = xs;  // each chunk's gradient overwrites the rows it has just read
  }
  const int64_t chunk = chunk_buf.dim(0), es = dtype_size(fln.dtype);
  for (int64_t c0 = 0; c0 < m_rows; c0 += chunk) {
    const int64_t m = std::min(chunk, m_rows - c0);
    Tensor x = as_matrix(xs, m, C);
    x.data = static_cast<char*>(xs.data) + c0 * C * es;
    Tensor logits = as_matrix(chunk_buf, m, Vv);
    be_.matmul({.c = logits, .a = x, .b = head, .m = m, .n = Vv, .k = C, .trans_a = false, .trans_b = true,
                .alpha = 1.0f, .beta = 0.0f});
    Tensor l = losses;
    l.ndim = 1;
    l.shape = {m, 0, 0, 0};
    l.data = static_cast<float*>(losses.data) + c0;
    be_.cross_entropy_fwd_bwd(
        {logits, logits, l, targets + c0, m, Vv, weigh ? 1.0f : grad_scale, float(cfg_.final_logit_softcapping)});
    if (backward) {
      // The head's dgrad is interleaved with its forward chunk by chunk: timed apart, as backward.
      const double t0 = times_ ? synced_now() : 0.0;
      Tensor d = as_matrix(ds, m, C);
      d.data = static_cast<char*>(ds.data) + c0 * C * es;
      be_.matmul({.c = d, .a = logits, .b = head, .m = m, .n = C, .k = Vv, .trans_a = false, .trans_b = false,
                  .alpha = 1.0f, .beta = 0.0f});  // d[chunk] = dlogits W
      if (times_) head_bwd_s_ += synced_now() - t0;
    }
  }
  std::vector<float> row_loss(static_cast<size_t>(m_rows));
  if (m_rows > 0) be_.copy_to_host(row_loss.data(), losses.data, size_t(m_rows) * 4);
  double sum = 0;
  for (float v : row_loss) sum += v;
  if (backward && weigh) {
    // Each row of ds is its token's unit gradient; runs of equal weight are scaled together.
    const std::vector<float> wt = (*weigh)(row_loss);
    if (int64_t(wt.size()) != m_rows)
      fail(ErrorKind::Internal, "forward_backward_weighted",
           std::to_string(wt.size()) + " weights for " + std::to_string(m_rows) + " labeled positions");
    for (int64_t r0 = 0; r0 < m_rows;) {
      int64_t r1 = r0 + 1;
      while (r1 < m_rows && wt[size_t(r1)] == wt[size_t(r0)]) r1++;
      if (wt[size_t(r0)] != 1.0f) {
        Tensor d = as_matrix(ds, r1 - r0, C);
        d.data = static_cast<char*>(ds.data) + r0 * C * es;
        be_.scale({.x = d, .n = (r1 - r0) * C, .s = wt[size_t(r0)]});
      }
      r0 = r1;
    }
  }
  if (row_losses) *row_losses = std::move(row_loss);
  if (backward) {
    const double t0 = times_ ? synced_now() : 0.0;
    if (subset) {
      be_.memset0(dln.data, size_t(n * C * es));
      be_.embedding_bwd({.dtable = dln, .dout = ds, .tokens = d_label_rows_, .n = m_rows, .c = C, .vocab = n});  // dln[rows] += d
    }
    be_.rmsnorm_bwd({.dx = with_rows(w.dres, n), .dw = Tensor(), .dout = dln, .x = fx, .w = norm_w, .rstd = frstd,
                     .n = n, .c = C, .w_offset = norm_offset()});  // dres =
    if (times_) head_bwd_s_ += synced_now() - t0;
  }
  return sum;
}

void LlamaModel::forward(const Batch& batch, bool train, uint64_t seed) {
  upload_batch(batch);
  const int64_t n = batch.n();
  const Tensor x0 = with_rows(layers_[0].a.x, n);
  be_.embedding_fwd({.out = x0, .table = views_->embed, .tokens = d_tokens_, .n = n, .c = cfg_.hidden_size,
                     .vocab = cfg_.vocab_size});
  if (cfg_.scale_embeddings) be_.scale({.x = x0, .n = x0.numel(), .s = embed_scale()});
  const int64_t x_bytes = n * cfg_.hidden_size * dtype_size(layers_[0].a.x.dtype);
  for (int64_t l = 0; l < cfg_.n_layer; l++) {
    if (opts_.gemm_dtype == GemmDtype::Bf16) {  // fp8/fp4 base GEMMs read the stored weights: nothing to dequantize
      prepare_layer(l, false);
      prepare_layer(l + 1, true);  // the next layer's weights while this one computes
    } else {  // fsdp: the stored fp8 weights are gathered all the same
      gather_layer(l);
      gather_layer(l + 1);
    }
    if (offload_) {
      // This layer's input goes to the host while the layer computes; the copy of the previous
      // layer's input must be done before this layer writes its output over that slot.
      if (train && l < int64_t(host_x_.size()))
        be_.offload_copy({.dst = host_x_[size_t(l)], .src = layers_[size_t(l)].a.x.data, .bytes = x_bytes,
                          .to_host = true});
      be_.offload_wait({.p = layers_[size_t(l)].next.data, .bytes = x_bytes});
    }
    layer_fwd(l, n, train, seed);
  }
}

double LlamaModel::synced_now() {
  be_.synchronize();  // kernels run asynchronously on CUDA: wait for them before reading the clock
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double LlamaModel::forward_backward(const Batch& batch, float grad_scale, uint64_t seed, double aux_weight) {
  return step_with(batch, grad_scale, nullptr, seed, aux_weight);
}

double LlamaModel::forward_backward_weighted(const Batch& batch, const RowWeightFn& weigh, uint64_t seed) {
  if (cfg_.router_aux_loss_coef > 0)
    fail(ErrorKind::Unsupported, "output_router_logits",
         "the router's load-balancing loss beside a preference objective is not implemented",
         "set output_router_logits to false in config.json");
  return step_with(batch, 1.0f, &weigh, seed, 0.0);
}

// transformers' load_balancing_loss_func over the forward's layers: with R = layers x counted
// tokens, f_e = count_e / R and P_e = prob_sum_e / R, aux = E sum_e f_e P_e. Its gradient in each
// counted token's p[t,e] (the counts are a choice: none) is coef * aux_weight * E * count_e / R^2.
void LlamaModel::router_aux_loss(double aux_weight) {
  const int64_t E = cfg_.n_experts;
  std::vector<float> stats(size_t(2 * E)), grad(size_t(E), 0.0f);
  be_.copy_to_host(stats.data(), views_->router_stats.data, stats.size() * 4);
  double counted = 0;
  for (int64_t e = 0; e < E; e++) counted += stats[size_t(E + e)];
  const double rows = counted / double(cfg_.experts_per_tok);  // layers x counted tokens
  aux_loss_ = 0;
  if (rows > 0) {
    for (int64_t e = 0; e < E; e++) aux_loss_ += double(stats[size_t(E + e)]) * double(stats[size_t(e)]);
    aux_loss_ *= double(E) / (rows * rows);
    for (int64_t e = 0; e < E; e++)
      grad[size_t(e)] = float(cfg_.router_aux_loss_coef * aux_weight * double(E) * double(stats[size_t(E + e)]) / (rows * rows));
    aux_sum_ += aux_loss_;
    aux_count_++;
  }
  be_.copy_to_device(views_->aux_grad.data, grad.data(), grad.size() * 4);
}

double LlamaModel::step_with(const Batch& batch, float grad_scale, const RowWeightFn* weigh, uint64_t seed,
                             double aux_weight) {
  if (!adapters_on_) fail(ErrorKind::Internal, "forward_backward", "the adapters are switched off: nothing to train");
  const double t0 = times_ ? synced_now() : 0.0;
  head_bwd_s_ = 0;
  aux_on_ = cfg_.router_aux_loss_coef > 0 && !weigh;
  aux_loss_ = 0;
  if (aux_on_) {  // zeroed statistics; the tokens that count (not the right padding)
    const int64_t E = cfg_.n_experts, n = batch.n();
    const std::vector<float> zero(size_t(2 * E), 0.0f);
    be_.copy_to_device(views_->router_stats.data, zero.data(), zero.size() * 4);
    std::vector<float> mask(size_t(n), 1.0f);
    for (int64_t r = 0; r < int64_t(batch.lens.size()); r++)
      for (int64_t t = batch.lens[size_t(r)]; t < batch.t; t++) mask[size_t(r * batch.t + t)] = 0.0f;
    be_.copy_to_device(views_->batch_mask.data, mask.data(), mask.size() * 4);
  }
  forward(batch, true, seed);
  if (aux_on_) router_aux_loss(aux_weight);
  const int64_t n = batch.n();
  const double loss = head_and_loss(n, true, grad_scale, weigh);
  const double t1 = times_ ? synced_now() : 0.0;
  const int64_t x_bytes = n * cfg_.hidden_size * dtype_size(layers_[0].a.x.dtype);
  for (int64_t l = cfg_.n_layer - 1; l >= 0; l--) {
    prepare_layer(l, false);
    prepare_layer(l - 1, true);
    if (offload_) {
      // The previous layer's input comes back into the other slot while this layer recomputes
      // and backpropagates (after this slot's last reader, the layer above); this layer's input
      // arrived during the layer above (the last two never left their slots).
      if (l >= 1 && l - 1 < int64_t(host_x_.size()))
        be_.offload_copy({.dst = layers_[size_t(l - 1)].a.x.data, .src = host_x_[size_t(l - 1)], .bytes = x_bytes,
                          .to_host = false});
      be_.offload_wait({.p = layers_[size_t(l)].a.x.data, .bytes = x_bytes});
    }
    layer_bwd(l, n, seed);
  }
  if (times_) {
    const double t2 = synced_now();
    times_->forward_s += t1 - t0 - head_bwd_s_;
    times_->backward_s += t2 - t1 + head_bwd_s_;
  }
  return loss;
}

double LlamaModel::forward_loss(const Batch& batch) {
  forward(batch, false, 0);
  return head_and_loss(batch.n(), false, 0.0f);
}

std::vector<float> LlamaModel::token_losses(const Batch& batch) {
  forward(batch, false, 0);
  std::vector<float> rows;
  head_and_loss(batch.n(), false, 0.0f, nullptr, &rows);
  return rows;
}

std::vector<float> LlamaModel::logits(const Batch& batch) {
  forward(batch, false, 0);
  const int64_t n = batch.n(), C = cfg_.hidden_size, Vv = cfg_.vocab_size;
  const StepViews& w = *views_;
  Tensor fx = with_rows(w.final_x, n), fln = with_rows(w.final_ln, n), frstd = with_rows(w.final_rstd, n);
  be_.rmsnorm_fwd({.out = fln, .rstd = frstd, .x = fx, .w = w.norm, .n = n, .c = C, .eps = float(cfg_.rms_norm_eps),
                   .w_offset = norm_offset()});
  Tensor head = w.head;
  Tensor chunk_buf = w.chunk;
  const int64_t chunk = chunk_buf.dim(0), es = dtype_size(fln.dtype);
  std::vector<float> out(size_t(n * Vv));
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t m = std::min(chunk, n - c0);
    Tensor x = as_matrix(fln, m, C);
    x.data = static_cast<char*>(fln.data) + c0 * C * es;
    Tensor lg = as_matrix(chunk_buf, m, Vv);
    be_.matmul({.c = lg, .a = x, .b = head, .m = m, .n = Vv, .k = C, .trans_a = false, .trans_b = true, .alpha = 1.0f,
                .beta = 0.0f});
    be_.copy_to_host(out.data() + c0 * Vv, lg.data, size_t(m * Vv) * 4);
  }
  softcap_logits(out);
  return out;
}

// Gemma 2's final_logit_softcapping on logits copied to the host (the loss applies it in the
// cross-entropy op), as transformers: logits / c, tanh, * c in f32.
void LlamaModel::softcap_logits(std::vector<float>& v) const {
  const float c = float(cfg_.final_logit_softcapping);
  if (c > 0)
    for (float& x : v) x = std::tanh(x / c) * c;
}

const std::vector<float>& LlamaModel::decode(const std::vector<int32_t>& ids) {
  const int64_t total = int64_t(ids.size()), C = cfg_.hidden_size, Vv = cfg_.vocab_size;
  if (total == 0) fail(ErrorKind::Data, "generate", "no tokens to feed", "the prompt encodes to no tokens");
  if (kv_capacity() == 0)
    fail(ErrorKind::Internal, "decode", "the model was planned without a KV cache", "set ModelPlanOptions::kv_cache_tokens");
  if (kv_pos_ + total > kv_capacity())
    fail(ErrorKind::Config, "generate",
         "a sequence of " + std::to_string(kv_pos_ + total) + " tokens does not fit the KV cache of " +
             std::to_string(kv_capacity()) + " positions",
         "shorten the prompt or lower the number of new tokens");
  // A long prompt goes through in chunks of seq_len rows, each attending to the cache before it.
  int64_t n = 0;
  for (int64_t c0 = 0; c0 < total; c0 += n) {
    n = std::min(opts_.seq_len, total - c0);
    Batch b;
    b.b = 1;
    b.t = n;
    b.tokens.assign(ids.begin() + c0, ids.begin() + c0 + n);
    b.positions.resize(size_t(n));
    for (int64_t i = 0; i < n; i++) b.positions[size_t(i)] = int32_t(kv_pos_ + i);
    decoding_ = true;
    try {
      forward(b, false, 0);
    } catch (...) {
      decoding_ = false;
      throw;
    }
    decoding_ = false;
    kv_pos_ += n;
  }
  // Final norm and LM head for the last token only: that is all generation reads.
  const StepViews& w = *views_;
  const int64_t es = dtype_size(w.final_x.dtype);
  Tensor x = as_matrix(w.final_x, 1, C), ln = as_matrix(w.final_ln, 1, C), rstd = with_rows(w.final_rstd, 1);
  x.data = static_cast<char*>(w.final_x.data) + (n - 1) * C * es;
  be_.rmsnorm_fwd({.out = ln, .rstd = rstd, .x = x, .w = w.norm, .n = 1, .c = C, .eps = float(cfg_.rms_norm_eps),
                   .w_offset = norm_offset()});
  Tensor lg = as_matrix(w.chunk, 1, Vv);
  be_.matmul({.c = lg, .a = ln, .b = w.head, .m = 1, .n = Vv, .k = C, .trans_a = false, .trans_b = true, .alpha = 1.0f,
              .beta = 0.0f});
  decode_logits_.resize(size_t(Vv));
  be_.copy_to_host(decode_logits_.data(), lg.data, size_t(Vv) * 4);
  softcap_logits(decode_logits_);
  return decode_logits_;
}

}  // namespace qlora
