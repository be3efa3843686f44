// The engine's buffer list. Every buffer the model/trainer touches is named here; the Arena
// refuses names that are not planned, so this file and the engine cannot drift apart.
#include "model/model_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/comm.h"
#include "model/experts.h"
#include "model/layer_acts.h"
#include "model/quant_bytes.h"
#include "quant/fp4_gemm.h"

namespace qlora {

const std::vector<std::string>& all_linear_targets() {
  static const std::vector<std::string> t = {"q_proj", "k_proj", "v_proj", "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  return t;
}

std::pair<int64_t, int64_t> projection_shape(const LlamaConfig& c, const std::string& p) {
  if (p == "q_proj") return {c.q_dim(), c.hidden_size};
  if (p == "k_proj" || p == "v_proj") return {c.kv_dim(), c.hidden_size};
  if (p == "o_proj") return {c.hidden_size, c.q_dim()};
  if (p == "gate_proj" || p == "up_proj") return {c.intermediate_size, c.hidden_size};
  if (p == "down_proj") return {c.hidden_size, c.intermediate_size};
  if (p == "qkv_proj") return {c.q_dim() + 2 * c.kv_dim(), c.hidden_size};  // a fused LoRA module
  if (p == "gate_up_proj") return {2 * c.intermediate_size, c.hidden_size};
  fail(ErrorKind::Config, "target_modules", "unknown projection '" + p + "'");
}

LayerBaseBlob layer_base_blob(const LlamaConfig& c, const ModelPlanOptions& o) {
  const BasePrecision base = base_of(o);
  const bool quantized = is_quantized(base);
  const QuantParams qp = quantized ? base_quant_params(base, o.quant_blocksize, o.double_quant) : QuantParams{};
  LayerBaseBlob b;
  for (size_t p = 0; p < 7; p++) {
    const auto [out, in] = projection_shape(c, all_linear_targets()[p]);
    b.offset[p] = b.total;
    b.bytes[p] = quantized ? quant_storage_bytes(qp, out, in) : out * in * dtype_size(storage_dtype(base));
    b.total += MemoryPlan::aligned(b.bytes[p]);
  }
  return b;
}

const std::vector<std::string>& dense_projections(const LlamaConfig& c) {
  static const std::vector<std::string> attention = {"q_proj", "k_proj", "v_proj", "o_proj"};
  return c.moe() ? attention : all_linear_targets();
}

int64_t dequant_layers_per_micro_step(int64_t n_layer) { return std::max<int64_t>(0, 2 * n_layer - 4); }


int64_t mlp_rows(const ModelPlanOptions& o, const LlamaConfig& c) {
  const int64_t n = o.micro_batch * o.seq_len;
  if (c.moe()) return n * c.experts_per_tok;
  return recomputes(o.checkpointing) && o.mlp_tile > 0 ? std::min(o.mlp_tile, n) : n;
}

namespace {

using MC = MemCategory;

// Frozen base weights. FSDP: a decoder layer's projections are one blob, of which this rank
// holds its share; embeddings, norms, biases and the LM head stay whole on every rank.
void plan_layer_weights(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o, int64_t l) {
  const DType cd = o.compute_dtype;
  const int64_t C = c.hidden_size;
  const BasePrecision base = base_of(o);
  const bool quantized = is_quantized(base), fsdp = o.base_shards > 0;
  const QuantParams qp = quantized ? base_quant_params(base, o.quant_blocksize, o.double_quant) : QuantParams{};
  const std::string p = "layers." + std::to_string(l) + ".";
  plan.add(p + "input_layernorm", MC::Weights, cd, {C});
  plan.add(p + "post_attention_layernorm", MC::Weights, cd, {C});
  if (c.sandwich_norms) {  // Gemma: the MLP's input norm, and the norm on its output
    plan.add(p + "pre_feedforward_layernorm", MC::Weights, cd, {C});
    plan.add(p + "post_feedforward_layernorm", MC::Weights, cd, {C});
  }
  if (fsdp) {
    const LayerBaseBlob blob = layer_base_blob(c, o);
    plan.add_bytes(p + "base.shard", MC::Weights,
                   int64_t(slice_of(size_t(blob.total), int(o.base_shard_rank), int(o.base_shards)).count));
  }
  for (const auto& t : dense_projections(c)) {
    auto [out, in] = projection_shape(c, t);
    if (fsdp) break;
    if (!quantized)
      plan.add(p + t, MC::Weights, storage_dtype(base), {out, in});
    else  // packed codes + scales in one buffer (layout: model/quantized_weights.h)
      plan.add_bytes(p + t, MC::Weights, quant_storage_bytes(qp, out, in));
  }
  if (c.moe()) {  // the router (frozen, in the compute dtype) and the experts, stacked per weight
    plan.add(p + "router", MC::Weights, cd, {c.n_experts, C});
    if (c.moe_biases) plan.add(p + "router.bias", MC::Weights, cd, {c.n_experts});
    const BasePrecision eb = o.expert_precision.value_or(base);
    const QuantParams eq = is_quantized(eb) ? base_quant_params(eb, o.quant_blocksize, o.double_quant) : QuantParams{};
    for (const auto& k : expert_kinds()) {
      const auto [out, in] = expert_shape(c, k);
      if (!is_quantized(eb))
        plan.add(p + "experts." + k, MC::Weights, storage_dtype(eb), {c.n_experts, out, in});
      else  // each expert's packed weight at a 256-byte aligned stride
        plan.add_bytes(p + "experts." + k, MC::Weights, c.n_experts * expert_stride_bytes(c, k, eq));
      if (c.moe_biases) plan.add(p + "experts." + k + ".bias", MC::Weights, cd, {c.n_experts, out});
    }
  }
  // FP4 base GEMMs: each projection's GEMM scales (decode scale, tiled e4m3 per 16), made at load.
  if (o.gemm_dtype == GemmDtype::Fp4)
    for (const auto& t : dense_projections(c)) {
      auto [out, in] = projection_shape(c, t);
      plan.add_bytes(p + t + ".gemm_scales", MC::Weights, fp4_gemm_scales_bytes(out, in));
    }
  if (c.qk_norm) {
    plan.add(p + "q_norm", MC::Weights, cd, {c.head_dim});
    plan.add(p + "k_norm", MC::Weights, cd, {c.head_dim});
  }
  if (c.attention_bias) {
    plan.add(p + "q_proj.bias", MC::Weights, cd, {c.q_dim()});
    plan.add(p + "k_proj.bias", MC::Weights, cd, {c.kv_dim()});
    plan.add(p + "v_proj.bias", MC::Weights, cd, {c.kv_dim()});
  }
  if (c.o_proj_bias) plan.add(p + "o_proj.bias", MC::Weights, cd, {C});
  if (c.attention_sinks) plan.add(p + "sinks", MC::Weights, DType::F32, {c.n_head});  // gpt-oss
}

void plan_weights(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o) {
  const DType cd = o.compute_dtype;
  if (o.base_shards > 0 && (o.base_shard_rank < 0 || o.base_shard_rank >= o.base_shards))
    fail(ErrorKind::Internal, "fsdp plan", "rank " + std::to_string(o.base_shard_rank) + " of " + std::to_string(o.base_shards));
  plan.add("embed_tokens", MC::Weights, cd, {c.vocab_size, c.hidden_size});
  for (int64_t l = 0; l < c.n_layer; l++) plan_layer_weights(plan, c, o, l);
  plan.add("norm", MC::Weights, cd, {c.hidden_size});
  if (!c.tie_word_embeddings) plan.add("lm_head", MC::Weights, cd, {c.vocab_size, c.hidden_size});
}

// Full fine-tuning: every weight trained, with its fp32 gradient and AdamW moments beside it, and
// an fp32 master copy of a weight stored in another dtype (bf16 on a GPU).
void plan_full_training_state(MemoryPlan& plan, const ModelPlanOptions& o) {
  std::vector<PlannedBuffer> weights;
  for (const auto& b : plan.buffers)
    if (b.category == MC::Weights) weights.push_back(b);
  for (const auto& w : weights) {
    if (w.dtype != DType::F32) plan.add(w.name + ".master", MC::Optimizer, DType::F32, w.shape);
    plan.add(w.name + ".grad", MC::Grads, DType::F32, w.shape);
    plan.add(w.name + ".adam_m", MC::Optimizer, o.optimizer_dtype, w.shape);
    plan.add(w.name + ".adam_v", MC::Optimizer, o.optimizer_dtype, w.shape);
  }
}

// The adapted modules: projections (lora_mods) and expert stacks (expert_mods).
struct AdaptedModules {
  std::vector<std::string> lora_mods, expert_mods;
};

// LoRA adapters: parameters, gradients and AdamW moments, all fp32 master copies; one per
// module (a fused qkv_proj or gate_up_proj is one adapter over its projections).
AdaptedModules plan_adapters(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o) {
  AdaptedModules m;
  if (o.method == Method::Full) return m;
  const int64_t r = o.lora.r;
  m.lora_mods = lora_targets_for(c, o.lora.targets);
  check_expert_targets(c, o.lora.expert_targets, o.lora.dropout);
  // A (rows_a, in) and B (rows_b, r) with their gradients and AdamW moments under prefix p.
  auto add_lora_pair = [&](const std::string& p, int64_t rows_a, int64_t in, int64_t rows_b) {
    plan.add(p + "lora_A", MC::Lora, DType::F32, {rows_a, in});
    plan.add(p + "lora_B", MC::Lora, DType::F32, {rows_b, r});
    plan.add(p + "lora_A.grad", MC::Grads, DType::F32, {rows_a, in});
    plan.add(p + "lora_B.grad", MC::Grads, DType::F32, {rows_b, r});
    for (const char* mom : {"adam_m", "adam_v"}) {
      if (o.optimizer_shards > 1) {
        const int64_t w = o.optimizer_shards;
        plan.add(p + "lora_A." + mom + ".shard", MC::Optimizer, o.optimizer_dtype, {(rows_a * in + w - 1) / w});
        plan.add(p + "lora_B." + mom + ".shard", MC::Optimizer, o.optimizer_dtype, {(rows_b * r + w - 1) / w});
        continue;
      }
      plan.add(p + "lora_A." + mom, MC::Optimizer, o.optimizer_dtype, {rows_a, in});
      plan.add(p + "lora_B." + mom, MC::Optimizer, o.optimizer_dtype, {rows_b, r});
    }
  };
  // LoRA on the stacked experts (LoraSpec::expert_targets): one rank-r pair per expert, A (E*r, in)
  // with expert e's rows at e*r (PEFT's lora_A as it is), B (E*out, r) with expert e's rows at e*out
  // (PEFT's lora_B is (out, r*E) with column j*E + e: model/peft_io.h converts on save and load).
  if (c.moe()) m.expert_mods = o.lora.expert_targets;
  for (int64_t l = 0; l < c.n_layer; l++) {
    for (const auto& t : m.lora_mods) {
      auto [out, in] = projection_shape(c, t);
      add_lora_pair("layers." + std::to_string(l) + "." + t + ".", r, in, out);
    }
    for (const auto& k : m.expert_mods) {
      auto [out, in] = expert_lora_shape(c, k);
      add_lora_pair("layers." + std::to_string(l) + ".experts." + k + ".", c.n_experts * r, in, c.n_experts * out);
    }
  }
  return m;
}

// Activations saved for backward. With checkpointing only each layer's input survives the
// forward; the rest is one layer's worth (layer_acts.h's rows), recomputed during backward.
void plan_activations(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o, const AdaptedModules& m) {
  const DType cd = o.compute_dtype;
  const int64_t C = c.hidden_size, N = o.micro_batch * o.seq_len, T = mlp_rows(o, c), r = o.lora.r;
  const bool ckpt = recomputes(o.checkpointing);
  const bool offload = o.checkpointing == Checkpointing::Offload;
  // Offload: layer inputs live in two device slots (by layer parity); every one but the last two
  // also goes to host memory in the forward and comes back a layer ahead in the backward. The last
  // two are still in their slots when backward begins (the last layer writes act.final_x).
  for (int64_t l = 0; l < (offload ? c.n_layer - 2 : c.n_layer); l++) {
    plan.add("act.layers." + std::to_string(l) + ".x", MC::Activations, cd, {N, C}, Lifetime::Step);
    if (offload) plan.buffers.back().host = true;
  }
  if (offload)  // two device slots: layer l's input and layer l+1's (forward) or l-1's (backward)
    for (int s = 0; s < 2; s++) plan.add("act.offload_slot." + std::to_string(s), MC::Activations, cd, {N, C}, Lifetime::Layer);
  auto dtype = [&](ActDtype d) { return d == ActDtype::Compute ? cd : d == ActDtype::F32 ? DType::F32 : DType::I32; };
  for (int64_t l = 0; l < (ckpt ? 1 : c.n_layer); l++) {
    const std::string p = ckpt ? std::string("act.cur.") : "act.layers." + std::to_string(l) + ".";
    const Lifetime life = ckpt ? Lifetime::Layer : Lifetime::Step;
    for (const LayerActRow& row : kLayerActRows)
      if (has_act_feature(c, row.feature))
        plan.add(p + row.name, MC::Activations, dtype(row.dtype), layer_act_shape(c, row.shape, N, T), life);
    for (const auto& t : m.lora_mods) plan.add(p + t + ".lora_h", MC::Activations, cd, {N, r}, life);
    // The experts' LoRA intermediates, x A_e^T per routed row (expert-sorted layout).
    for (const auto& k : m.expert_mods) plan.add(p + "experts." + k + ".lora_h", MC::Activations, cd, {T, r}, life);
  }
  plan.add("act.final_x", MC::Activations, cd, {N, C}, Lifetime::Step);
  // The final norm's output feeds only the LM head, which runs between the last layer's forward and
  // the first layer's backward: it lives in ws.datt (free then) unless that is narrower than C.
  if (c.q_dim() < C) plan.add("act.final_ln", MC::Activations, cd, {N, C}, Lifetime::Step);
  plan.add("act.final_rstd", MC::Activations, DType::F32, {N}, Lifetime::Step);
}

// The micro-batch's inputs, RoPE's frequencies and the cross-entropy's chunk.
void plan_inputs_and_head(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o) {
  const int64_t N = o.micro_batch * o.seq_len;
  // label_rows / label_targets: the positions that carry a label and their targets, so the LM head
  // and the loss run on those rows only.
  for (const char* b : {"batch.tokens", "batch.targets", "batch.positions", "batch.seg", "batch.label_rows", "batch.label_targets"})
    plan.add(b, MC::Activations, DType::I32, {N}, Lifetime::Step);
  plan.add("rope.inv_freq", MC::Workspace, DType::F32, {c.rope_dim() / 2});
  if (c.rope_local_theta > 0) plan.add("rope.inv_freq_local", MC::Workspace, DType::F32, {c.rope_dim() / 2});
  // Cross-entropy works one chunk of tokens at a time: never the full (N,V) logits.
  const int64_t chunk = std::min(o.ce_chunk, N);
  plan.add("logits.chunk", MC::Logits, DType::F32, {chunk, c.vocab_size}, Lifetime::Layer);
  plan.add("logits.losses", MC::Logits, DType::F32, {N}, Lifetime::Step);
}

// The mixture of experts' workspaces: the experts' dequantization slots, their gradients in the
// expert-sorted layout, and the load-balancing loss's statistics.
void plan_moe_workspace(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o) {
  const DType cd = o.compute_dtype;
  const int64_t C = c.hidden_size, N = o.micro_batch * o.seq_len, T = mlp_rows(o, c), F = c.expert_intermediate_size;
  // Two slots of one expert's gate, up and down: the expert in use and the next, dequantized ahead.
  if (is_quantized(o.expert_precision.value_or(base_of(o))))
    plan.add("ws.expert_dequant", MC::Workspace, cd, {2, 3 * F * C}, Lifetime::Layer);
  // d(expert outputs), then d(expert inputs), in the expert-sorted layout; the router's gradients
  plan.add("ws.moe_dy", MC::Workspace, cd, {T, C}, Lifetime::Layer);
  plan.add("ws.moe_dlogits", MC::Workspace, DType::F32, {N, c.n_experts}, Lifetime::Layer);
  plan.add("ws.moe_dw", MC::Workspace, DType::F32, {N, c.experts_per_tok}, Lifetime::Layer);
  if (c.router_aux_loss_coef > 0) {  // the load-balancing loss: its statistics (probability sums,
    // choice counts), its gradient in p, and which tokens count (padding does not)
    plan.add("moe.router_stats", MC::Workspace, DType::F32, {2, c.n_experts}, Lifetime::Step);
    plan.add("moe.aux_grad", MC::Workspace, DType::F32, {c.n_experts}, Lifetime::Step);
    plan.add("batch.mask", MC::Activations, DType::F32, {N}, Lifetime::Step);
  }
}

// Backward workspace: residual gradient plus the widest per-layer gradients, and the frozen
// base's dequantization and gather slots.
void plan_workspace(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o, const AdaptedModules& m) {
  const DType cd = o.compute_dtype;
  const int64_t C = c.hidden_size, N = o.micro_batch * o.seq_len, T = mlp_rows(o, c), r = o.lora.r;
  const int64_t F = c.moe() ? c.expert_intermediate_size : c.intermediate_size;
  // ws.tmp and ws.lora_xd hold (N, C) or (N, q_dim) values, or one MLP tile's (T, F) (flat: the
  // model views them at each use's shape; the size grows with N, as the fit search needs).
  const int64_t wide = std::max(N * std::max(c.q_dim(), C), T * F);
  if (c.moe()) plan_moe_workspace(plan, c, o);
  plan.add("ws.dres", MC::Workspace, cd, {N, C}, Lifetime::Step);
  plan.add("ws.dln", MC::Workspace, cd, {N, C}, Lifetime::Layer);
  plan.add("ws.tmp", MC::Workspace, cd, {wide}, Lifetime::Layer);
  plan.add("ws.datt", MC::Workspace, cd, {N, c.q_dim()}, Lifetime::Layer);
  plan.add("ws.dq", MC::Workspace, cd, {N, c.q_dim()}, Lifetime::Layer);
  plan.add("ws.dk", MC::Workspace, cd, {N, c.kv_dim()}, Lifetime::Layer);
  plan.add("ws.dv", MC::Workspace, cd, {N, c.kv_dim()}, Lifetime::Layer);
  plan.add("ws.dgate", MC::Workspace, cd, {T, F}, Lifetime::Layer);
  plan.add("ws.dup", MC::Workspace, cd, {T, F}, Lifetime::Layer);
  if (!m.expert_mods.empty()) plan.add("ws.moe_lora_dh", MC::Workspace, cd, {T, r}, Lifetime::Layer);  // s dy B_e per routed row
  if (o.method != Method::Full) {
    plan.add("ws.lora_dh", MC::Workspace, cd, {N, r}, Lifetime::Layer);
    if (o.lora.dropout > 0) plan.add("ws.lora_xd", MC::Workspace, cd, {wide}, Lifetime::Layer);
  } else if (c.attention_bias || c.o_proj_bias) {  // a bias's gradient is ones (1,N) times d(output)
    plan.add("ws.ones", MC::Workspace, cd, {N}, Lifetime::Step);
  }
  if (is_quantized(base_of(o))) {  // two slots of one layer's seven projections: the layer in use and the next,
    int64_t layer = 0;             // dequantized ahead (dequant_layers_per_micro_step)
    for (const auto& t : dense_projections(c)) {
      auto [out, in] = projection_shape(c, t);
      layer += out * in;
    }
    plan.add("ws.dequant", MC::Workspace, cd, {2, layer}, Lifetime::Layer);
  }
  // FSDP: two whole layers' blobs, gathered from the ranks' shares: slot l % 2 holds layer l (the
  // layer in use and the next one, gathered ahead, like ws.dequant).
  if (o.base_shards > 0) plan.add_bytes("fsdp.gather", MC::Workspace, 2 * layer_base_blob(c, o).total, Lifetime::Layer);
}

// Generation (sample answers, `qlora generate`): every layer's keys, after RoPE, and values for
// kv_cache_tokens positions. Decoding runs the training forward with these as its k and v.
void plan_kv_cache(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o) {
  if (o.kv_cache_tokens > 0)
    for (int64_t l = 0; l < c.n_layer; l++)
      for (const char* kv : {"k", "v"})
        plan.add("kv.layers." + std::to_string(l) + "." + kv, MC::Activations, o.compute_dtype,
                 {o.kv_cache_tokens, c.kv_dim()});
}

}  // namespace

void plan_model_buffers(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o) {
  plan_weights(plan, c, o);
  if (o.method == Method::Full) plan_full_training_state(plan, o);
  const AdaptedModules adapted = plan_adapters(plan, c, o);
  plan_activations(plan, c, o, adapted);
  plan_inputs_and_head(plan, c, o);
  plan_workspace(plan, c, o, adapted);
  plan_kv_cache(plan, c, o);
}

}  // namespace qlora
