// CPU mixture-of-experts ops: top-k routing and its backward, and the row gathers and weighted
// sums that move tokens into the expert-sorted layout and back.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace qlora {

static void check_i32(const char* op, const char* tensor, const Tensor& t, int64_t numel) {
  if (t.data == nullptr && numel > 0) fail(ErrorKind::Internal, std::string(op) + ": " + tensor, "buffer is null");
  if (t.dtype != DType::I32)
    fail(ErrorKind::Internal, std::string(op) + ": " + tensor, std::string("dtype is ") + dtype_name(t.dtype) + ", expected i32");
  if (t.ndim > 0 && t.numel() != numel)
    fail(ErrorKind::Shape, std::string(op) + ": " + tensor,
         "has " + std::to_string(t.numel()) + " elements but the op needs " + std::to_string(numel));
}

// p = softmax(logits row) into p (E values), in f32 as torch computes softmax(dtype=float).
static void softmax_row(const float* l, float* p, int64_t e) {
  float mx = l[0];
  for (int64_t i = 1; i < e; i++) mx = std::max(mx, l[i]);
  float sum = 0;
  for (int64_t i = 0; i < e; i++) sum += (p[i] = std::exp(l[i] - mx));
  for (int64_t i = 0; i < e; i++) p[i] /= sum;
}

static void check_route(const char* op, int64_t n, int64_t e, int64_t k) {
  cpu::check_dim(op, "n", n);
  if (e <= 0 || k <= 0 || k > e)
    fail(ErrorKind::Internal, op, "top_k " + std::to_string(k) + " of " + std::to_string(e) + " experts");
}

void CpuBackend::moe_route_fwd(const MoeRouteArgs& a) {
  const char* op = "moe_route_fwd";
  const int64_t N = a.n, E = a.n_experts, K = a.top_k;
  check_route(op, N, E, K);
  cpu::check_f32(op, "logits", a.logits, N * E);
  check_i32(op, "expert", a.expert, N * K);
  cpu::check_f32(op, "weight", a.weight, N * K);
  check_i32(op, "row", a.row, N * K);
  check_i32(op, "token", a.token, N * K);
  cpu::check_f32(op, "row_weight", a.row_weight, N * K);
  check_i32(op, "offsets", a.offsets, E + 1);
  const float* logits = a.logits.f32();
  int32_t* expert = static_cast<int32_t*>(a.expert.data);
  float* weight = a.weight.f32();
#pragma omp parallel if (N * E > cpu::kParallelMin)
  {
    std::vector<float> p(static_cast<size_t>(E));  // one token's probabilities and expert order, per thread
    std::vector<int32_t> order(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; t++) {
      softmax_row(logits + t * E, p.data(), E);
      for (int64_t i = 0; i < E; i++) order[size_t(i)] = int32_t(i);
      // Descending p, the lower expert first among equals.
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t x, int32_t y) {
        return p[size_t(x)] > p[size_t(y)] || (p[size_t(x)] == p[size_t(y)] && x < y);
      });
      float z = 0;
      for (int64_t j = 0; j < K; j++) z += p[size_t(order[size_t(j)])];
      for (int64_t j = 0; j < K; j++) {
        expert[t * K + j] = order[size_t(j)];
        weight[t * K + j] = a.norm_topk ? p[size_t(order[size_t(j)])] / z : p[size_t(order[size_t(j)])];
      }
    }
  }
  // The expert-sorted layout: a counting sort of the (t, j) pairs, stable in token order.
  int32_t* offsets = static_cast<int32_t*>(a.offsets.data);
  std::fill(offsets, offsets + E + 1, 0);
  for (int64_t i = 0; i < N * K; i++) offsets[expert[i] + 1]++;
  for (int64_t e = 0; e < E; e++) offsets[e + 1] += offsets[e];
  std::vector<int32_t> next(offsets, offsets + E);
  int32_t* row = static_cast<int32_t*>(a.row.data);
  int32_t* token = static_cast<int32_t*>(a.token.data);
  float* row_weight = a.row_weight.f32();
  for (int64_t i = 0; i < N * K; i++) {
    const int32_t r = next[size_t(expert[i])]++;
    row[i] = r;
    token[r] = int32_t(i / K);
    row_weight[r] = weight[i];
  }
}

