// The decoder: built from the memory plan (its parts: model/base_weights.h, model/adapters.h,
// model/decoder_parts.h), and the step read top to bottom: the micro-batch uploaded, the forward
// over the layers, the head and loss, the backward over the layers in reverse. One layer's forward
// and backward: decoder_layer.cpp; the experts: decoder_moe.cpp; the head: decoder_head.cpp.
#include "model/decoder_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/host_memory.h"
#include "model/backend_plan.h"
#include "model/decoder_parts.h"
#include "model/engine_limits.h"
#include "model/gemm_dtype.h"

namespace qlora {

DecoderModel::DecoderModel(const LlamaConfig& cfg, Backend& be, const ModelPlanOptions& o, const LoraSpec& lora)
    : cfg_(cfg), be_(be), opts_(o) {
  cfg_.validate(cfg_.name);
  opts_.lora = lora;
  opts_.lora.targets = lora_targets_for(cfg_, lora.targets);  // in the model's modules (fused qkv_proj ...)
  opts_.compute_dtype = be_.compute_dtype();
  ckpt_ = recomputes(opts_.checkpointing);
  mlp_rows_ = mlp_rows(opts_, cfg_);
  {
    GemmCaps caps{be_.has_fp8_gemm(), be_.has_fp4_gemm(), "the " + be_.name() + " backend's device"};
    opts_.gemm_dtype = resolve_gemm_dtype(opts_, cfg_, caps);  // an Error(Config) before anything is allocated
  }
  // What the engine does not implement here, before anything is allocated or any step runs.
  if (const auto limits = engine_limits(cfg_, opts_, be_.device()); !limits.empty())
    fail(ErrorKind::Unsupported, limits[0].where, limits[0].what, limits[0].hint);
  moe_.routed.assign(size_t(cfg_.moe() ? cfg_.n_layer * cfg_.n_experts : 0), 0);
  offload_.on = opts_.checkpointing == Checkpointing::Offload;
  // On the CUDA backend the plan also holds the backend's own memory (workspace, op scratch).
  plan_engine_buffers(plan_, cfg_, opts_, be_.plans_own_memory() ? DeviceKind::Cuda : DeviceKind::Cpu);
  check_host_memory();
  arena_ = std::make_unique<Arena>(be_, plan_);
  base_ = std::make_unique<BaseWeights>(cfg_, be_, opts_, *arena_, plan_);
  adapters_ = std::make_unique<Adapters>(cfg_, opts_.lora, opts_, *arena_);
  std::vector<float> inv = rope_inv_freq(cfg_);  // LongRoPE: the short factors until a batch needs the long
  be_.copy_to_device(arena_->raw("rope.inv_freq"), inv.data(), inv.size() * 4);
  rope_.long_factors = false;
  rope_.scale = rope_attention_scale(cfg_);
  if (cfg_.rope_local_theta > 0) {
    inv = rope_local_inv_freq(cfg_);
    be_.copy_to_device(arena_->raw("rope.inv_freq_local"), inv.data(), inv.size() * 4);
  }
  resolve_views();
}

// The activations' and workspaces' views; the weights' are BaseWeights', the adapters' Adapters'.
void DecoderModel::resolve_views() {
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
  }
  // act.final_ln, or (the plan's choice) the first N x C values of ws.datt.
  v.final_ln = ar.has("act.final_ln") ? ar.get("act.final_ln") : as_matrix(v.datt, max_tokens(), cfg_.hidden_size);
  v.lora_dh = opt("ws.lora_dh");
  v.moe_lora_dh = opt("ws.moe_lora_dh");
  v.lora_xd = opt("ws.lora_xd");
  v.head = ar.get(cfg_.tie_word_embeddings ? "embed_tokens" : "lm_head");
  if (opts_.method == Method::Full) {
    v.embed_grad = ar.get("embed_tokens.grad");
    v.norm_grad = ar.get("norm.grad");
    v.head_grad = ar.get(cfg_.tie_word_embeddings ? "embed_tokens.grad" : "lm_head.grad");
    v.ones = opt("ws.ones");
    if (v.ones.data) {
      const std::vector<float> ones(size_t(v.ones.numel()), 1.0f);
      QLORA_ASSERT(v.ones.dtype == DType::F32);
      be_.copy_to_device(v.ones.data, ones.data(), ones.size() * 4);
    }
  }
  static const std::pair<Tensor StepViews::*, const char*> kBatch[] = {
      {&StepViews::batch_tokens, "batch.tokens"},         {&StepViews::batch_targets, "batch.targets"},
      {&StepViews::batch_positions, "batch.positions"},   {&StepViews::batch_seg, "batch.seg"},
      {&StepViews::batch_label_rows, "batch.label_rows"}, {&StepViews::batch_label_targets, "batch.label_targets"}};
  for (const auto& [member, name] : kBatch) v.*member = ar.get(name);
  v.router_stats = opt("moe.router_stats");
  v.aux_grad = opt("moe.aux_grad");
  v.batch_mask = opt("batch.mask");
  layers_.assign(size_t(cfg_.n_layer), LayerViews{});
  // A layer's input: its own buffer, or with offload the device slot of its parity.
  auto layer_input = [&](int64_t l) {
    return offload_.on ? ar.get("act.offload_slot." + std::to_string(l % 2))
                       : ar.get("act.layers." + std::to_string(l) + ".x");
  };
  offload_.host_x.clear();
  for (int64_t l = 0; offload_.on && l < cfg_.n_layer - 2; l++)
    offload_.host_x.push_back(ar.raw("act.layers." + std::to_string(l) + ".x"));
  for (int64_t l = 0; l < cfg_.n_layer; l++) {
    LayerViews& L = layers_[size_t(l)];
    const std::string ap = ckpt_ ? std::string("act.cur.") : "act.layers." + std::to_string(l) + ".";
    Acts& a = L.a;
    a.x = layer_input(l);
    for (const LayerActRow& row : kLayerActRows)
      if (has_act_feature(cfg_, row.feature)) a.*row.member = ar.get(ap + row.name);
    for (int k = 0; k < 2 && cfg_.moe(); k++)
      if (adapters_->expert_index(l, k) >= 0)
        a.moe_lora_h[k] = ar.get(ap + "experts." + expert_lora_kinds()[size_t(k)] + ".lora_h");
    for (int j = 0; j < 7; j++)  // one intermediate per module, shared by a fused module's projections
      if (adapters_->index(l, j) >= 0) a.lora_h[j] = ar.get(ap + adapters_->module(j) + ".lora_h");
    L.next = l + 1 < cfg_.n_layer ? layer_input(l + 1) : v.final_x;
    L.inv_freq = cfg_.local_rope(l) ? ar.get("rope.inv_freq_local") : v.inv_freq;
  }
  kv_.k.clear();
  kv_.v.clear();
  if (opts_.kv_cache_tokens > 0)
    for (int64_t l = 0; l < cfg_.n_layer; l++) {
      kv_.k.push_back(ar.get("kv.layers." + std::to_string(l) + ".k"));
      kv_.v.push_back(ar.get("kv.layers." + std::to_string(l) + ".v"));
    }
}

