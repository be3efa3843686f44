// CPU token embedding, RMSNorm and rotary embedding, forward and backward.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_simd.h"
#include "core/error.h"

namespace qlora {

// Token ids come from data files, so a bad one is a data error, checked before any write.
static void check_tokens(const char* op, const int32_t* tokens, int64_t n, int64_t vocab) {
  cpu::check_ptr(op, "tokens", tokens);
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      fail(ErrorKind::Data, std::string("cpu op ") + op + ", token " + std::to_string(i),
           "token id " + std::to_string(tokens[i]) + " is outside the vocabulary of size " +
               std::to_string(vocab),
           "the tokenizer and the model disagree on vocab_size");
}

void CpuBackend::embedding_fwd(const EmbeddingFwdArgs& a) {
  const char* op = "embedding_fwd";
  cpu::check_dim(op, "n", a.n);
  cpu::check_dim(op, "c", a.c);
  cpu::check_dim(op, "vocab", a.vocab);
  cpu::check_f32(op, "out", a.out, a.n * a.c);
  cpu::check_f32(op, "table", a.table, a.vocab * a.c);
  check_tokens(op, a.tokens, a.n, a.vocab);
  float* out = a.out.f32();            // (N,C)
  const float* table = a.table.f32();  // (V,C)
#pragma omp parallel for schedule(static) if (a.n * a.c > cpu::kParallelMin)
  for (int64_t i = 0; i < a.n; i++)
    std::copy_n(table + int64_t(a.tokens[i]) * a.c, a.c, out + i * a.c);
}

void CpuBackend::embedding_bwd(const EmbeddingBwdArgs& a) {
  const char* op = "embedding_bwd";
  cpu::check_dim(op, "n", a.n);
  cpu::check_dim(op, "c", a.c);
  cpu::check_dim(op, "vocab", a.vocab);
  cpu::check_f32(op, "dtable", a.dtable, a.vocab * a.c);
  cpu::check_f32(op, "dout", a.dout, a.n * a.c);
  check_tokens(op, a.tokens, a.n, a.vocab);
  float* dtable = a.dtable.f32();    // (V,C)
  const float* dout = a.dout.f32();  // (N,C)
  // Repeated tokens hit the same row, so threads split the columns, never the tokens.
  const int64_t blk = 64;
#pragma omp parallel for schedule(static) if (a.n * a.c > cpu::kParallelMin)
  for (int64_t j0 = 0; j0 < a.c; j0 += blk) {
    const int64_t j1 = std::min(a.c, j0 + blk);
    for (int64_t i = 0; i < a.n; i++) {
      float* dst = dtable + int64_t(a.tokens[i]) * a.c;
      for (int64_t j = j0; j < j1; j++) dst[j] += dout[i * a.c + j];
    }
  }
}

// Gemma's (w + 1), in f32 as its RMSNorm computes it; empty when there is no offset.
static std::vector<float> offset_weight(const Tensor& w, int64_t c, float offset) {
  if (offset == 0.0f) return {};
  std::vector<float> out(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; j++) out[size_t(j)] = w.f32()[j] + offset;
  return out;
}

void CpuBackend::rmsnorm_fwd(const RmsnormFwdArgs& a) {
  const char* op = "rmsnorm_fwd";
  cpu::check_dim(op, "n", a.n);
  cpu::check_dim(op, "c", a.c);
  cpu::check_f32(op, "out", a.out, a.n * a.c);
  cpu::check_f32(op, "rstd", a.rstd, a.n);
  cpu::check_f32(op, "x", a.x, a.n * a.c);
  cpu::check_f32(op, "w", a.w, a.c);
  if (a.c == 0) return;
  float* out = a.out.f32();    // (N,C)
  float* rstd = a.rstd.f32();  // (N)
  const float* x = a.x.f32();  // (N,C)
  const std::vector<float> w_off = offset_weight(a.w, a.c, a.w_offset);
  const float* w = w_off.empty() ? a.w.f32() : w_off.data();  // (C)
#pragma omp parallel for schedule(static) if (a.n * a.c > cpu::kParallelMin)
  for (int64_t i = 0; i < a.n; i++) rstd[i] = cpu::rmsnorm_fwd_row(out + i * a.c, x + i * a.c, w, a.c, a.eps);
}

void CpuBackend::rmsnorm_bwd(const RmsnormBwdArgs& a) {
  const char* op = "rmsnorm_bwd";
  cpu::check_dim(op, "n", a.n);
  cpu::check_dim(op, "c", a.c);
  cpu::check_f32(op, "dx", a.dx, a.n * a.c);
  if (!a.dw.empty()) cpu::check_f32(op, "dw", a.dw, a.c);
  cpu::check_f32(op, "dout", a.dout, a.n * a.c);
  cpu::check_f32(op, "x", a.x, a.n * a.c);
  cpu::check_f32(op, "w", a.w, a.c);
  cpu::check_f32(op, "rstd", a.rstd, a.n);
  if (a.c == 0) return;
  float* dx = a.dx.f32();            // (N,C)
  const float* dout = a.dout.f32();  // (N,C)
  const float* x = a.x.f32();        // (N,C)
  const std::vector<float> w_off = offset_weight(a.w, a.c, a.w_offset);
  const float* w = w_off.empty() ? a.w.f32() : w_off.data();  // (C)
  const float* rstd = a.rstd.f32();  // (N)
  const bool par = a.n * a.c > cpu::kParallelMin;

  // dw first: then dx may overwrite dout in place (callers reuse the gradient buffer).
  if (!a.dw.empty()) {
    float* dw = a.dw.f32();  // (C)
    const int64_t blk = 64;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t j0 = 0; j0 < a.c; j0 += blk) {
      const int64_t j1 = std::min(a.c, j0 + blk);
      double acc[blk] = {};
      for (int64_t i = 0; i < a.n; i++)
        for (int64_t j = j0; j < j1; j++)
          acc[j - j0] += double(dout[i * a.c + j]) * double(x[i * a.c + j]) * double(rstd[i]);
      for (int64_t j = j0; j < j1; j++) dw[j] += float(acc[j - j0]);
    }
  }

#pragma omp parallel for schedule(static) if (par)
  for (int64_t i = 0; i < a.n; i++)
    cpu::rmsnorm_bwd_row(dx + i * a.c, dout + i * a.c, x + i * a.c, w, rstd[i], a.c);
}

