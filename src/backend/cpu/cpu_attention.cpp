// CPU causal attention, flash-style in fp32: tiles of queries and keys multiplied through BLAS,
// online softmax, no T x T buffer; key tiles outside a query's document are skipped.
// Forward parallel over (batch, head, query tile); backward over the key tiles of each
// (batch, kv head), with deterministic per-thread dQ partial sums.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_simd.h"
#include "core/error.h"

namespace qlora {

namespace {

constexpr int64_t kFwdQ = 64, kFwdK = 256;  // forward tile: queries x keys
constexpr int64_t kBwdQ = 64, kBwdK = 64;   // backward tile: queries x keys
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct AttnDims {
  int64_t b, t, hq, hkv, d, group;
};

// Shared checks for fwd and bwd: head counts must divide, scale must be set, window >= 0.
AttnDims attn_dims(const char* op, int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t d, float scale,
                   int64_t window) {
  if (window < 0) fail(ErrorKind::Internal, std::string("cpu op ") + op + ", argument 'window'", "must be >= 0");
  cpu::check_dim(op, "b", b);
  cpu::check_dim(op, "t", t);
  cpu::check_dim(op, "head_dim", d);
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0)
    fail(ErrorKind::Shape, std::string("cpu op ") + op + ", dimension 'n_head'",
         "n_head " + std::to_string(hq) + " is not a positive multiple of n_head_kv " + std::to_string(hkv));
  if (!(scale > 0.0f) || !std::isfinite(scale))
    fail(ErrorKind::Internal, std::string("cpu op ") + op + ", argument 'scale'",
         "scale must be positive and finite, got " + std::to_string(scale), "normally 1/sqrt(head_dim)");
  if (std::max({t, hq * d}) > INT32_MAX)
    fail(ErrorKind::Unsupported, std::string("cpu op ") + op, "a dimension exceeds the 32-bit BLAS interface");
  return {b, t, hq, hkv, d, hq / hkv};
}

// Which keys each query of one batch row may see: query t sees key s iff s <= t and
// seg[s] == seg[t]. first[t] is the first token of t's document (keys before it are skipped
// tile by tile); run[t] is where the run of equal seg values ending at t starts (a tile pair
// inside one run and below the diagonal needs no per-element mask). Exact for any seg layout.
// With a KV cache (off > 0, seg null) query t sits at position t + off and sees keys s <= t + off.
// A sliding window (window > 0) also hides keys s <= t + off - window.
struct RowVis {
  const int32_t* seg = nullptr;
  std::vector<int64_t> first, run;
  int64_t off = 0;
  int64_t window = 0;

  RowVis(const int32_t* seg_b, int64_t t_len, int64_t off_ = 0)
      : seg(seg_b), first(size_t(t_len), 0), run(size_t(t_len), 0), off(off_) {
    if (!seg) return;
    std::unordered_map<int32_t, int64_t> seen;
    for (int64_t t = 0; t < t_len; t++) {
      first[size_t(t)] = seen.try_emplace(seg[t], t).first->second;
      run[size_t(t)] = t > 0 && seg[t] == seg[t - 1] ? run[size_t(t - 1)] : t;
    }
  }
  bool visible(int64_t s, int64_t t) const {
    return s <= t + off && (!seg || seg[s] == seg[t]) && (window == 0 || t + off - s < window);
  }
  // The first key query t may see.
  int64_t first_key(int64_t t) const {
    int64_t f = seg ? first[size_t(t)] : 0;
    if (window > 0) f = std::max(f, t + off - window + 1);
    return f;
  }
  // The smallest first key over the queries [q0, q1).
  int64_t tile_first(int64_t q0, int64_t q1) const {
    int64_t f = q0 + off;
    for (int64_t t = q0; t < q1; t++) f = std::min(f, first_key(t));
    return f;
  }
  // Every key of [k0, k1) is visible to every query of [q0, q1).
  bool all_visible(int64_t k0, int64_t k1, int64_t q0, int64_t q1) const {
    return k1 - 1 <= q0 + off && run[size_t(q1 - 1)] <= k0 && (window == 0 || q1 - 1 + off - k0 < window);
  }
  // s[i*ld + j] = -inf where key k0+j is hidden from query q0+i.
  void mask(float* s, int64_t ld, int64_t q0, int64_t m, int64_t k0, int64_t n) const {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++)
        if (!visible(k0 + j, q0 + i)) s[i * ld + j] = kNegInf;
  }
};

