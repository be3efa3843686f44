// The decoder's head: final norm, LM head and cross-entropy over chunks of tokens (only the
// labeled rows), the logits of a forward, and generation's decode through the KV cache.
#include <algorithm>
#include <cmath>

#include "model/decoder_parts.h"

namespace qlora {

// Final norm, LM head and cross-entropy, one chunk of tokens at a time. Returns the summed loss.
// With backward, leaves d(final_x) in ws.dres. When some positions carry no label, their rows
// are left out: the labeled rows of final_ln are gathered into ws.tmp (the embedding op on a
// table of n rows), run through the head in chunks, and their gradient rows scattered back into
// ws.dln (which is zero elsewhere, as the loss does not depend on those positions).
double DecoderModel::head_and_loss(const StepInputs& in, int64_t n, bool backward, float grad_scale,
                                   const RowWeightFn* weigh, std::vector<float>* row_losses) {
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
  const bool subset = in.label_rows != nullptr;
  const int64_t m_rows = subset ? in.n_labeled : n;     // rows the head runs on
  const int32_t* targets = subset ? in.label_targets : in.targets;
  Tensor xs = fln, ds = dln;                           // (m_rows, C) head input and its gradient
  if (subset) {
    xs = as_matrix(w.tmp, m_rows, C);  // free until the layers' backward
    be_.embedding_fwd({.out = xs, .table = fln, .tokens = in.label_rows, .n = m_rows, .c = C, .vocab = n});
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
    be_.cross_entropy_fwd_bwd({.logits = logits, .dlogits = logits, .losses = l, .labels = targets + c0, .n = m,
                               .vocab = Vv, .grad_scale = weigh ? 1.0f : grad_scale,
                               .softcap = float(cfg_.final_logit_softcapping)});
    if (backward) {
      // The head's dgrad is interleaved with its forward chunk by chunk: timed apart, as backward.
      const double t0 = timing_.times ? synced_now() : 0.0;
      Tensor d = as_matrix(ds, m, C);
      d.data = static_cast<char*>(ds.data) + c0 * C * es;
      if (w.head_grad.data)  // full fine-tuning, before d overwrites the rows of x it shares
        be_.matmul({.c = w.head_grad, .a = logits, .b = x, .m = Vv, .n = C, .k = m, .trans_a = true, .trans_b = false,
                    .alpha = 1.0f, .beta = 1.0f});  // dW += dlogits^T x   (V,C)
      be_.matmul({.c = d, .a = logits, .b = head, .m = m, .n = C, .k = Vv, .trans_a = false, .trans_b = false,
                  .alpha = 1.0f, .beta = 0.0f});  // d[chunk] = dlogits W
      if (timing_.times) timing_.head_bwd_s += synced_now() - t0;
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
    const double t0 = timing_.times ? synced_now() : 0.0;
    if (subset) {
      be_.memset0(dln.data, size_t(n * C * es));
      be_.embedding_bwd({.dtable = dln, .dout = ds, .tokens = in.label_rows, .n = m_rows, .c = C, .vocab = n});  // dln[rows] += d
    }
    be_.rmsnorm_bwd({.dx = with_rows(w.dres, n), .dw = w.norm_grad, .dout = dln, .x = fx, .w = norm_w, .rstd = frstd,
                     .n = n, .c = C, .w_offset = norm_offset()});  // dres =
    if (timing_.times) timing_.head_bwd_s += synced_now() - t0;
  }
  return sum;
}

std::vector<float> DecoderModel::logits(const Batch& batch) {
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
void DecoderModel::softcap_logits(std::vector<float>& v) const {
  const float c = float(cfg_.final_logit_softcapping);
  if (c > 0)
    for (float& x : v) x = std::tanh(x / c) * c;
}

const std::vector<float>& DecoderModel::decode(const std::vector<int32_t>& ids) {
  const int64_t total = int64_t(ids.size()), C = cfg_.hidden_size, Vv = cfg_.vocab_size;
  if (total == 0) fail(ErrorKind::Data, "generate", "no tokens to feed", "the prompt encodes to no tokens");
  if (kv_capacity() == 0)
    fail(ErrorKind::Internal, "decode", "the model was planned without a KV cache", "set ModelPlanOptions::kv_cache_tokens");
  if (kv_.pos + total > kv_capacity())
    fail(ErrorKind::Config, "generate",
         "a sequence of " + std::to_string(kv_.pos + total) + " tokens does not fit the KV cache of " +
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
    for (int64_t i = 0; i < n; i++) b.positions[size_t(i)] = int32_t(kv_.pos + i);
    forward(b, false, 0, /*decoding=*/true);
    kv_.pos += n;
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
  kv_.logits.resize(size_t(Vv));
  be_.copy_to_host(kv_.logits.data(), lg.data, size_t(Vv) * 4);
  softcap_logits(kv_.logits);
  return kv_.logits;
}

}  // namespace qlora
