// The decoder's mixture-of-experts MLP, forward and backward: the router, the top-k routing into
// the expert-sorted layout, one GEMM per expert over its rows (LoRA on the expert stacks), and
// the load-balancing loss.
#include <algorithm>

#include "model/decoder_parts.h"
#include "model/experts.h"

namespace qlora {

void DecoderModel::for_each_routed_expert(int64_t l, const std::vector<int32_t>& off,
                                        const std::function<void(int64_t, int64_t, int64_t, int)>& f) {
  std::vector<int64_t> active;
  for (size_t e = 0; e + 1 < off.size(); e++)
    if (off[e + 1] > off[e]) active.push_back(int64_t(e));
  if (!active.empty()) base_->prepare_expert(l, active[0], 0, false);
  for (size_t i = 0; i < active.size(); i++) {
    const int slot = int(i % 2);
    if (i + 1 < active.size()) base_->prepare_expert(l, active[i + 1], 1 - slot, true);
    const int64_t e = active[i];
    f(e, off[size_t(e)], off[size_t(e) + 1] - off[size_t(e)], slot);
  }
}

const std::vector<int32_t>& DecoderModel::expert_offsets(const Acts& a) {
  moe_.offsets_host.resize(size_t(cfg_.n_experts + 1));
  be_.copy_to_host(moe_.offsets_host.data(), a.moe_offsets.data, moe_.offsets_host.size() * 4);
  return moe_.offsets_host;
}

// out = sum_j weight[t,j] * expert_{e_j}(ln2[t]), expert(x) = down(act(gate x) * up x): the router's
// logits, the top-k routing, the tokens gathered into the expert-sorted layout (each expert's rows
// together), one GEMM per expert and weight over its rows, and the weighted sum back per token.
void DecoderModel::moe_fwd(const Acts& a, const Tensor& out, int64_t l, int64_t n, bool count) {
  const LayerWeights& W = base_->layer(l);
  const int64_t E = cfg_.n_experts, K = cfg_.experts_per_tok, C = cfg_.hidden_size, F = cfg_.expert_intermediate_size;
  const int64_t M = n * K;
  be_.matmul({.c = a.moe_logits, .a = a.ln2, .b = W.router, .m = n, .n = E, .k = C, .trans_a = false, .trans_b = true,
              .alpha = 1.0f, .beta = 0.0f});  // logits = ln2 Wr^T  (N,E)
  if (W.router_bias.data) be_.bias_add({.y = a.moe_logits, .bias = W.router_bias, .n = n, .m = E});  // (+ b: gpt-oss)
  be_.moe_route_fwd({.logits = a.moe_logits, .expert = a.moe_expert, .weight = a.moe_weight, .row = a.moe_row,
                     .token = a.moe_token, .row_weight = a.moe_row_weight, .offsets = a.moe_offsets, .n = n,
                     .n_experts = E, .top_k = K, .norm_topk = cfg_.norm_topk_prob});
  const auto* token = static_cast<const int32_t*>(a.moe_token.data);
  be_.gather_rows({.dst = a.moe_x, .src = a.ln2, .scale = Tensor(), .index = token, .m = M, .c = C});  // x_s[r] = ln2[token[r]]
  const std::vector<int32_t>& off = expert_offsets(a);
  if (count)
    for (int64_t e = 0; e < E; e++) moe_.routed[size_t(l * E + e)] += off[size_t(e) + 1] - off[size_t(e)];
  if (count && moe_.aux_on) {  // the load-balancing loss's statistics, summed over the layers
    const Tensor& stats = views_->router_stats;  // (2,E): probability sums, choice counts
    be_.moe_router_stats({.prob_sum = row_slice(stats, 0, 1), .count = row_slice(stats, 1, 1), .logits = a.moe_logits,
                          .expert = a.moe_expert, .mask = with_rows(views_->batch_mask, n), .n = n,
                          .n_experts = E, .top_k = K});
  }
  // The experts' adapters (LoRA on gate_up_proj and down_proj): expert e's rows of A and B.
  const int gu = adapters_->enabled() ? adapters_->expert_index(l, 0) : -1, dn = adapters_->enabled() ? adapters_->expert_index(l, 1) : -1;
  const int64_t r = adapters_->spec().r;
  const float s = adapters_->spec().scale();
  // Each expert with rows, over them: gate, up, the activation, down (each plus s (x A_e^T) B_e^T).
  for_each_routed_expert(l, off, [&](int64_t e, int64_t r0, int64_t m, int slot) {
    const Tensor x = row_slice(a.moe_x, r0, m), gate = row_slice(a.gate, r0, m), up = row_slice(a.up, r0, m);
    const Tensor h = row_slice(a.h, r0, m), y = row_slice(a.moe_y, r0, m);
    be_.matmul({.c = gate, .a = x, .b = base_->expert_weight(l, 0, e, slot), .m = m, .n = F, .k = C, .trans_a = false,
                .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
    be_.matmul({.c = up, .a = x, .b = base_->expert_weight(l, 1, e, slot), .m = m, .n = F, .k = C, .trans_a = false,
                .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
    if (cfg_.moe_biases) {  // expert e's rows of the output biases (gpt-oss)
      be_.bias_add({.y = gate, .bias = row_slice(W.expert_bias[0], e, 1), .n = m, .m = F});
      be_.bias_add({.y = up, .bias = row_slice(W.expert_bias[1], e, 1), .n = m, .m = F});
    }
    if (gu >= 0) {  // one A for both; B's first F rows are gate's, the next F up's
      const Tensor xa = row_slice(a.moe_lora_h[0], r0, m), B = adapters_->pair(gu).B.w;
      be_.matmul({.c = xa, .a = x, .b = row_slice(adapters_->pair(gu).A.w, e * r, r), .m = m, .n = r, .k = C,
                  .trans_a = false, .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
      be_.matmul({.c = gate, .a = xa, .b = row_slice(B, 2 * e * F, F), .m = m, .n = F, .k = r, .trans_a = false,
                  .trans_b = true, .alpha = s, .beta = 1.0f});
      be_.matmul({.c = up, .a = xa, .b = row_slice(B, 2 * e * F + F, F), .m = m, .n = F, .k = r, .trans_a = false,
                  .trans_b = true, .alpha = s, .beta = 1.0f});
    }
    be_.swiglu_fwd({.out = h, .gate = gate, .up = up, .n = m * F, .act = cfg_.hidden_act, .clamp = cfg_.swiglu_clamp});
    be_.matmul({.c = y, .a = h, .b = base_->expert_weight(l, 2, e, slot), .m = m, .n = C, .k = F, .trans_a = false,
                .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
    if (cfg_.moe_biases) be_.bias_add({.y = y, .bias = row_slice(W.expert_bias[2], e, 1), .n = m, .m = C});  // weighted with the rest
    if (dn >= 0) {
      const Tensor ha = row_slice(a.moe_lora_h[1], r0, m);
      be_.matmul({.c = ha, .a = h, .b = row_slice(adapters_->pair(dn).A.w, e * r, r), .m = m, .n = r, .k = F,
                  .trans_a = false, .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
      be_.matmul({.c = y, .a = ha, .b = row_slice(adapters_->pair(dn).B.w, e * C, C), .m = m, .n = C, .k = r,
                  .trans_a = false, .trans_b = true, .alpha = s, .beta = 1.0f});
    }
  });
  be_.combine_rows({.out = out, .src = a.moe_y, .weight = a.moe_weight,
                    .row = static_cast<const int32_t*>(a.moe_row.data), .n = n, .k = K, .c = C, .accumulate = false});
}

// d(out) in ws.dres; ws.dln "=" d(ln2): through each expert (dweight-scaled rows, back through
// down, the activation, gate and up, summed per token) plus the router's path (the routing
// weights' gradient d w[t,j] = d out[t] . y[row[t,j]] through the softmax into the logits, times Wr).
void DecoderModel::moe_bwd(const Acts& a, int64_t l, int64_t n) {
  const LayerWeights& W = base_->layer(l);
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
  const int gu = adapters_->expert_index(l, 0), dn = adapters_->expert_index(l, 1);
  const int64_t r = adapters_->spec().r;
  const float s = adapters_->spec().scale();
  // Each expert with rows, over them: down, the activation, gate and up.
  for_each_routed_expert(l, off, [&](int64_t e, int64_t r0, int64_t m, int slot) {
    const Tensor dh_e = row_slice(dh, r0, m), dg = row_slice(dgate, r0, m), du = row_slice(dup, r0, m);
    const Tensor dy_e = row_slice(dy, r0, m);
    be_.matmul({.c = dh_e, .a = dy_e, .b = base_->expert_weight(l, 2, e, slot), .m = m, .n = F, .k = C, .trans_a = false,
                .trans_b = false, .alpha = 1.0f, .beta = 0.0f});
    if (dn >= 0) {  // before dy's rows are overwritten by dx below
      const auto& [A, B] = adapters_->pair(dn);
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
    be_.matmul({.c = d, .a = dg, .b = base_->expert_weight(l, 0, e, slot), .m = m, .n = C, .k = F, .trans_a = false,
                .trans_b = false, .alpha = 1.0f, .beta = 0.0f});
    be_.matmul({.c = d, .a = du, .b = base_->expert_weight(l, 1, e, slot), .m = m, .n = C, .k = F, .trans_a = false,
                .trans_b = false, .alpha = 1.0f, .beta = 1.0f});
    if (gu >= 0) {  // gate's and up's rows of B share one A
      const auto& [A, B] = adapters_->pair(gu);
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
  if (moe_.aux_on) rb.aux_grad = views_->aux_grad, rb.mask = with_rows(views_->batch_mask, n);
  be_.moe_route_bwd(rb);
  be_.matmul({.c = dln, .a = dlogits, .b = W.router, .m = n, .n = C, .k = E, .trans_a = false, .trans_b = false,
              .alpha = 1.0f, .beta = 1.0f});  // dln += dlogits Wr
}

// transformers' load_balancing_loss_func over the forward's layers: with R = layers x counted
// tokens, f_e = count_e / R and P_e = prob_sum_e / R, aux = E sum_e f_e P_e. Its gradient in each
// counted token's p[t,e] (the counts are a choice: none) is coef * aux_weight * E * count_e / R^2.
void DecoderModel::router_aux_loss(double aux_weight) {
  const int64_t E = cfg_.n_experts;
  std::vector<float> stats(size_t(2 * E)), grad(size_t(E), 0.0f);
  be_.copy_to_host(stats.data(), views_->router_stats.data, stats.size() * 4);
  double counted = 0;
  for (int64_t e = 0; e < E; e++) counted += stats[size_t(E + e)];
  const double rows = counted / double(cfg_.experts_per_tok);  // layers x counted tokens
  moe_.aux_loss = 0;
  if (rows > 0) {
    for (int64_t e = 0; e < E; e++) moe_.aux_loss += double(stats[size_t(E + e)]) * double(stats[size_t(e)]);
    moe_.aux_loss *= double(E) / (rows * rows);
    for (int64_t e = 0; e < E; e++)
      grad[size_t(e)] = float(cfg_.router_aux_loss_coef * aux_weight * double(E) * double(stats[size_t(E + e)]) / (rows * rows));
    moe_.aux_sum += moe_.aux_loss;
    moe_.aux_count++;
  }
  be_.copy_to_device(views_->aux_grad.data, grad.data(), grad.size() * 4);
}

}  // namespace qlora
