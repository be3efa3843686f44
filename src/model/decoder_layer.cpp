// One decoder layer, forward and backward: the attention block and the dense MLP (whole or in
// tiles), each projection with its LoRA adapter. Backward comments mark each output as "="
// (overwritten) or "+=" (accumulated).
#include <algorithm>

#include "model/decoder_parts.h"

namespace qlora {

static uint64_t dropout_stream(int64_t layer, int proj) { return uint64_t(layer) * 7 + uint64_t(proj); }

// y (N,out) "=" x W^T + bias + s * dropout(x) A^T B^T. A fused module's first projection computes
// the shared h = dropout(x) A^T; each projection adds its rows of B.
void DecoderModel::linear_fwd(const Tensor& y, const Tensor& x, int64_t l, int p, const Acts& a, bool train,
                            uint64_t seed, int64_t row0) {
  const int64_t n = x.dim(0), in = x.dim(1), out = y.dim(1);
  if (opts_.gemm_dtype == GemmDtype::Fp8) {  // the fp8 weight as stored, x quantized to e4m3 (no dequantization)
    base_->gather(l);
    be_.matmul_fp8({.y = y, .x = x, .w = base_->layer(l).packed[p], .m = n, .out = out, .in = in, .amax = Tensor()});
  } else if (opts_.gemm_dtype == GemmDtype::Fp4) {  // the stored e2m1 codes, x quantized to NVFP4 (no dequantization)
    be_.matmul_fp4({.y = y, .x = x, .w = base_->layer(l).packed[p], .w_scales = base_->layer(l).gemm_scales[p],
                    .m = n, .out = out, .in = in});
  } else {
    be_.matmul({.c = y, .a = x, .b = base_->weight(l, p), .m = n, .n = out, .k = in, .trans_a = false, .trans_b = true,
                .alpha = 1.0f, .beta = 0.0f});
  }
  if (p <= O && base_->layer(l).bias[p].data) be_.bias_add({.y = y, .bias = base_->layer(l).bias[p], .n = n,
                                                               .m = out});
  const int li = adapters_->enabled() ? adapters_->index(l, p) : -1;
  if (li < 0) return;
  const TrainParam& B = adapters_->pair(li).B;
  const LoraSpec& lora = adapters_->spec();
  if (adapters_->first(p) == p) lora_h_fwd(x, l, p, a, train, seed, row0);  // h = xd A^T  (N,r)
  const Tensor bw = row_slice(B.w, adapters_->row0(p), out);  // this projection's rows of B
  be_.matmul({.c = y, .a = row_slice(a.lora_h[p], row0, n), .b = bw, .m = n, .n = out, .k = lora.r, .trans_a = false,
              .trans_b = true, .alpha = lora.scale(), .beta = 1.0f});  // y += s h B^T
}

void DecoderModel::lora_h_fwd(const Tensor& x, int64_t l, int p, const Acts& a, bool train, uint64_t seed, int64_t row0) {
  const int64_t n = x.dim(0), in = x.dim(1);
  const TrainParam& A = adapters_->pair(adapters_->index(l, p)).A;
  const LoraSpec& lora = adapters_->spec();
  Tensor xin = x;
  if (train && lora.dropout > 0) {
    xin = as_matrix(views_->lora_xd, n, in);
    be_.dropout_fwd({.out = xin, .x = x, .n = n * in, .p = float(lora.dropout), .seed = seed,
                     .stream = dropout_stream(l, adapters_->first(p)), .offset = uint64_t(row0 * in)});
  }
  be_.matmul({.c = row_slice(a.lora_h[p], row0, n), .a = xin, .b = A.w, .m = n, .n = lora.r, .k = in,
              .trans_a = false, .trans_b = true, .alpha = 1.0f, .beta = 0.0f});
}

// dx (N,in) "=" or "+=" dy W (+ LoRA path); dA, dB "+=". A fused module's projections come in
// order (q, k, v; gate, up) with the same x: each adds its rows' dB and its part of dh = s dy B
// (ws.lora_dh: the first "=", the others "+="), and the last one finishes dA and dx.
void DecoderModel::linear_bwd(const Tensor& dx, bool acc, const Tensor& dy, const Tensor& x, int64_t l, int p,
                            const Acts& a, uint64_t seed, bool need_dx, int64_t row0) {
  const int64_t n = dy.dim(0), out = dy.dim(1), in = dx.dim(1);
  if (need_dx) be_.matmul({.c = dx, .a = dy, .b = base_->weight(l, p), .m = n, .n = in, .k = out, .trans_a = false,
                           .trans_b = false, .alpha = 1.0f, .beta = acc ? 1.0f : 0.0f});
  if (const LayerWeights& dW = base_->grad(l); dW.w[p].data) {  // full fine-tuning
    be_.matmul({.c = dW.w[p], .a = dy, .b = x, .m = out, .n = in, .k = n, .trans_a = true, .trans_b = false,
                .alpha = 1.0f, .beta = 1.0f});  // dW += dy^T x   (out,in)
    if (p <= O && dW.bias[p].data)
      be_.matmul({.c = as_matrix(dW.bias[p], 1, out), .a = as_matrix(views_->ones, 1, n), .b = dy, .m = 1, .n = out,
                  .k = n, .trans_a = false, .trans_b = false, .alpha = 1.0f, .beta = 1.0f});  // db += 1^T dy
  }
  const int li = adapters_->index(l, p);
  if (li < 0) return;
  const auto& [A, B] = adapters_->pair(li);
  const LoraSpec& lora = adapters_->spec();
  const int64_t r = lora.r;
  const float s = lora.scale();
  const bool drop = lora.dropout > 0;
  const uint64_t mask_at = uint64_t(row0 * in);
  const uint64_t stream = dropout_stream(l, adapters_->first(p));
  const int64_t b0 = adapters_->row0(p);
  be_.matmul({.c = row_slice(B.g, b0, out), .a = dy, .b = row_slice(a.lora_h[p], row0, n), .m = out, .n = r, .k = n,
              .trans_a = true, .trans_b = false, .alpha = s, .beta = 1.0f});  // dB += s dy^T h
  Tensor dh = as_matrix(views_->lora_dh, n, r);
  be_.matmul({.c = dh, .a = dy, .b = row_slice(B.w, b0, out), .m = n, .n = r, .k = out, .trans_a = false,
              .trans_b = false, .alpha = s, .beta = adapters_->first(p) == p ? 0.0f : 1.0f});  // dh = (+=) s dy B   (N,r)
  if (adapters_->last(p) != p) return;
  Tensor xin = x;
  if (drop) {
    xin = as_matrix(views_->lora_xd, n, in);
    be_.dropout_fwd({.out = xin, .x = x, .n = n * in, .p = float(lora.dropout), .seed = seed, .stream = stream,
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
    be_.dropout_bwd({.out = t, .x = t, .n = n * in, .p = float(lora.dropout), .seed = seed, .stream = stream,
                     .offset = mask_at});
    be_.add({.y = dx, .x = t, .n = n * in});
  }
}

void DecoderModel::layer_fwd(const StepInputs& in, int64_t l, int64_t n, bool train, uint64_t seed, bool recompute) {
  Acts a = acts(l, n);
  const LayerViews& L = layers_[size_t(l)];
  const LayerWeights& W = base_->layer(l);
  const float eps = float(cfg_.rms_norm_eps), w_off = norm_offset();
  const Tensor inv_freq = L.inv_freq;
  Tensor next = recompute ? as_matrix(views_->tmp, n, cfg_.hidden_size) : with_rows(L.next, n);
  // Attention reads k, v of t_kv positions: this micro-batch's own (training), or, when decoding,
  // the cache rows [0, kv_.pos + n), the new ones written straight into it by the k/v projections.
  Tensor k_all = a.k, v_all = a.v;
  int64_t t_kv = 0;
  if (in.decoding) {
    const int64_t kvd = cfg_.kv_dim(), at = kv_.pos * kvd * dtype_size(a.k.dtype);
    t_kv = kv_.pos + n;
    k_all = as_matrix(kv_.k[size_t(l)], t_kv, kvd);
    v_all = as_matrix(kv_.v[size_t(l)], t_kv, kvd);
    a.k = as_matrix(k_all, n, kvd);
    a.v = as_matrix(v_all, n, kvd);
    a.k.data = static_cast<char*>(k_all.data) + at;
    a.v.data = static_cast<char*>(v_all.data) + at;
  }

  be_.rmsnorm_fwd({.out = a.ln1, .rstd = a.rstd1, .x = a.x, .w = W.ln1_w, .n = n, .c = cfg_.hidden_size, .eps = eps,
                   .w_offset = w_off});
  // qk_norm: the projections land in q_raw/k_raw and an RMSNorm over each head (one row of D
  // values per head) writes q and k.
  linear_fwd(cfg_.qk_norm ? a.q_raw : a.q, a.ln1, l, Q, a, train, seed);
  linear_fwd(cfg_.qk_norm ? a.k_raw : a.k, a.ln1, l, K, a, train, seed);
  linear_fwd(a.v, a.ln1, l, V, a, train, seed);
  if (cfg_.qk_norm) {
    const int64_t hd = cfg_.head_dim, hq = n * cfg_.n_head, hk = n * cfg_.n_head_kv;
    be_.rmsnorm_fwd({.out = as_matrix(a.q, hq, hd), .rstd = a.rstd_q, .x = as_matrix(a.q_raw, hq, hd), .w = W.q_norm_w,
                     .n = hq, .c = hd, .eps = eps, .w_offset = w_off});
    be_.rmsnorm_fwd({.out = as_matrix(a.k, hk, hd), .rstd = a.rstd_k, .x = as_matrix(a.k_raw, hk, hd), .w = W.k_norm_w,
                     .n = hk, .c = hd, .eps = eps, .w_offset = w_off});
  }
  be_.rope_fwd({.x = a.q, .inv_freq = inv_freq, .positions = in.positions, .n = n, .n_head = cfg_.n_head,
                .head_dim = cfg_.head_dim, .rotary_dim = cfg_.rope_dim(), .scale = rope_.scale});
  be_.rope_fwd({.x = a.k, .inv_freq = inv_freq, .positions = in.positions, .n = n, .n_head = cfg_.n_head_kv,
                .head_dim = cfg_.head_dim, .rotary_dim = cfg_.rope_dim(), .scale = rope_.scale});
  const float scale = cfg_.attn_scale();
  be_.attention_fwd({.out = a.att, .lse = a.lse, .q = a.q, .k = k_all, .v = v_all, .seg = in.seg, .b = in.b,
                     .t = in.t, .n_head = cfg_.n_head, .n_head_kv = cfg_.n_head_kv, .head_dim = cfg_.head_dim,
                     .scale = scale, .t_kv = t_kv, .n_docs = in.n_docs, .window = cfg_.window_of(l),
                     .softcap = float(cfg_.attn_logit_softcapping), .sinks = W.sinks});
  if (cfg_.sandwich_norms) {
    linear_fwd(a.attn_out, a.att, l, O, a, train, seed);  // xmid = norm(o_proj(att)) ...
    be_.rmsnorm_fwd({.out = a.xmid, .rstd = a.rstd_pa, .x = a.attn_out, .w = W.post_attn_w, .n = n,
                     .c = cfg_.hidden_size, .eps = eps, .w_offset = w_off});
  } else {
    linear_fwd(a.xmid, a.att, l, O, a, train, seed);  // xmid = o_proj(att) ...
  }
  be_.add({.y = a.xmid, .x = a.x, .n = a.xmid.numel()});  // ... + x
  be_.rmsnorm_fwd({.out = a.ln2, .rstd = a.rstd2, .x = a.xmid, .w = W.ln2_w, .n = n, .c = cfg_.hidden_size, .eps = eps,
                   .w_offset = w_off});
  if (cfg_.moe()) {
    moe_fwd(a, next, l, n, train && !recompute && !in.decoding && adapters_->enabled());  // next = experts(ln2) ...
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
void DecoderModel::mlp_out_fwd(const Acts& a, const Tensor& out, const Tensor& h, int64_t l, int64_t row0, bool train,
                             uint64_t seed) {
  if (!cfg_.sandwich_norms) return linear_fwd(out, h, l, D, a, train, seed, row0);
  const int64_t m = h.dim(0);
  const Tensor y = with_rows(a.mlp_out, m);
  linear_fwd(y, h, l, D, a, train, seed, row0);
  be_.rmsnorm_fwd({.out = out, .rstd = row_slice(a.rstd_pf, row0, m), .x = y, .w = base_->layer(l).post_ff_w, .n = m,
                   .c = cfg_.hidden_size, .eps = float(cfg_.rms_norm_eps), .w_offset = norm_offset()});
}

// One tile's rows [t0, t0 + m): its ln2 rows and gate = gate_proj(ln2), up = up_proj(ln2),
// h = swiglu(gate, up) computed into the one-tile buffers.
DecoderModel::MlpTile DecoderModel::mlp_tile_fwd(const Acts& a, int64_t l, int64_t t0, int64_t m, bool train, uint64_t seed) {
  MlpTile t{row_slice(a.ln2, t0, m), with_rows(a.gate, m), with_rows(a.up, m), with_rows(a.h, m)};
  linear_fwd(t.gate, t.ln2, l, G, a, train, seed, t0);
  linear_fwd(t.up, t.ln2, l, U, a, train, seed, t0);
  be_.swiglu_fwd({.out = t.h, .gate = t.gate, .up = t.up, .n = t.h.numel(), .act = cfg_.hidden_act,
                  .clamp = cfg_.swiglu_clamp});
  return t;
}

// next = xmid + down(swiglu(gate(ln2), up(ln2))), mlp_rows_ tokens at a time through the one-tile
// gate/up/h buffers.
void DecoderModel::mlp_fwd_tiled(const Acts& a, const Tensor& next, int64_t l, int64_t n, bool train, uint64_t seed) {
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
void DecoderModel::mlp_bwd_tiled(const Acts& a, int64_t l, int64_t n, uint64_t seed) {
  const StepViews& w = *views_;
  const LayerWeights& W = base_->layer(l);
  const LayerWeights& dW = base_->grad(l);  // full fine-tuning: the weights' gradients
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
      be_.rmsnorm_bwd({.dx = dln, .dw = dW.post_ff_w, .dout = dy, .x = with_rows(a.mlp_out, m), .w = W.post_ff_w,
                       .rstd = row_slice(a.rstd_pf, t0, m), .n = m, .c = C, .w_offset = norm_offset()});
      dy = dln;
    } else if (adapters_->index(l, D) >= 0) {
      lora_h_fwd(h, l, D, a, true, seed, t0);
    }
    linear_bwd(dh, false, dy, h, l, D, a, seed, true, t0);  // dh = ; dA,dB +=
    be_.swiglu_bwd({.dgate = dgate, .dup = dup, .dout = dh, .gate = gate, .up = up, .n = m * F, .act = cfg_.hidden_act,
                    .clamp = cfg_.swiglu_clamp});  // dgate, dup =
    linear_bwd(dln, false, dgate, ln2, l, G, a, seed, true, t0);                                  // dln =
    linear_bwd(dln, true, dup, ln2, l, U, a, seed, true, t0);                                     // dln +=
  }
}

// On entry ws.dres holds d(layer output); on exit d(layer input).
void DecoderModel::layer_bwd(const StepInputs& in, int64_t l, int64_t n, uint64_t seed) {
  if (ckpt_) layer_fwd(in, l, n, true, seed, true);  // recompute this layer's activations from its saved input
  const Acts a = acts(l, n);
  const LayerViews& L = layers_[size_t(l)];
  const LayerWeights& W = base_->layer(l);
  const LayerWeights& dW = base_->grad(l);  // full fine-tuning: the weights' gradients "+="
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
      be_.rmsnorm_bwd({.dx = dln, .dw = dW.post_ff_w, .dout = dres, .x = a.mlp_out, .w = W.post_ff_w, .rstd = a.rstd_pf,
                       .n = n, .c = C, .w_offset = w_off});
      dy = dln;
    }
    linear_bwd(tmp_f, false, dy, a.h, l, D, a, seed);                       // dh = ; dA,dB +=
    be_.swiglu_bwd({.dgate = dgate, .dup = dup, .dout = tmp_f, .gate = a.gate, .up = a.up, .n = n * F,
                    .act = cfg_.hidden_act});  // dgate, dup =
    linear_bwd(dln, false, dgate, a.ln2, l, G, a, seed);                    // dln =
    linear_bwd(dln, true, dup, a.ln2, l, U, a, seed);                       // dln +=
  }
  be_.rmsnorm_bwd({.dx = tmp_c, .dw = dW.ln2_w, .dout = dln, .x = a.xmid, .w = W.ln2_w, .rstd = a.rstd2, .n = n, .c = C,
                   .w_offset = w_off});
  be_.add({.y = dres, .x = tmp_c, .n = n * C});  // dres = d xmid

  // Attention: xmid = x + [norm](o(attn(rope(q(ln1)), rope(k(ln1)), v(ln1)))), ln1 = rmsnorm(x)
  Tensor datt = with_rows(w.datt, n), dq = with_rows(w.dq, n), dk = with_rows(w.dk, n), dv = with_rows(w.dv, n);
  Tensor d_o = dres;  // d(o_proj's output): through the post-attention norm into dln (free again)
  if (cfg_.sandwich_norms) {
    be_.rmsnorm_bwd({.dx = dln, .dw = dW.post_attn_w, .dout = dres, .x = a.attn_out, .w = W.post_attn_w, .rstd = a.rstd_pa,
                     .n = n, .c = C, .w_offset = w_off});
    d_o = dln;
  }
  linear_bwd(datt, false, d_o, a.att, l, O, a, seed);                       // datt =
  const float scale = cfg_.attn_scale();
  be_.attention_bwd({.dq = dq, .dk = dk, .dv = dv, .dout = datt, .q = a.q, .k = a.k, .v = a.v, .out = a.att,
                     .lse = a.lse, .seg = in.seg, .b = in.b, .t = in.t, .n_head = cfg_.n_head,
                     .n_head_kv = cfg_.n_head_kv, .head_dim = cfg_.head_dim, .scale = scale, .n_docs = in.n_docs,
                     .window = cfg_.window_of(l), .softcap = float(cfg_.attn_logit_softcapping),
                     .sinks = W.sinks.data != nullptr, .dq_mode = opts_.attn_dq});  // dq, dk, dv =
  be_.rope_bwd({.x = dq, .inv_freq = inv_freq, .positions = in.positions, .n = n, .n_head = cfg_.n_head,
                .head_dim = cfg_.head_dim, .rotary_dim = cfg_.rope_dim(), .scale = rope_.scale});
  be_.rope_bwd({.x = dk, .inv_freq = inv_freq, .positions = in.positions, .n = n, .n_head = cfg_.n_head_kv,
                .head_dim = cfg_.head_dim, .rotary_dim = cfg_.rope_dim(), .scale = rope_.scale});
  // The first layer's input is the frozen embedding: nothing needs its gradient, so layer 0
  // computes only the LoRA gradients of q, k, v (no dgrad GEMMs, no input-norm backward), unless
  // the embedding is trained too (full fine-tuning).
  const bool dx = l > 0 || dW.ln1_w.data != nullptr;
  // qk_norm: back through the per-head norms (frozen weights) into ws.datt, free since
  // attention_bwd; q's gradient is consumed by its projection before k's overwrites it.
  const int64_t hd = cfg_.head_dim, hq = n * cfg_.n_head, hk = n * cfg_.n_head_kv;
  auto through_norm = [&](Tensor& d, const Tensor& raw, const Tensor& w_norm, const Tensor& dw_norm, const Tensor& rstd,
                          int64_t rows, int64_t cols) {
    if (!cfg_.qk_norm) return;
    const Tensor d_raw = as_matrix(w.datt, n, cols);
    be_.rmsnorm_bwd({.dx = as_matrix(d_raw, rows, hd), .dw = dw_norm, .dout = as_matrix(d, rows, hd),
                     .x = as_matrix(raw, rows, hd), .w = w_norm, .rstd = rstd, .n = rows, .c = hd, .w_offset = w_off});  // d_raw =
    d = d_raw;
  };
  through_norm(dq, a.q_raw, W.q_norm_w, dW.q_norm_w, a.rstd_q, hq, cfg_.q_dim());
  linear_bwd(dln, false, dq, a.ln1, l, Q, a, seed, dx);                     // dln =
  through_norm(dk, a.k_raw, W.k_norm_w, dW.k_norm_w, a.rstd_k, hk, cfg_.kv_dim());
  linear_bwd(dln, true, dk, a.ln1, l, K, a, seed, dx);                      // dln +=
  linear_bwd(dln, true, dv, a.ln1, l, V, a, seed, dx);                      // dln +=
  if (!dx) return;
  be_.rmsnorm_bwd({.dx = tmp_c, .dw = dW.ln1_w, .dout = dln, .x = a.x, .w = W.ln1_w, .rstd = a.rstd1, .n = n, .c = C,
                   .w_offset = w_off});
  be_.add({.y = dres, .x = tmp_c, .n = n * C});  // dres = d x
}

}  // namespace qlora
