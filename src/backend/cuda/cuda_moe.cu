// CUDA mixture-of-experts ops: top-k routing (one thread per token), the expert-sorted layout
// (one block, deterministic: an expert's rows in token order), its backward, and the row gathers
// and weighted sums between the token layout and the expert-sorted one. Math in f32.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend_impl.cuh"

namespace qlora::cuda {

namespace {

constexpr int kThreads = 256;      // route, route_bwd
constexpr int kRowThreads = 128;   // gather_rows, combine_rows: one block per output row
constexpr int kSortThreads = 1024;  // the one block of route_sort_kernel
constexpr int kMaxK = 16;          // top_k bound of the per-thread arrays

// The softmax of one token's logits: max and 1 / sum of exp(l - max).
__device__ void softmax_stats(FPtr logits, int64_t base, int64_t e, float& mx, float& inv_sum) {
  mx = -INFINITY;
  for (int64_t i = 0; i < e; i++) mx = fmaxf(mx, ldf(logits, base + i));
  float s = 0;
  for (int64_t i = 0; i < e; i++) s += expf(ldf(logits, base + i) - mx);
  inv_sum = 1.0f / s;
}

__global__ void __launch_bounds__(kThreads)
    route_topk_kernel(FPtr logits, int32_t* expert, float* weight, int64_t n, int64_t e, int k, int norm_topk) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float mx, inv;
  softmax_stats(logits, t * e, e, mx, inv);
  // The choices go straight to expert/weight (no per-thread arrays: no local memory).
  int32_t* chosen = expert + t * k;
  float* w = weight + t * k;
  float z = 0;
  for (int j = 0; j < k; j++) {  // the j-th largest: descending p, the lower expert among equals
    int best = -1;
    float bp = -1.0f;
    for (int64_t i = 0; i < e; i++) {
      bool taken = false;
      for (int q = 0; q < j; q++) taken = taken || chosen[q] == int32_t(i);
      const float pi = expf(ldf(logits, t * e + i) - mx) * inv;
      if (!taken && pi > bp) bp = pi, best = int(i);
    }
    chosen[j] = best;
    w[j] = bp;
    z += bp;
  }
  if (norm_topk)
    for (int j = 0; j < k; j++) w[j] /= z;
}

// One block: offsets by counting, then each expert's rows in token order (thread e, strided,
// walks every (t, j) pair in order: deterministic, no atomics).
__global__ void __launch_bounds__(kSortThreads)
    route_sort_kernel(const int32_t* expert, const float* weight, int32_t* row, int32_t* token, float* row_weight,
                      int32_t* offsets, int64_t pairs, int64_t e, int k) {
  for (int64_t x = threadIdx.x; x < e; x += blockDim.x) {
    int32_t c = 0;
    for (int64_t i = 0; i < pairs; i++) c += expert[i] == int32_t(x);
    offsets[x + 1] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    for (int64_t x = 0; x < e; x++) offsets[x + 1] += offsets[x];
  }
  __syncthreads();
  for (int64_t x = threadIdx.x; x < e; x += blockDim.x) {
    int32_t r = offsets[x];
    for (int64_t i = 0; i < pairs; i++)
      if (expert[i] == int32_t(x)) {
        row[i] = r;
        token[r] = int32_t(i / k);
        row_weight[r] = weight[i];
        r++;
      }
  }
}

__global__ void __launch_bounds__(kThreads)
    route_bwd_kernel(FPtr dlogits, const float* dweight, FPtr logits, const int32_t* expert, int64_t n, int64_t e, int k,
                     int norm_topk, const float* aux, const float* mask) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float mx, inv;
  softmax_stats(logits, t * e, e, mx, inv);
  const int32_t* ex = expert + t * k;
  const float* g = dweight + t * k;
  float z = 1, gw = 0;
  if (norm_topk) {
    z = 0;
    for (int j = 0; j < k; j++) z += expf(ldf(logits, t * e + ex[j]) - mx) * inv;
    for (int j = 0; j < k; j++) gw += g[j] * (expf(ldf(logits, t * e + ex[j]) - mx) * inv / z);
  }
  // dp is (g_j - gw) / z on the chosen experts, 0 elsewhere, plus m aux[i] everywhere with the
  // load-balancing loss; dot = sum_e p_e dp_e.
  const float m = aux ? (mask ? mask[t] : 1.0f) : 0.0f;
  auto dp_of = [&](int64_t i) {
    float dp = 0;
    for (int j = 0; j < k; j++)
      if (ex[j] == int32_t(i)) dp = (g[j] - gw) / z;
    return aux ? dp + m * aux[i] : dp;
  };
  float dot = 0;
  if (aux) {
    for (int64_t i = 0; i < e; i++) dot += expf(ldf(logits, t * e + i) - mx) * inv * dp_of(i);
  } else {
    for (int j = 0; j < k; j++) dot += expf(ldf(logits, t * e + ex[j]) - mx) * inv * ((g[j] - gw) / z);
  }
  for (int64_t i = 0; i < e; i++) stf(dlogits, t * e + i, expf(ldf(logits, t * e + i) - mx) * inv * (dp_of(i) - dot));
}