void CpuBackend::moe_route_bwd(const MoeRouteBwdArgs& a) {
  const char* op = "moe_route_bwd";
  const int64_t N = a.n, E = a.n_experts, K = a.top_k;
  check_route(op, N, E, K);
  cpu::check_f32(op, "dlogits", a.dlogits, N * E);
  cpu::check_f32(op, "dweight", a.dweight, N * K);
  cpu::check_f32(op, "logits", a.logits, N * E);
  check_i32(op, "expert", a.expert, N * K);
  const float* aux = nullptr;
  const float* mask = nullptr;
  if (a.aux_grad.data) {
    cpu::check_f32(op, "aux_grad", a.aux_grad, E);
    aux = a.aux_grad.f32();
    if (a.mask.data) cpu::check_f32(op, "mask", a.mask, N), mask = a.mask.f32();
  }
  const int32_t* expert = static_cast<const int32_t*>(a.expert.data);
#pragma omp parallel if (N * E > cpu::kParallelMin)
  {
    std::vector<float> p(static_cast<size_t>(E)), dp(static_cast<size_t>(E));  // per thread
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; t++) {
      softmax_row(a.logits.f32() + t * E, p.data(), E);
      std::fill(dp.begin(), dp.end(), 0.0f);
      const float* g = a.dweight.f32() + t * K;
      const int32_t* ex = expert + t * K;
      float z = 1, gw = 0;
      if (a.norm_topk) {
        z = 0;
        for (int64_t j = 0; j < K; j++) z += p[size_t(ex[j])];
        for (int64_t j = 0; j < K; j++) gw += g[j] * (p[size_t(ex[j])] / z);
      }
      for (int64_t j = 0; j < K; j++) dp[size_t(ex[j])] = (g[j] - gw) / z;
      if (aux) {
        const float m = mask ? mask[t] : 1.0f;
        for (int64_t e = 0; e < E; e++) dp[size_t(e)] += m * aux[e];
      }
      float dot = 0;
      for (int64_t e = 0; e < E; e++) dot += p[size_t(e)] * dp[size_t(e)];
      float* dl = a.dlogits.f32() + t * E;
      for (int64_t e = 0; e < E; e++) dl[e] = p[size_t(e)] * (dp[size_t(e)] - dot);
    }
  }
}

void CpuBackend::moe_router_stats(const MoeRouterStatsArgs& a) {
  const char* op = "moe_router_stats";
  const int64_t N = a.n, E = a.n_experts, K = a.top_k;
  check_route(op, N, E, K);
  cpu::check_f32(op, "prob_sum", a.prob_sum, E);
  cpu::check_f32(op, "count", a.count, E);
  cpu::check_f32(op, "logits", a.logits, N * E);
  check_i32(op, "expert", a.expert, N * K);
  if (a.mask.data) cpu::check_f32(op, "mask", a.mask, N);
  const int32_t* expert = static_cast<const int32_t*>(a.expert.data);
  std::vector<float> p(static_cast<size_t>(E)), ps(static_cast<size_t>(E), 0.0f), cs(static_cast<size_t>(E), 0.0f);
  for (int64_t t = 0; t < N; t++) {  // this layer's sums, then added to the running ones
    const float m = a.mask.data ? a.mask.f32()[t] : 1.0f;
    softmax_row(a.logits.f32() + t * E, p.data(), E);
    for (int64_t e = 0; e < E; e++) ps[size_t(e)] += m * p[size_t(e)];
    for (int64_t j = 0; j < K; j++) cs[size_t(expert[t * K + j])] += m;
  }
  for (int64_t e = 0; e < E; e++) a.prob_sum.f32()[e] += ps[size_t(e)], a.count.f32()[e] += cs[size_t(e)];
}