void DecoderModel::init_trainable(uint64_t seed) {
  if (!full()) return adapters_->init(be_, seed);
  for (auto& p : base_->params()) {
    be_.memset0(p.m.data, size_t(p.m.nbytes()));
    be_.memset0(p.v.data, size_t(p.v.nbytes()));
  }
  zero_grads();
}

void DecoderModel::zero_grads() {
  for (auto& p : trainable_params()) be_.memset0(p.g.data, size_t(p.g.nbytes()));
}

// The base and its sharding: BaseWeights' (model/base_weights.h).
void DecoderModel::load_base(const TensorSource& src) { base_->load(src, plan_); }
QuantizedTensor DecoderModel::base_quantized(int64_t l, const std::string& proj) {
  return base_->quantized_projection(l, proj);
}
std::vector<float> DecoderModel::weight_f32(const std::string& name) { return base_->float_tensor(name); }
void DecoderModel::set_base_comm(Comm& comm) { base_->set_comm(comm); }

DecoderModel::~DecoderModel() = default;

float DecoderModel::embed_scale() const {
  const float s = float(std::sqrt(double(cfg_.hidden_size)));
  return opts_.compute_dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(s)) : s;
}

// What the plan needs from the machine's memory: on a GPU the host buffers (offloaded layer
// inputs, pinned, so never swapped), on the CPU everything. More than MemAvailable is refused now,
// before anything is allocated, instead of failing (or being killed) during a step.
void DecoderModel::check_host_memory() const {
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

DecoderModel::Acts DecoderModel::acts(int64_t l, int64_t n) const {
  Acts a = layers_[size_t(l)].a;
  a.x = with_rows(a.x, n);
  // The MLP's rows: one tile, or a mixture of experts' one row per (token, choice).
  const int64_t tile_n = std::min(n, mlp_rows_), mlp_n = cfg_.moe() ? n * cfg_.experts_per_tok : tile_n;
  for (const LayerActRow& row : kLayerActRows)
    if (has_act_feature(cfg_, row.feature)) a.*row.member = layer_act_view(cfg_, row.shape, a.*row.member, n, mlp_n, tile_n);
  for (Tensor& t : a.lora_h)
    if (t.data) t = with_rows(t, n);
  return a;
}

DecoderModel::StepInputs DecoderModel::upload_batch(const Batch& batch, bool decoding) {
  StepInputs in;
  in.decoding = decoding;
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
  in.tokens = up(sv.batch_tokens, batch.tokens);
  in.targets = up(sv.batch_targets, batch.targets);
  in.positions = up(sv.batch_positions, batch.positions);
  // LongRoPE rotates a forward with the long factors when its positions pass the original
  // context (transformers: max(position_ids) + 1 > original_max_position_embeddings), else the short.
  if (cfg_.rope_scaling.type == "longrope" && !batch.positions.empty()) {
    const int64_t max_pos = *std::max_element(batch.positions.begin(), batch.positions.end());
    if (const bool want = rope_uses_long_factors(cfg_, max_pos); want != rope_.long_factors) {
      const std::vector<float> inv = rope_inv_freq(cfg_, want);
      be_.copy_to_device(sv.inv_freq.data, inv.data(), inv.size() * 4);
      rope_.long_factors = want;
    }
  }
  in.seg = up(sv.batch_seg, batch.seg);
  in.n_docs = 0;
  for (int64_t i = 0; i < int64_t(batch.seg.size()); i++)
    in.n_docs += i % batch.t == 0 || batch.seg[size_t(i)] != batch.seg[size_t(i - 1)];
  // The rows that carry a label: SFT batches train on the answers only, and the LM head, the
  // loss and its gradient are computed for those rows alone.
  std::vector<int32_t> rows_l, targets_l;
  for (int64_t i = 0; i < int64_t(batch.targets.size()); i++)
    if (batch.targets[size_t(i)] != -100) {
      rows_l.push_back(int32_t(i));
      targets_l.push_back(batch.targets[size_t(i)]);
    }
  in.n_labeled = batch.targets.empty() ? 0 : int64_t(rows_l.size());
  in.label_rows = in.label_targets = nullptr;
  if (in.n_labeled < n && in.n_labeled > 0) {
    void* r = sv.batch_label_rows.data;
    void* t = sv.batch_label_targets.data;
    be_.copy_to_device(r, rows_l.data(), rows_l.size() * 4);
    be_.copy_to_device(t, targets_l.data(), targets_l.size() * 4);
    in.label_rows = static_cast<const int32_t*>(r);
    in.label_targets = static_cast<const int32_t*>(t);
  }
  in.b = batch.b;
  in.t = batch.t;
  return in;
}

DecoderModel::StepInputs DecoderModel::forward(const Batch& batch, bool train, uint64_t seed, bool decoding) {
  const StepInputs in = upload_batch(batch, decoding);
  const int64_t n = batch.n();
  const Tensor x0 = with_rows(layers_[0].a.x, n);
  be_.embedding_fwd({.out = x0, .table = views_->embed, .tokens = in.tokens, .n = n, .c = cfg_.hidden_size,
                     .vocab = cfg_.vocab_size});
  if (cfg_.scale_embeddings) be_.scale({.x = x0, .n = x0.numel(), .s = embed_scale()});
  const int64_t x_bytes = n * cfg_.hidden_size * dtype_size(layers_[0].a.x.dtype);
  for (int64_t l = 0; l < cfg_.n_layer; l++) {
    if (opts_.gemm_dtype == GemmDtype::Bf16) {  // fp8/fp4 base GEMMs read the stored weights: nothing to dequantize
      base_->prepare(l, false);
      base_->prepare(l + 1, true);  // the next layer's weights while this one computes
    } else {  // fsdp: the stored fp8 weights are gathered all the same
      base_->gather(l);
      base_->gather(l + 1);
    }
    if (offload_.on) {
      // This layer's input goes to the host while the layer computes; the copy of the previous
      // layer's input must be done before this layer writes its output over that slot.
      if (train && l < int64_t(offload_.host_x.size()))
        be_.offload_copy({.dst = offload_.host_x[size_t(l)], .src = layers_[size_t(l)].a.x.data, .bytes = x_bytes,
                          .to_host = true});
      be_.offload_wait({.p = layers_[size_t(l)].next.data, .bytes = x_bytes});
    }
    layer_fwd(in, l, n, train, seed);
  }
  return in;
}

double DecoderModel::synced_now() {
  be_.synchronize();  // kernels run asynchronously on CUDA: wait for them before reading the clock
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double DecoderModel::forward_backward(const Batch& batch, float grad_scale, uint64_t seed, double aux_weight) {
  return step_with(batch, grad_scale, nullptr, seed, aux_weight);
}

double DecoderModel::forward_backward_weighted(const Batch& batch, const RowWeightFn& weigh, uint64_t seed) {
  if (cfg_.router_aux_loss_coef > 0)
    fail(ErrorKind::Unsupported, "output_router_logits",
         "the router's load-balancing loss beside a preference objective is not implemented",
         "set output_router_logits to false in config.json");
  return step_with(batch, 1.0f, &weigh, seed, 0.0);
}

double DecoderModel::step_with(const Batch& batch, float grad_scale, const RowWeightFn* weigh, uint64_t seed,
                             double aux_weight) {
  if (!full() && !adapters_->enabled())
    fail(ErrorKind::Internal, "forward_backward", "the adapters are switched off: nothing to train");
  if (full() && weigh)
    fail(ErrorKind::Unsupported, "finetuning_type full", "preference objectives with full fine-tuning are not implemented",
         "use finetuning_type: lora");
  const double t0 = timing_.times ? synced_now() : 0.0;
  timing_.head_bwd_s = 0;
  moe_.aux_on = cfg_.router_aux_loss_coef > 0 && !weigh;
  moe_.aux_loss = 0;
  if (moe_.aux_on) {  // zeroed statistics; the tokens that count (not the right padding)
    const int64_t E = cfg_.n_experts, n = batch.n();
    const std::vector<float> zero(size_t(2 * E), 0.0f);
    be_.copy_to_device(views_->router_stats.data, zero.data(), zero.size() * 4);
    std::vector<float> mask(size_t(n), 1.0f);
    for (int64_t r = 0; r < int64_t(batch.lens.size()); r++)
      for (int64_t t = batch.lens[size_t(r)]; t < batch.t; t++) mask[size_t(r * batch.t + t)] = 0.0f;
    be_.copy_to_device(views_->batch_mask.data, mask.data(), mask.size() * 4);
  }
  const StepInputs in = forward(batch, true, seed);
  if (moe_.aux_on) router_aux_loss(aux_weight);
  const int64_t n = batch.n();
  const double loss = head_and_loss(in, n, true, grad_scale, weigh);
  const double t1 = timing_.times ? synced_now() : 0.0;
  const int64_t x_bytes = n * cfg_.hidden_size * dtype_size(layers_[0].a.x.dtype);
  for (int64_t l = cfg_.n_layer - 1; l >= 0; l--) {
    base_->prepare(l, false);
    base_->prepare(l - 1, true);
    if (offload_.on) {
      // The previous layer's input comes back into the other slot while this layer recomputes
      // and backpropagates (after this slot's last reader, the layer above); this layer's input
      // arrived during the layer above (the last two never left their slots).
      if (l >= 1 && l - 1 < int64_t(offload_.host_x.size()))
        be_.offload_copy({.dst = layers_[size_t(l - 1)].a.x.data, .src = offload_.host_x[size_t(l - 1)], .bytes = x_bytes,
                          .to_host = false});
      be_.offload_wait({.p = layers_[size_t(l)].a.x.data, .bytes = x_bytes});
    }
    layer_bwd(in, l, n, seed);
  }
  if (views_->embed_grad.data) {  // full fine-tuning: ws.dres holds d(embedding output)
    const Tensor d0 = with_rows(views_->dres, n);
    if (cfg_.scale_embeddings) be_.scale({.x = d0, .n = d0.numel(), .s = embed_scale()});
    be_.embedding_bwd({.dtable = views_->embed_grad, .dout = d0, .tokens = in.tokens, .n = n, .c = cfg_.hidden_size,
                       .vocab = cfg_.vocab_size});  // d embed_tokens[tokens] +=
  }
  if (timing_.times) {
    const double t2 = synced_now();
    timing_.times->forward_s += t1 - t0 - timing_.head_bwd_s;
    timing_.times->backward_s += t2 - t1 + timing_.head_bwd_s;
  }
  return loss;
}

double DecoderModel::forward_loss(const Batch& batch) {
  return head_and_loss(forward(batch, false, 0), batch.n(), false, 0.0f);
}

std::vector<float> DecoderModel::token_losses(const Batch& batch) {
  std::vector<float> rows;
  head_and_loss(forward(batch, false, 0), batch.n(), false, 0.0f, nullptr, &rows);
  return rows;
}

}  // namespace qlora