// One block per expert: the sums over tokens in a fixed order (each thread's strided tokens, then
// the block's tree), each token's softmax recomputed (O(N E) per expert; the loss's statistics
// only, once per layer and forward).
__global__ void __launch_bounds__(kThreads)
    router_stats_kernel(float* prob_sum, float* count, FPtr logits, const int32_t* expert, const float* mask, int64_t n,
                        int64_t e, int k) {
  QLORA_SHARED(float[32], red);
  const int64_t x = blockIdx.x;
  float ps = 0, cs = 0;
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
    const float m = mask ? mask[t] : 1.0f;
    float mx, inv;
    softmax_stats(logits, t * e, e, mx, inv);
    ps += m * (expf(ldf(logits, t * e + x) - mx) * inv);
    for (int j = 0; j < k; j++) cs += expert[t * k + j] == int32_t(x) ? m : 0.0f;
  }
  ps = block_sum(ps, red);
  cs = block_sum(cs, red);
  if (threadIdx.x == 0) prob_sum[x] += ps, count[x] += cs;
}

__global__ void __launch_bounds__(kRowThreads)
    gather_rows_kernel(FPtr dst, FPtr src, const float* scale, const int32_t* index, int64_t c) {
  const int64_t r = blockIdx.x;
  const int64_t s = index[r];
  const float f = scale ? scale[r] : 1.0f;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) stf(dst, r * c + i, ldf(src, s * c + i) * f);
}

__global__ void __launch_bounds__(kRowThreads)
    combine_rows_kernel(FPtr out, FPtr src, const float* weight, const int32_t* row, int64_t k, int64_t c, int acc) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    float v = acc ? ldf(out, t * c + i) : 0.0f;
    for (int64_t j = 0; j < k; j++) v += (weight ? weight[t * k + j] : 1.0f) * ldf(src, int64_t(row[t * k + j]) * c + i);
    stf(out, t * c + i, v);
  }
}

// One warp per (t, j) pair.
__global__ void __launch_bounds__(kThreads)
    row_dots_kernel(float* out, FPtr a, FPtr b, const int32_t* row, int64_t pairs, int64_t k, int64_t c) {
  const int64_t pair = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x % 32);
  if (pair >= pairs) return;  // whole warps leave together (pairs are warp-uniform)
  const int64_t t = pair / k, br = row[pair];
  float s = 0;
  for (int64_t i = lane; i < c; i += 32) s += ldf(a, t * c + i) * ldf(b, br * c + i);
  s = warp_sum(s);
  if (lane == 0) out[pair] = s;
}

void check_i32(const char* op, const char* name, const Tensor& t, int64_t numel) {
  if (!t.data && numel > 0) fail(ErrorKind::Internal, std::string("cuda op ") + op + ": " + name, "buffer is null");
  if (t.dtype != DType::I32)
    fail(ErrorKind::Internal, std::string("cuda op ") + op + ": " + name, std::string("dtype is ") + dtype_name(t.dtype) + ", expected i32");
  if (t.ndim > 0 && t.numel() != numel)
    fail(ErrorKind::Shape, std::string("cuda op ") + op + ": " + name,
         "has " + std::to_string(t.numel()) + " elements but the op needs " + std::to_string(numel));
}

void check_route(const char* op, int64_t n, int64_t e, int64_t k) {
  check_dim(op, "n", n);
  if (e <= 0 || k <= 0 || k > e) fail(ErrorKind::Internal, std::string("cuda op ") + op, "top_k " + std::to_string(k) + " of " + std::to_string(e) + " experts");
  if (k > kMaxK) unsupported(op, "top_k " + std::to_string(k) + " (at most " + std::to_string(kMaxK) + ")");
}

int blocks_for(int64_t threads, int per_block) { return int(std::max<int64_t>(1, ceil_div64(threads, per_block))); }

}  // namespace

void CudaBackend::moe_route_fwd(const MoeRouteArgs& a) {
  const char* op = "moe_route_fwd";
  const int64_t N = a.n, E = a.n_experts, K = a.top_k;
  check_route(op, N, E, K);
  check_tensor(op, "logits", a.logits, N * E, true, true);
  check_i32(op, "expert", a.expert, N * K);
  check_tensor(op, "weight", a.weight, N * K, false, true);
  check_i32(op, "row", a.row, N * K);
  check_i32(op, "token", a.token, N * K);
  check_tensor(op, "row_weight", a.row_weight, N * K, false, true);
  check_i32(op, "offsets", a.offsets, E + 1);
  int32_t* expert = static_cast<int32_t*>(a.expert.data);
  if (N > 0) {
    launch(route_topk_kernel, {blocks_for(N, kThreads), kThreads, 0, stream()}, fptr(a.logits), expert, a.weight.f32(), N,
           E, int(K), int(a.norm_topk));
    QLORA_CUDA_LAUNCH_CHECK();
  }
  launch(route_sort_kernel, {1, kSortThreads, 0, stream()}, static_cast<const int32_t*>(expert),
         static_cast<const float*>(a.weight.f32()), static_cast<int32_t*>(a.row.data), static_cast<int32_t*>(a.token.data),
         a.row_weight.f32(), static_cast<int32_t*>(a.offsets.data), N * K, E, int(K));
  QLORA_CUDA_LAUNCH_CHECK();
}