void CpuBackend::gather_rows(const GatherRowsArgs& a) {
  const char* op = "gather_rows";
  cpu::check_dim(op, "m", a.m);
  cpu::check_dim(op, "c", a.c);
  cpu::check_f32(op, "dst", a.dst, a.m * a.c);
  cpu::check_f32(op, "src", a.src, a.src.ndim > 0 ? a.src.numel() : 0);
  if (a.scale.data) cpu::check_f32(op, "scale", a.scale, a.m);
  if (a.m > 0) cpu::check_ptr(op, "index", a.index);
  const int64_t rows = a.src.ndim > 0 ? a.src.numel() / std::max<int64_t>(a.c, 1) : 0;
  const float* src = a.src.f32();
  const float* scale = a.scale.data ? a.scale.f32() : nullptr;
  float* dst = a.dst.f32();
  for (int64_t r = 0; a.src.ndim > 0 && r < a.m; r++)  // before the parallel loop, which must not throw
    if (a.index[r] < 0 || a.index[r] >= rows)
      fail(ErrorKind::Internal, op, "index " + std::to_string(a.index[r]) + " outside the source's " + std::to_string(rows) + " rows");
#pragma omp parallel for schedule(static) if (a.m * a.c > cpu::kParallelMin)
  for (int64_t r = 0; r < a.m; r++) {
    const int64_t s = a.index[r];
    const float f = scale ? scale[r] : 1.0f;
    for (int64_t i = 0; i < a.c; i++) dst[r * a.c + i] = src[s * a.c + i] * f;
  }
}

void CpuBackend::combine_rows(const CombineRowsArgs& a) {
  const char* op = "combine_rows";
  cpu::check_dim(op, "n", a.n);
  cpu::check_dim(op, "k", a.k);
  cpu::check_dim(op, "c", a.c);
  cpu::check_f32(op, "out", a.out, a.n * a.c);
  cpu::check_f32(op, "src", a.src, a.src.ndim > 0 ? a.src.numel() : 0);
  if (a.weight.data) cpu::check_f32(op, "weight", a.weight, a.n * a.k);
  if (a.n > 0) cpu::check_ptr(op, "row", a.row);
  const float* src = a.src.f32();
  const float* w = a.weight.data ? a.weight.f32() : nullptr;
  float* out = a.out.f32();
#pragma omp parallel for schedule(static) if (a.n * a.c * a.k > cpu::kParallelMin)
  for (int64_t t = 0; t < a.n; t++) {
    float* o = out + t * a.c;
    if (!a.accumulate) std::fill(o, o + a.c, 0.0f);
    for (int64_t j = 0; j < a.k; j++) {
      const float f = w ? w[t * a.k + j] : 1.0f;
      const float* s = src + int64_t(a.row[t * a.k + j]) * a.c;
      for (int64_t i = 0; i < a.c; i++) o[i] += f * s[i];
    }
  }
}

void CpuBackend::row_dots(const RowDotsArgs& a) {
  const char* op = "row_dots";
  cpu::check_dim(op, "n", a.n);
  cpu::check_dim(op, "k", a.k);
  cpu::check_dim(op, "c", a.c);
  cpu::check_f32(op, "out", a.out, a.n * a.k);
  cpu::check_f32(op, "a", a.a, a.n * a.c);
  cpu::check_f32(op, "b", a.b, a.b.ndim > 0 ? a.b.numel() : 0);
  if (a.n > 0) cpu::check_ptr(op, "row", a.row);
#pragma omp parallel for schedule(static) if (a.n * a.c * a.k > cpu::kParallelMin)
  for (int64_t t = 0; t < a.n; t++)
    for (int64_t j = 0; j < a.k; j++) {
      const float* x = a.a.f32() + t * a.c;
      const float* y = a.b.f32() + int64_t(a.row[t * a.k + j]) * a.c;
      float s = 0;
      for (int64_t i = 0; i < a.c; i++) s += x[i] * y[i];
      a.out.f32()[t * a.k + j] = s;
    }
}

}  // namespace qlora
