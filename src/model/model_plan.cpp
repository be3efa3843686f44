// The engine's buffer list. Every buffer the model/trainer touches is named here; the Arena
// refuses names that are not planned, so this file and the engine cannot drift apart.
#include "model/model_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/comm.h"
#include "model/experts.h"
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

void plan_model_buffers(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o) {
  const DType cd = o.compute_dtype;
  const int64_t C = c.hidden_size, V = c.vocab_size;
  const int64_t N = o.micro_batch * o.seq_len, r = o.lora.r;
  const bool moe = c.moe();
  // The MLP's rows: a tile of the micro-batch's tokens, or all; a MoE layer's (token, choice) pairs,
  // each through an expert of expert_intermediate_size.
  const int64_t T = mlp_rows(o, c);
  const int64_t F = moe ? c.expert_intermediate_size : c.intermediate_size;
  const BasePrecision base = base_of(o);
  const bool quantized = is_quantized(base);
  const QuantParams qp = quantized ? base_quant_params(base, o.quant_blocksize, o.double_quant) : QuantParams{};
  using MC = MemCategory;

  // Frozen base weights. FSDP: a decoder layer's projections are one blob, of which this rank
  // holds its share; embeddings, norms, biases and the LM head stay whole on every rank.
  const bool fsdp = o.base_shards > 0;
  const LayerBaseBlob blob = layer_base_blob(c, o);
  if (fsdp && (o.base_shard_rank < 0 || o.base_shard_rank >= o.base_shards))
    fail(ErrorKind::Internal, "fsdp plan", "rank " + std::to_string(o.base_shard_rank) + " of " + std::to_string(o.base_shards));
  plan.add("embed_tokens", MC::Weights, cd, {V, C});
  for (int64_t l = 0; l < c.n_layer; l++) {
    const std::string p = "layers." + std::to_string(l) + ".";
    plan.add(p + "input_layernorm", MC::Weights, cd, {C});
    plan.add(p + "post_attention_layernorm", MC::Weights, cd, {C});
    if (c.sandwich_norms) {  // Gemma: the MLP's input norm, and the norm on its output
      plan.add(p + "pre_feedforward_layernorm", MC::Weights, cd, {C});
      plan.add(p + "post_feedforward_layernorm", MC::Weights, cd, {C});
    }
    if (fsdp)
      plan.add_bytes(p + "base.shard", MC::Weights,
                     int64_t(slice_of(size_t(blob.total), int(o.base_shard_rank), int(o.base_shards)).count));
    for (const auto& t : dense_projections(c)) {
      auto [out, in] = projection_shape(c, t);
      if (fsdp) break;
      if (!quantized)
        plan.add(p + t, MC::Weights, storage_dtype(base), {out, in});
      else  // packed codes + scales in one buffer (layout: model/quantized_weights.h)
        plan.add_bytes(p + t, MC::Weights, quant_storage_bytes(qp, out, in));
    }
    if (moe) {  // the router (frozen, in the compute dtype) and the experts, stacked per weight
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
  plan.add("norm", MC::Weights, cd, {C});
  if (!c.tie_word_embeddings) plan.add("lm_head", MC::Weights, cd, {V, C});

  // LoRA adapters: parameters, gradients and AdamW moments, all fp32 master copies; one per
  // module (a fused qkv_proj or gate_up_proj is one adapter over its projections).
  const std::vector<std::string> lora_mods =
      o.method != Method::Full ? lora_targets_for(c, o.lora.targets) : std::vector<std::string>{};
  if (o.method != Method::Full) check_expert_targets(c, o.lora.expert_targets, o.lora.dropout);
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
  const std::vector<std::string> expert_mods =
      o.method != Method::Full && moe ? o.lora.expert_targets : std::vector<std::string>{};
  if (o.method != Method::Full) {
    for (int64_t l = 0; l < c.n_layer; l++) {
      for (const auto& t : lora_mods) {
        auto [out, in] = projection_shape(c, t);
        add_lora_pair("layers." + std::to_string(l) + "." + t + ".", r, in, out);
      }
      for (const auto& k : expert_mods) {
        auto [out, in] = expert_lora_shape(c, k);
        add_lora_pair("layers." + std::to_string(l) + ".experts." + k + ".", c.n_experts * r, in, c.n_experts * out);
      }
    }
  }

  // Activations saved for backward. With checkpointing only each layer's input survives the
  // forward; the rest is one layer's worth, recomputed during backward.
  const bool ckpt = recomputes(o.checkpointing);
  const bool offload = o.checkpointing == Checkpointing::Offload;
  auto act_prefix = [&](int64_t l) { return ckpt ? std::string("act.cur.") : "act.layers." + std::to_string(l) + "."; };
  const int64_t n_sets = ckpt ? 1 : c.n_layer;
  // Offload: layer inputs live in two device slots (by layer parity); every one but the last two
  // also goes to host memory in the forward and comes back a layer ahead in the backward. The last
  // two are still in their slots when backward begins (the last layer writes act.final_x).
  for (int64_t l = 0; l < (offload ? c.n_layer - 2 : c.n_layer); l++) {
    plan.add("act.layers." + std::to_string(l) + ".x", MC::Activations, cd, {N, C}, Lifetime::Step);
    if (offload) plan.buffers.back().host = true;
  }
  if (offload)  // two device slots: layer l's input and layer l+1's (forward) or l-1's (backward)
    for (int s = 0; s < 2; s++) plan.add("act.offload_slot." + std::to_string(s), MC::Activations, cd, {N, C}, Lifetime::Layer);
  for (int64_t l = 0; l < n_sets; l++) {
    const std::string p = act_prefix(l);
    const Lifetime life = ckpt ? Lifetime::Layer : Lifetime::Step;
    plan.add(p + "ln1", MC::Activations, cd, {N, C}, life);
    plan.add(p + "rstd1", MC::Activations, DType::F32, {N}, life);
    plan.add(p + "q", MC::Activations, cd, {N, c.q_dim()}, life);
    plan.add(p + "k", MC::Activations, cd, {N, c.kv_dim()}, life);
    plan.add(p + "v", MC::Activations, cd, {N, c.kv_dim()}, life);
    if (c.qk_norm) {  // q and k before their per-head norm, and its statistics (q, k: after it and RoPE)
      plan.add(p + "q_raw", MC::Activations, cd, {N, c.q_dim()}, life);
      plan.add(p + "k_raw", MC::Activations, cd, {N, c.kv_dim()}, life);
      plan.add(p + "rstd_q", MC::Activations, DType::F32, {N * c.n_head}, life);
      plan.add(p + "rstd_k", MC::Activations, DType::F32, {N * c.n_head_kv}, life);
    }
    plan.add(p + "att", MC::Activations, cd, {N, c.q_dim()}, life);
    plan.add(p + "lse", MC::Activations, DType::F32, {c.n_head, N}, life);
    plan.add(p + "xmid", MC::Activations, cd, {N, C}, life);
    plan.add(p + "ln2", MC::Activations, cd, {N, C}, life);
    plan.add(p + "rstd2", MC::Activations, DType::F32, {N}, life);
    if (c.sandwich_norms) {  // o_proj's and down_proj's outputs before their norms, and the norms' 1/rms
      plan.add(p + "attn_out", MC::Activations, cd, {N, C}, life);
      plan.add(p + "rstd_pa", MC::Activations, DType::F32, {N}, life);
      plan.add(p + "mlp_out", MC::Activations, cd, {T, C}, life);
      plan.add(p + "rstd_pf", MC::Activations, DType::F32, {N}, life);
    }
    if (moe) {  // the routing (model/experts.h) and the experts' rows in the expert-sorted layout
      const int64_t K = c.experts_per_tok;
      // The router's logits in f32 on every backend (a bf16 rounding of them reorders near ties).
      plan.add(p + "moe_logits", MC::Activations, DType::F32, {N, c.n_experts}, life);
      for (const char* i : {"moe_expert", "moe_row", "moe_token"}) plan.add(p + i, MC::Activations, DType::I32, {N * K}, life);
      for (const char* f : {"moe_weight", "moe_row_weight"}) plan.add(p + f, MC::Activations, DType::F32, {N * K}, life);
      plan.add(p + "moe_offsets", MC::Activations, DType::I32, {c.n_experts + 1}, life);
      plan.add(p + "moe_x", MC::Activations, cd, {T, C}, life);
      plan.add(p + "moe_y", MC::Activations, cd, {T, C}, life);
    }
    plan.add(p + "gate", MC::Activations, cd, {T, F}, life);
    plan.add(p + "up", MC::Activations, cd, {T, F}, life);
    plan.add(p + "h", MC::Activations, cd, {T, F}, life);
    for (const auto& t : lora_mods) plan.add(p + t + ".lora_h", MC::Activations, cd, {N, r}, life);
    // The experts' LoRA intermediates, x A_e^T per routed row (expert-sorted layout).
    for (const auto& k : expert_mods) plan.add(p + "experts." + k + ".lora_h", MC::Activations, cd, {T, r}, life);
  }
  plan.add("act.final_x", MC::Activations, cd, {N, C}, Lifetime::Step);
  // The final norm's output feeds only the LM head, which runs between the last layer's forward and
  // the first layer's backward: it lives in ws.datt (free then) unless that is narrower than C.
  if (c.q_dim() < C) plan.add("act.final_ln", MC::Activations, cd, {N, C}, Lifetime::Step);
  plan.add("act.final_rstd", MC::Activations, DType::F32, {N}, Lifetime::Step);
  // label_rows / label_targets: the positions that carry a label and their targets, so the LM head
  // and the loss run on those rows only.
  for (const char* b : {"batch.tokens", "batch.targets", "batch.positions", "batch.seg", "batch.label_rows", "batch.label_targets"})
    plan.add(b, MC::Activations, DType::I32, {N}, Lifetime::Step);
  plan.add("rope.inv_freq", MC::Workspace, DType::F32, {c.rope_dim() / 2});
  if (c.rope_local_theta > 0) plan.add("rope.inv_freq_local", MC::Workspace, DType::F32, {c.rope_dim() / 2});

  // Cross-entropy works one chunk of tokens at a time: never the full (N,V) logits.
  const int64_t chunk = std::min(o.ce_chunk, N);
  plan.add("logits.chunk", MC::Logits, DType::F32, {chunk, V}, Lifetime::Layer);
  plan.add("logits.losses", MC::Logits, DType::F32, {N}, Lifetime::Step);

  // Backward workspace: residual gradient plus the widest per-layer gradients. ws.tmp and
  // ws.lora_xd hold (N, C) or (N, q_dim) values, or one MLP tile's (T, F) (flat: the model views
  // them at each use's shape; the size grows with N, as the fit search needs).
  const int64_t wide = std::max(N * std::max(c.q_dim(), C), T * F);
  // Two slots of one expert's gate, up and down: the expert in use and the next, dequantized ahead.
  if (moe && is_quantized(o.expert_precision.value_or(base)))
    plan.add("ws.expert_dequant", MC::Workspace, cd, {2, 3 * F * C}, Lifetime::Layer);
  if (moe) {  // d(expert outputs), then d(expert inputs), in the expert-sorted layout; the router's gradients
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
  plan.add("ws.dres", MC::Workspace, cd, {N, C}, Lifetime::Step);
  plan.add("ws.dln", MC::Workspace, cd, {N, C}, Lifetime::Layer);
  plan.add("ws.tmp", MC::Workspace, cd, {wide}, Lifetime::Layer);
  plan.add("ws.datt", MC::Workspace, cd, {N, c.q_dim()}, Lifetime::Layer);
  plan.add("ws.dq", MC::Workspace, cd, {N, c.q_dim()}, Lifetime::Layer);
  plan.add("ws.dk", MC::Workspace, cd, {N, c.kv_dim()}, Lifetime::Layer);
  plan.add("ws.dv", MC::Workspace, cd, {N, c.kv_dim()}, Lifetime::Layer);
  plan.add("ws.dgate", MC::Workspace, cd, {T, F}, Lifetime::Layer);
  plan.add("ws.dup", MC::Workspace, cd, {T, F}, Lifetime::Layer);
  if (!expert_mods.empty()) plan.add("ws.moe_lora_dh", MC::Workspace, cd, {T, r}, Lifetime::Layer);  // s dy B_e per routed row
  if (o.method != Method::Full) {
    plan.add("ws.lora_dh", MC::Workspace, cd, {N, r}, Lifetime::Layer);
    if (o.lora.dropout > 0) plan.add("ws.lora_xd", MC::Workspace, cd, {wide}, Lifetime::Layer);
  }
  if (quantized) {  // two slots of one layer's seven projections: the layer in use and the next,
    int64_t layer = 0;  // dequantized ahead (dequant_layers_per_micro_step)
    for (const auto& t : dense_projections(c)) {
      auto [out, in] = projection_shape(c, t);
      layer += out * in;
    }
    plan.add("ws.dequant", MC::Workspace, cd, {2, layer}, Lifetime::Layer);
  }
  // FSDP: two whole layers' blobs, gathered from the ranks' shares: slot l % 2 holds layer l (the
  // layer in use and the next one, gathered ahead, like ws.dequant).
  if (fsdp) plan.add_bytes("fsdp.gather", MC::Workspace, 2 * blob.total, Lifetime::Layer);

  // Generation (sample answers, `qlora generate`): every layer's keys, after RoPE, and values for
  // kv_cache_tokens positions. Decoding runs the training forward with these as its k and v.
  if (o.kv_cache_tokens > 0)
    for (int64_t l = 0; l < c.n_layer; l++)
      for (const char* kv : {"k", "v"})
        plan.add("kv.layers." + std::to_string(l) + "." + kv, MC::Activations, cd, {o.kv_cache_tokens, c.kv_dim()});
}

}  // namespace qlora
