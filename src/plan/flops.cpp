// Per-token FLOP counts of a training step (formula in flops.h and perf_anchors.md §10).
#include "plan/flops.h"

#include <algorithm>

#include "core/error.h"
#include "model/model_plan.h"

namespace qlora {

ShapeSums shape_sums(const LlamaConfig& c, const std::vector<std::string>& targets,
                     const std::vector<std::string>& expert_targets) {
  ShapeSums s;
  for (const auto& t : dense_projections(c)) {
    auto [out, in] = projection_shape(c, t);
    s.n_lin += double(out) * double(in) * double(c.n_layer);
  }
  // A mixture-of-experts layer: each token through its experts_per_tok experts (gate, up, down)
  // and the router (n_experts logits).
  if (c.moe())
    s.n_lin += double(c.n_layer) * double(c.hidden_size) *
               (3.0 * double(c.experts_per_tok) * double(c.expert_intermediate_size) + double(c.n_experts));
  // LoRA per module: a fused qkv_proj / gate_up_proj has one A for its outputs.
  for (const auto& t : lora_targets_for(c, targets)) {
    auto [out, in] = projection_shape(c, t);
    s.p_l += double(in + out) * double(c.n_layer);
  }
  for (const auto& k : expert_targets) {  // each token's routed experts each apply their pair
    auto [out, in] = expert_lora_shape(c, k);
    s.p_l += double(in + out) * double(c.n_layer) * double(c.experts_per_tok);
  }
  s.n_head = double(c.vocab_size) * double(c.hidden_size);
  return s;
}

FlopCounts flops_per_token(const LlamaConfig& c, const FlopOptions& o) {
  const bool full = o.method == Method::Full;
  const ShapeSums s = full ? shape_sums(c, {}) : shape_sums(c, o.targets, o.expert_targets);
  const double r = full ? 0.0 : double(o.lora_r);
  const double D = double(std::max<int64_t>(o.attn_len, 1));
  // Two matmuls (QK^T, PV) of 2*q_dim FLOPs per query-key pair, (D+1)/2 pairs per query; a layer
  // with a sliding window W < D sees min(t+1, W) keys at position t: (W(W+1)/2 + (D-W)W) / D.
  double pairs = 0;
  for (int64_t l = 0; l < c.n_layer; l++) {
    const double W = double(c.window_of(l));
    pairs += W > 0 && W < D ? (W * (W + 1.0) / 2.0 + (D - W) * W) / D : (D + 1.0) / 2.0;
  }
  const double A = 4.0 * double(c.q_dim()) * pairs;

  // The backward's five products (S, dP, dV, dK, dQ) are 2.5 A; with dq in its own pass S and dP
  // run twice: 3.5 A; with dK/dV split over warp pairs once more: 4.5 A.
  const double attn_bwd = (2.5 + (o.dq_recompute ? 1.0 : 0.0) + (o.dkv_split ? 1.0 : 0.0)) * A;
  FlopCounts f;
  f.fwd = {2 * s.n_lin, 2 * s.n_head, 2 * r * s.p_l, A};
  if (full)
    f.bwd = {4 * s.n_lin, 4 * s.n_head, 0, attn_bwd};
  else
    f.bwd = {2 * s.n_lin, 2 * s.n_head, 4 * r * s.p_l, attn_bwd};
  if (o.recompute) f.recompute = {2 * s.n_lin, 0, 2 * r * s.p_l, A};
  if (o.reference) f.reference = {2 * s.n_lin, 2 * s.n_head, 0, A};
  return f;
}

}  // namespace qlora
