// CPU causal attention with grouped KV heads and packed-document segments, forward and backward.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace qlora {

namespace {

struct AttnDims {
  int64_t b, t, hq, hkv, d, group;
};

// Shared checks for fwd and bwd: head counts must divide, scale must be set.
AttnDims attn_dims(const char* op, int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t d, float scale) {
  cpu::check_dim(op, "b", b);
  cpu::check_dim(op, "t", t);
  cpu::check_dim(op, "head_dim", d);
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0)
    fail(ErrorKind::Shape, std::string("cpu op ") + op + ", dimension 'n_head'",
         "n_head " + std::to_string(hq) + " is not a positive multiple of n_head_kv " + std::to_string(hkv));
  if (!(scale > 0.0f) || !std::isfinite(scale))
    fail(ErrorKind::Internal, std::string("cpu op ") + op + ", argument 'scale'",
         "scale must be positive and finite, got " + std::to_string(scale), "normally 1/sqrt(head_dim)");
  return {b, t, hq, hkv, d, hq / hkv};
}

// Query t sees key s iff s <= t and both lie in the same document.
inline bool visible(const int32_t* seg_b, int64_t s, int64_t t) {
  return s <= t && (seg_b == nullptr || seg_b[s] == seg_b[t]);
}

// For each query t of a row: the first key position that can be visible to it (the first token of
// t's document), so loops skip earlier documents of a packed row instead of testing every key.
// Exact for any seg layout: keys between first[t] and t are still tested with visible().
std::vector<int64_t> first_keys(const int32_t* seg_b, int64_t t_len) {
  std::vector<int64_t> first(size_t(t_len), 0);
  if (!seg_b) return first;
  std::unordered_map<int32_t, int64_t> seen;
  for (int64_t t = 0; t < t_len; t++) first[size_t(t)] = seen.try_emplace(seg_b[t], t).first->second;
  return first;
}

// first_keys for every row of a (B,T) batch, flattened.
std::vector<int64_t> first_keys_all(const int32_t* seg, int64_t b, int64_t t_len) {
  std::vector<int64_t> all(size_t(b * t_len), 0);
  for (int64_t bi = 0; bi < b && seg; bi++) {
    const std::vector<int64_t> f = first_keys(seg + bi * t_len, t_len);
    std::copy(f.begin(), f.end(), all.begin() + bi * t_len);
  }
  return all;
}

inline double dot(const float* x, const float* y, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; i++) acc += double(x[i]) * double(y[i]);
  return acc;
}

}  // namespace

void CpuBackend::attention_fwd(const AttentionFwdArgs& a) {
  const char* op = "attention_fwd";
  const AttnDims g = attn_dims(op, a.b, a.t, a.n_head, a.n_head_kv, a.head_dim, a.scale);
  const int64_t nq = g.b * g.t * g.hq * g.d, nkv = g.b * g.t * g.hkv * g.d;
  cpu::check_f32(op, "out", a.out, nq);
  cpu::check_f32(op, "lse", a.lse, g.b * g.hq * g.t);
  cpu::check_f32(op, "q", a.q, nq);
  cpu::check_f32(op, "k", a.k, nkv);
  cpu::check_f32(op, "v", a.v, nkv);
  float* out = a.out.f32();    // (B,T,Hq,D)
  float* lse = a.lse.f32();    // (B,Hq,T)
  const float* q = a.q.f32();  // (B,T,Hq,D)
  const float* k = a.k.f32();  // (B,T,Hkv,D)
  const float* v = a.v.f32();  // (B,T,Hkv,D)
  const double ninf = -std::numeric_limits<double>::infinity();
  const std::vector<int64_t> first = first_keys_all(a.seg, g.b, g.t);

#pragma omp parallel if (g.b * g.hq * g.t * g.t * g.d > cpu::kParallelMin)
  {
    std::vector<double> p(size_t(g.t));  // (T) scores, then probabilities of one query
    std::vector<double> acc(size_t(g.d));  // (D)
#pragma omp for collapse(3) schedule(static)
    for (int64_t bi = 0; bi < g.b; bi++)
      for (int64_t h = 0; h < g.hq; h++)
        for (int64_t t = 0; t < g.t; t++) {
          const int32_t* seg_b = a.seg ? a.seg + bi * g.t : nullptr;
          const int64_t s0 = first[size_t(bi * g.t + t)];
          const int64_t hk = h / g.group;
          const float* qt = q + ((bi * g.t + t) * g.hq + h) * g.d;
          double mx = ninf;
          for (int64_t s = s0; s <= t; s++) {
            if (!visible(seg_b, s, t)) continue;
            p[size_t(s)] = dot(qt, k + ((bi * g.t + s) * g.hkv + hk) * g.d, g.d) * double(a.scale);
            mx = std::max(mx, p[size_t(s)]);
          }
          double sum = 0.0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t s = s0; s <= t; s++) {
            if (!visible(seg_b, s, t)) continue;
            const double e = std::exp(p[size_t(s)] - mx);
            sum += e;
            const float* vs = v + ((bi * g.t + s) * g.hkv + hk) * g.d;
            for (int64_t d = 0; d < g.d; d++) acc[size_t(d)] += e * double(vs[d]);
          }
          lse[(bi * g.hq + h) * g.t + t] = float(mx + std::log(sum));
          float* ot = out + ((bi * g.t + t) * g.hq + h) * g.d;
          for (int64_t d = 0; d < g.d; d++) ot[d] = float(acc[size_t(d)] / sum);
        }
  }
}