void CudaBackend::moe_route_bwd(const MoeRouteBwdArgs& a) {
  const char* op = "moe_route_bwd";
  const int64_t N = a.n, E = a.n_experts, K = a.top_k;
  check_route(op, N, E, K);
  check_tensor(op, "dlogits", a.dlogits, N * E, true, true);
  check_tensor(op, "dweight", a.dweight, N * K, false, true);
  check_tensor(op, "logits", a.logits, N * E, true, true);
  check_i32(op, "expert", a.expert, N * K);
  const float* aux = nullptr;
  const float* mask = nullptr;
  if (a.aux_grad.data) {
    check_tensor(op, "aux_grad", a.aux_grad, E, false, true);
    aux = a.aux_grad.f32();
    if (a.mask.data) check_tensor(op, "mask", a.mask, N, false, true), mask = a.mask.f32();
  }
  if (N == 0) return;
  launch(route_bwd_kernel, {blocks_for(N, kThreads), kThreads, 0, stream()}, fptr(a.dlogits),
         static_cast<const float*>(a.dweight.f32()), fptr(a.logits), static_cast<const int32_t*>(a.expert.data), N, E, int(K),
         int(a.norm_topk), aux, mask);
  QLORA_CUDA_LAUNCH_CHECK();
}

void CudaBackend::moe_router_stats(const MoeRouterStatsArgs& a) {
  const char* op = "moe_router_stats";
  const int64_t N = a.n, E = a.n_experts, K = a.top_k;
  check_route(op, N, E, K);
  check_tensor(op, "prob_sum", a.prob_sum, E, false, true);
  check_tensor(op, "count", a.count, E, false, true);
  check_tensor(op, "logits", a.logits, N * E, true, true);
  check_i32(op, "expert", a.expert, N * K);
  if (a.mask.data) check_tensor(op, "mask", a.mask, N, false, true);
  if (N == 0) return;
  launch(router_stats_kernel, {unsigned(E), kThreads, 0, stream()}, a.prob_sum.f32(), a.count.f32(), fptr(a.logits),
         static_cast<const int32_t*>(a.expert.data), a.mask.data ? static_cast<const float*>(a.mask.f32()) : nullptr, N, E,
         int(K));
  QLORA_CUDA_LAUNCH_CHECK();
}

void CudaBackend::gather_rows(const GatherRowsArgs& a) {
  const char* op = "gather_rows";
  check_dim(op, "m", a.m);
  check_dim(op, "c", a.c);
  check_tensor(op, "dst", a.dst, a.m * a.c, true, true);
  check_tensor(op, "src", a.src, a.src.ndim > 0 ? a.src.numel() : 0, true, true);
  if (a.scale.data) check_tensor(op, "scale", a.scale, a.m, false, true);
  if (a.m == 0) return;
  check_ptr(op, "index", a.index);
  launch(gather_rows_kernel, {int(a.m), kRowThreads, 0, stream()}, fptr(a.dst), fptr(a.src),
         static_cast<const float*>(a.scale.data ? a.scale.f32() : nullptr), a.index, a.c);
  QLORA_CUDA_LAUNCH_CHECK();
}

void CudaBackend::combine_rows(const CombineRowsArgs& a) {
  const char* op = "combine_rows";
  check_dim(op, "n", a.n);
  check_dim(op, "k", a.k);
  check_dim(op, "c", a.c);
  check_tensor(op, "out", a.out, a.n * a.c, true, true);
  check_tensor(op, "src", a.src, a.src.ndim > 0 ? a.src.numel() : 0, true, true);
  if (a.weight.data) check_tensor(op, "weight", a.weight, a.n * a.k, false, true);
  if (a.n == 0) return;
  check_ptr(op, "row", a.row);
  launch(combine_rows_kernel, {int(a.n), kRowThreads, 0, stream()}, fptr(a.out), fptr(a.src),
         static_cast<const float*>(a.weight.data ? a.weight.f32() : nullptr), a.row, a.k, a.c, int(a.accumulate));
  QLORA_CUDA_LAUNCH_CHECK();
}

void CudaBackend::row_dots(const RowDotsArgs& a) {
  const char* op = "row_dots";
  check_dim(op, "n", a.n);
  check_dim(op, "k", a.k);
  check_dim(op, "c", a.c);
  check_tensor(op, "out", a.out, a.n * a.k, false, true);
  check_tensor(op, "a", a.a, a.n * a.c, true, true);
  check_tensor(op, "b", a.b, a.b.ndim > 0 ? a.b.numel() : 0, true, true);
  if (a.n * a.k == 0) return;
  check_ptr(op, "row", a.row);
  launch(row_dots_kernel, {blocks_for(a.n * a.k * 32, kThreads), kThreads, 0, stream()}, a.out.f32(), fptr(a.a),
         fptr(a.b), a.row, a.n * a.k, a.k, a.c);
  QLORA_CUDA_LAUNCH_CHECK();
}

}  // namespace qlora::cuda