// Rotates each (j, j+D/2) pair of x by sign*angle. The angle is float(pos)*inv_freq[j] rounded
// to f32 exactly as HF computes it (its cos/sin then differ from ours by at most an ulp);
// a double angle would drift from HF by ~1e-4 at positions in the thousands. The cos/sin table of
// a batch's positions is kept: every layer's q and k, forward and backward, use the same one.
void CpuBackend::rope_apply(const char* op, const RopeArgs& a, float sign) {
  cpu::check_dim(op, "n", a.n);
  cpu::check_dim(op, "n_head", a.n_head);
  cpu::check_dim(op, "head_dim", a.head_dim);
  const int64_t rot = a.rot();
  if (rot % 2 != 0 || rot > a.head_dim)
    fail(ErrorKind::Shape, std::string("cpu op ") + op + ", dimension 'rotary_dim'",
         "rotary_dim " + std::to_string(rot) + " of head_dim " + std::to_string(a.head_dim) +
             ": rotary pairs need an even count, at most head_dim");
  const int64_t half = rot / 2;
  cpu::check_f32(op, "x", a.x, a.n * a.n_head * a.head_dim);
  cpu::check_f32(op, "inv_freq", a.inv_freq, half);
  cpu::check_ptr(op, "positions", a.positions);
  float* x = a.x.f32();                      // (N,H,D)
  const float* inv_freq = a.inv_freq.f32();  // (D/2)
  RopeTable& tb = rope_table_;
  const bool same = tb.half == half && tb.scale == a.scale && tb.positions.size() == size_t(a.n) &&
                    std::equal(tb.inv_freq.begin(), tb.inv_freq.end(), inv_freq) &&
                    std::equal(tb.positions.begin(), tb.positions.end(), a.positions);
  if (!same) {
    tb.half = half;
    tb.scale = a.scale;
    tb.positions.assign(a.positions, a.positions + a.n);
    tb.inv_freq.assign(inv_freq, inv_freq + half);
    tb.cos.resize(size_t(a.n * half));
    tb.sin.resize(size_t(a.n * half));
#pragma omp parallel for schedule(static) if (a.n * half > cpu::kParallelMin / 8)
    for (int64_t i = 0; i < a.n; i++) {
      const float pos = float(a.positions[i]);
      for (int64_t j = 0; j < half; j++) {
        const float ang = pos * inv_freq[j];
        // HF: cos(f32 angle) then times the attention factor, in f32
        tb.cos[size_t(i * half + j)] = float(std::cos(double(ang))) * a.scale;
        tb.sin[size_t(i * half + j)] = float(std::sin(double(ang))) * a.scale;
      }
    }
  }
#pragma omp parallel for schedule(static) if (a.n * a.n_head * a.head_dim > cpu::kParallelMin)
  for (int64_t i = 0; i < a.n; i++)
    for (int64_t h = 0; h < a.n_head; h++)
      cpu::rope_row(x + (i * a.n_head + h) * a.head_dim, tb.cos.data() + i * half, tb.sin.data() + i * half, half, sign);
}

void CpuBackend::rope_fwd(const RopeArgs& a) { rope_apply("rope_fwd", a, 1.0f); }
void CpuBackend::rope_bwd(const RopeArgs& a) { rope_apply("rope_bwd", a, -1.0f); }

}  // namespace qlora