std::vector<RowVis> row_visibility(const int32_t* seg, int64_t b, int64_t t) {
  std::vector<RowVis> rows;
  rows.reserve(size_t(b));
  for (int64_t bi = 0; bi < b; bi++) rows.emplace_back(seg ? seg + bi * t : nullptr, t);
  return rows;
}

// Row-major sgemm on strided tiles: C (m,n) = alpha op(A) op(B) + beta C.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Gemma 2's soft-capping of an (m,n) tile of scores (row stride ld), as transformers computes it:
// s / c, tanh, * c in f32; dtanh (optional, same layout) "=" 1 - tanh^2 for the backward.
void softcap_tile(float* s, int64_t ld, int64_t m, int64_t n, float c, float* dtanh) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      const float t = std::tanh(s[i * ld + j] / c);
      s[i * ld + j] = t * c;
      if (dtanh) dtanh[i * ld + j] = 1.0f - t * t;
    }
}

}  // namespace

void CpuBackend::attention_fwd(const AttentionFwdArgs& a) {
  const char* op = "attention_fwd";
  const AttnDims g = attn_dims(op, a.b, a.t, a.n_head, a.n_head_kv, a.head_dim, a.scale, a.window);
  const int64_t tk = a.t_kv == 0 ? g.t : a.t_kv, off = tk - g.t;  // keys per sequence; query position offset
  if (off < 0 || (off > 0 && a.seg))
    fail(ErrorKind::Internal, std::string("cpu op ") + op + ", argument 't_kv'",
         "t_kv " + std::to_string(a.t_kv) + " must be 0 or at least t " + std::to_string(g.t) +
             (off > 0 ? ", and a KV cache takes no segments" : ""));
  const int64_t nq = g.b * g.t * g.hq * g.d, nkv = g.b * tk * g.hkv * g.d;
  cpu::check_f32(op, "out", a.out, nq);
  cpu::check_f32(op, "lse", a.lse, g.b * g.hq * g.t);
  cpu::check_f32(op, "q", a.q, nq);
  cpu::check_f32(op, "k", a.k, nkv);
  cpu::check_f32(op, "v", a.v, nkv);
  if (a.sinks.data) cpu::check_f32(op, "sinks", a.sinks, g.hq);
  if (nq == 0) return;
  const float* sinks = a.sinks.data ? a.sinks.f32() : nullptr;  // (Hq)
  float* out = a.out.f32();    // (B,T,Hq,D)
  float* lse = a.lse.f32();    // (B,Hq,T)
  const float* q = a.q.f32();  // (B,T,Hq,D)
  const float* k = a.k.f32();  // (B,T,Hkv,D)
  const float* v = a.v.f32();  // (B,T,Hkv,D)
  const int64_t ldq = g.hq * g.d, ldk = g.hkv * g.d;
  std::vector<RowVis> vis = row_visibility(a.seg, g.b, g.t);
  for (RowVis& r : vis) r.off = off, r.window = a.window;
  const int64_t nqt = ceil_div(g.t, kFwdQ), bh = g.b * g.hq;

#pragma omp parallel if (g.b * g.hq * g.t * tk * g.d > cpu::kParallelMin)
  {
    std::vector<float> s(size_t(kFwdQ * kFwdK));  // (Bq,Bk) scores, then probabilities
    std::vector<float> o(size_t(kFwdQ * g.d));     // (Bq,D) unnormalized output
    std::vector<float> mrow(static_cast<size_t>(kFwdQ)), lrow(static_cast<size_t>(kFwdQ));  // running max and sum per query
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < nqt * bh; it++) {
      const int64_t qt = nqt - 1 - it / bh;  // the longest key ranges first
      const int64_t bi = (it % bh) / g.hq, h = it % g.hq, hk = h / g.group;
      const RowVis& rv = vis[size_t(bi)];
      const int64_t q0 = qt * kFwdQ, q1 = std::min(g.t, q0 + kFwdQ), m = q1 - q0;
      const float* qp = q + ((bi * g.t + q0) * g.hq + h) * g.d;
      std::fill(o.begin(), o.end(), 0.0f);
      // A sink starts each row's softmax as one more logit that attends to nothing: max sinks[h], sum e^0.
      std::fill(mrow.begin(), mrow.end(), sinks ? sinks[h] : kNegInf);
      std::fill(lrow.begin(), lrow.end(), sinks ? 1.0f : 0.0f);
      for (int64_t k0 = rv.tile_first(q0, q1); k0 < q1 + off; k0 += kFwdK) {
        const int64_t k1 = std::min(q1 + off, k0 + kFwdK), n = k1 - k0;
        const int64_t kvo = ((bi * tk + k0) * g.hkv + hk) * g.d;
        gemm(false, true, m, n, g.d, a.scale, qp, ldq, k + kvo, ldk, 0.0f, s.data(), kFwdK);  // S = scale Q K^T
        if (a.softcap > 0) softcap_tile(s.data(), kFwdK, m, n, a.softcap, nullptr);           // S = c tanh(S / c)
        if (!rv.all_visible(k0, k1, q0, q1)) rv.mask(s.data(), kFwdK, q0, m, k0, n);
        for (int64_t i = 0; i < m; i++) {
          float* si = s.data() + i * kFwdK;
          const float mx = std::max(mrow[size_t(i)], cpu::row_max(si, n));
          if (mx == kNegInf) {  // nothing visible to this query yet
            std::fill_n(si, n, 0.0f);
            continue;
          }
          const float alpha = mrow[size_t(i)] == kNegInf ? 0.0f : std::exp(mrow[size_t(i)] - mx);
          const float sum = cpu::exp_sub_sum(si, n, mx);  // P = exp(S - max)
          lrow[size_t(i)] = lrow[size_t(i)] * alpha + sum;
          mrow[size_t(i)] = mx;
          if (alpha != 1.0f) cpu::scale_row(o.data() + i * g.d, g.d, alpha);
        }
        gemm(false, false, m, g.d, n, 1.0f, s.data(), kFwdK, v + kvo, ldk, 1.0f, o.data(), g.d);  // O += P V
      }
      for (int64_t i = 0; i < m; i++) {
        float* ot = out + ((bi * g.t + q0 + i) * g.hq + h) * g.d;
        const float inv = 1.0f / lrow[size_t(i)];
        for (int64_t d = 0; d < g.d; d++) ot[d] = o[size_t(i * g.d + d)] * inv;
        lse[(bi * g.hq + h) * g.t + q0 + i] = mrow[size_t(i)] + std::log(lrow[size_t(i)]);
      }
    }
  }
}