// Recomputes p = exp(scale*q.k - lse) per query; dk/dv of one kv head collect the contributions
// of every query head in its group, so threads own kv heads and never share an output row.
void CpuBackend::attention_bwd(const AttentionBwdArgs& a) {
  const char* op = "attention_bwd";
  const AttnDims g = attn_dims(op, a.b, a.t, a.n_head, a.n_head_kv, a.head_dim, a.scale);
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
  float* dq = a.dq.f32();            // (B,T,Hq,D)
  float* dk = a.dk.f32();            // (B,T,Hkv,D)
  float* dv = a.dv.f32();            // (B,T,Hkv,D)
  const float* dout = a.dout.f32();  // (B,T,Hq,D)
  const float* q = a.q.f32();        // (B,T,Hq,D)
  const float* k = a.k.f32();        // (B,T,Hkv,D)
  const float* v = a.v.f32();        // (B,T,Hkv,D)
  const float* out = a.out.f32();    // (B,T,Hq,D)
  const float* lse = a.lse.f32();    // (B,Hq,T)
  const double scale = a.scale;
  const std::vector<int64_t> first = first_keys_all(a.seg, g.b, g.t);

#pragma omp parallel if (g.b * g.hq * g.t * g.t * g.d > cpu::kParallelMin)
  {
    std::vector<double> dk_acc(size_t(g.t * g.d)), dv_acc(size_t(g.t * g.d));  // (T,D) one kv head
    std::vector<double> dq_acc(size_t(g.d));                                   // (D)
#pragma omp for collapse(2) schedule(static)
    for (int64_t bi = 0; bi < g.b; bi++)
      for (int64_t hk = 0; hk < g.hkv; hk++) {
        const int32_t* seg_b = a.seg ? a.seg + bi * g.t : nullptr;
        std::fill(dk_acc.begin(), dk_acc.end(), 0.0);
        std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
        for (int64_t h = hk * g.group; h < (hk + 1) * g.group; h++)
          for (int64_t t = 0; t < g.t; t++) {
            const int64_t qi = ((bi * g.t + t) * g.hq + h) * g.d;
            const float* qt = q + qi;
            const float* do_t = dout + qi;
            const double lse_t = lse[(bi * g.hq + h) * g.t + t];
            const double d_t = dot(do_t, out + qi, g.d);  // sum(dout*out) = sum_s p_s dp_s
            std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
            for (int64_t s = first[size_t(bi * g.t + t)]; s <= t; s++) {
              if (!visible(seg_b, s, t)) continue;
              const int64_t ki = ((bi * g.t + s) * g.hkv + hk) * g.d;
              const double p = std::exp(dot(qt, k + ki, g.d) * scale - lse_t);
              const double ds = p * (dot(do_t, v + ki, g.d) - d_t);
              double* dks = dk_acc.data() + s * g.d;
              double* dvs = dv_acc.data() + s * g.d;
              for (int64_t d = 0; d < g.d; d++) {
                dq_acc[size_t(d)] += ds * double(k[ki + d]);
                dks[d] += ds * double(qt[d]);
                dvs[d] += p * double(do_t[d]);
              }
            }
            for (int64_t d = 0; d < g.d; d++) dq[qi + d] = float(scale * dq_acc[size_t(d)]);
          }
        for (int64_t s = 0; s < g.t; s++) {
          const int64_t ki = ((bi * g.t + s) * g.hkv + hk) * g.d;
          for (int64_t d = 0; d < g.d; d++) {
            dk[ki + d] = float(scale * dk_acc[size_t(s * g.d + d)]);
            dv[ki + d] = float(dv_acc[size_t(s * g.d + d)]);
          }
        }
      }
  }
}

}  // namespace qlora