// P = exp(scale Q K^T - lse) is recomputed per tile. Each (batch, kv head) is one round: threads
// take its key tiles (and so own those rows of dK, dV), every query head of the group included;
// dQ contributions go to the thread's own (T, group*D) partial sum, added up in thread order at
// the end of the round. Tiles go to threads in a fixed snake order, so for a given thread count
// the result is the same bits on every run.
void CpuBackend::attention_bwd(const AttentionBwdArgs& a) {
  const char* op = "attention_bwd";
  const AttnDims g = attn_dims(op, a.b, a.t, a.n_head, a.n_head_kv, a.head_dim, a.scale, a.window);
  const int64_t nq = g.b * g.t * g.hq * g.d, nkv = g.b * g.t * g.hkv * g.d;
  cpu::check_f32(op, "dq", a.dq, nq);
  cpu::check_f32(op, "dk", a.dk, nkv);
  cpu::check_f32(op, "dv", a.dv, nkv);
  cpu::check_f32(op, "dout", a.dout, nq);
  cpu::check_f32(op, "q", a.q, nq);
  cpu::check_f32(op, "k", a.k, nkv);
  cpu::check_f32(op, "v", a.v, nkv);
  cpu::check_f32(op, "out", a.out, nq);
  cpu::check_f32(op, "lse", a.lse, g.b * g.hq * g.t);
  if (nq == 0) return;
  float* dq = a.dq.f32();            // (B,T,Hq,D)
  float* dk = a.dk.f32();            // (B,T,Hkv,D)
  float* dv = a.dv.f32();            // (B,T,Hkv,D)
  const float* dout = a.dout.f32();  // (B,T,Hq,D)
  const float* q = a.q.f32();        // (B,T,Hq,D)
  const float* k = a.k.f32();        // (B,T,Hkv,D)
  const float* v = a.v.f32();        // (B,T,Hkv,D)
  const float* out = a.out.f32();    // (B,T,Hq,D)
  const float* lse = a.lse.f32();    // (B,Hq,T)
  const int64_t ldq = g.hq * g.d, ldk = g.hkv * g.d, gd = g.group * g.d;
  std::vector<RowVis> vis = row_visibility(a.seg, g.b, g.t);
  for (RowVis& r : vis) r.window = a.window;
  const int64_t nkt = ceil_div(g.t, kBwdK), nqt = ceil_div(g.t, kBwdQ);
  const bool par = g.b * g.hq * g.t * g.t * g.d > cpu::kParallelMin;
  const int max_threads = par ? omp_get_max_threads() : 1;
  std::vector<float> delta(size_t(g.b * g.hq * g.t));  // (B,Hq,T) sum_d dout*out = sum_s P dP
  std::vector<std::vector<float>> dq_part(size_t(max_threads), std::vector<float>(size_t(g.t * gd)));  // (T,group*D)

#pragma omp parallel if (par) num_threads(max_threads)
  {
    const int nthr = omp_get_num_threads(), me = omp_get_thread_num();
    std::vector<float> s(size_t(kBwdQ * kBwdK)), dp(size_t(kBwdQ * kBwdK));  // (Bq,Bk) P and dP/dS
    std::vector<float> dtanh(a.softcap > 0 ? size_t(kBwdQ * kBwdK) : 0);     // softcap: 1 - tanh^2 of the tile
    std::vector<float> dk_acc(size_t(kBwdK * g.d)), dv_acc(size_t(kBwdK * g.d));  // (Bk,D)
#pragma omp for schedule(static)
    for (int64_t r = 0; r < g.b * g.t * g.hq; r++) {
      const int64_t bi = r / (g.t * g.hq), t = (r / g.hq) % g.t, h = r % g.hq;
      delta[size_t((bi * g.hq + h) * g.t + t)] = cpu::dot_row(dout + r * g.d, out + r * g.d, g.d);
    }
    for (int64_t bi = 0; bi < g.b; bi++)
      for (int64_t hk = 0; hk < g.hkv; hk++) {
        const RowVis& rv = vis[size_t(bi)];
        float* part = dq_part[size_t(me)].data();
        std::fill_n(part, g.t * gd, 0.0f);
#pragma omp for schedule(static, 1)
        for (int64_t i = 0; i < ceil_div(nkt, nthr) * nthr; i++) {
          // snake order over key tiles (tile 0 sees the most queries): round r gives thread th
          // tile r*nthr + th, or r*nthr + nthr-1-th on odd rounds.
          const int64_t rnd = i / nthr, th = i % nthr;
          const int64_t kt = rnd * nthr + (rnd % 2 == 0 ? th : nthr - 1 - th);
          if (kt >= nkt) continue;
          const int64_t k0 = kt * kBwdK, k1 = std::min(g.t, k0 + kBwdK), n = k1 - k0;
          const int64_t kvo = ((bi * g.t + k0) * g.hkv + hk) * g.d;
          std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
          std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
          for (int64_t hh = 0; hh < g.group; hh++) {
            const int64_t h = hk * g.group + hh;
            for (int64_t qt = k0 / kBwdQ; qt < nqt; qt++) {
              const int64_t q0 = qt * kBwdQ, q1 = std::min(g.t, q0 + kBwdQ), m = q1 - q0;
              if (a.window > 0 && q0 - a.window >= k1 - 1) break;  // this and later query tiles are past the window
              if (rv.tile_first(q0, q1) >= k1) continue;  // no query of this tile sees these keys
              const int64_t qo = ((bi * g.t + q0) * g.hq + h) * g.d;
              gemm(false, true, m, n, g.d, a.scale, q + qo, ldq, k + kvo, ldk, 0.0f, s.data(), kBwdK);
              if (a.softcap > 0) softcap_tile(s.data(), kBwdK, m, n, a.softcap, dtanh.data());  // and 1 - tanh^2
              if (!rv.all_visible(k0, k1, q0, q1)) rv.mask(s.data(), kBwdK, q0, m, k0, n);
              const float* lse_h = lse + (bi * g.hq + h) * g.t + q0;
              for (int64_t i2 = 0; i2 < m; i2++) cpu::exp_sub_sum(s.data() + i2 * kBwdK, n, lse_h[i2]);  // P
              gemm(true, false, n, g.d, m, 1.0f, s.data(), kBwdK, dout + qo, ldq, 1.0f, dv_acc.data(), g.d);  // dV += P^T dO
              gemm(false, true, m, n, g.d, 1.0f, dout + qo, ldq, v + kvo, ldk, 0.0f, dp.data(), kBwdK);   // dP = dO V^T
              const float* dl = delta.data() + (bi * g.hq + h) * g.t + q0;
              for (int64_t i2 = 0; i2 < m; i2++)
                cpu::softmax_grad_row(dp.data() + i2 * kBwdK, s.data() + i2 * kBwdK, n, dl[i2]);  // dS = P o (dP - D)
              if (a.softcap > 0)  // through the cap: dS_raw = dS (1 - tanh^2)
                for (int64_t i2 = 0; i2 < m; i2++)
                  for (int64_t j = 0; j < n; j++) dp[size_t(i2 * kBwdK + j)] *= dtanh[size_t(i2 * kBwdK + j)];
              gemm(true, false, n, g.d, m, a.scale, dp.data(), kBwdK, q + qo, ldq, 1.0f, dk_acc.data(), g.d);  // dK += s dS^T Q
              gemm(false, false, m, g.d, n, a.scale, dp.data(), kBwdK, k + kvo, ldk, 1.0f,
                   part + q0 * gd + hh * g.d, gd);  // dQ += s dS K
            }
          }
          for (int64_t j = 0; j < n; j++) {
            std::memcpy(dk + kvo + j * ldk, dk_acc.data() + j * g.d, size_t(g.d) * 4);
            std::memcpy(dv + kvo + j * ldk, dv_acc.data() + j * g.d, size_t(g.d) * 4);
          }
        }  // implicit barrier: every partial dQ of this round is complete
#pragma omp for schedule(static)
        for (int64_t t = 0; t < g.t; t++) {
          float* dst = dq + ((bi * g.t + t) * g.hq + hk * g.group) * g.d;
          std::memcpy(dst, dq_part[0].data() + t * gd, size_t(gd) * 4);
          for (int th = 1; th < nthr; th++) cpu::add_row(dst, dq_part[size_t(th)].data() + t * gd, gd);
        }
      }
  }
}

}  // namespace qlora
