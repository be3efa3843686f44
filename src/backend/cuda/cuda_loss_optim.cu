// CUDA fused cross-entropy (loss + dlogits), the PyTorch-exact AdamW step and sum of squares.
#include <algorithm>
#include <cfloat>
#include <charconv>
#include <cmath>

#include "backend/cuda/cuda_backend_impl.cuh"

namespace qlora::cuda {

namespace {

constexpr int32_t kIgnoreIndex = -100;
constexpr int kCeThreads = 512;      // cross_entropy_kernel's block
constexpr int kAdamThreads = 256;    // adamw_kernel's block
constexpr int kSumsqThreads = cuda_plan::kSumsqThreads;  // both sumsq kernels' block (the plan sizes partials by it)

// Running (max, sum of exp(x - max)) pairs merge exactly like the rows of a softmax. The start
// value is -FLT_MAX rather than -inf so that merging two empty pairs gives 0, not NaN.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
__device__ __forceinline__ void push(MaxSum& a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.0f;
    a.m = x;
  } else {
    a.s += expf(x - a.m);
  }
}

// Gemma 2's final soft-capping of one logit: cap tanh(x / cap) as the CPU backend computes it, and
// the factor 1 - tanh^2 its gradient carries (cap 0: x itself, factor 1).
__device__ __forceinline__ float capped(float x, float cap, float* dfactor = nullptr) {
  if (cap <= 0.0f) {
    if (dfactor) *dfactor = 1.0f;
    return x;
  }
  const float t = tanhf(x / cap);
  if (dfactor) *dfactor = 1.0f - t * t;
  return t * cap;
}

// One block per row. Pass 1 reads the row once with an online max/sum; pass 2 writes
// dlogits = (softmax - onehot) * grad_scale (times 1 - tanh^2 under soft-capping). dlogits may alias logits: the label's logit and all
// pass-1 reads happen before the barrier inside the reduction, and pass 2 reads each element in
// the thread that overwrites it.
__global__ void __launch_bounds__(kCeThreads) cross_entropy_kernel(FPtr logits, FPtr dlogits, float* __restrict__ losses,
                                                                   const int32_t* __restrict__ labels, int64_t vocab,
                                                                   float grad_scale, float cap, int vec,
                                                                   DeviceErrorRecord* err) {
  QLORA_SHARED(MaxSum[32], red);
  const int64_t row = int64_t(blockIdx.x) * vocab;
  const int32_t y = labels[blockIdx.x];
  const bool ignored = y == kIgnoreIndex;
  const bool bad = !ignored && (y < 0 || y >= vocab);
  if (ignored || bad || vocab == 0) {
    if (bad && threadIdx.x == 0) record_device_error(err, kErrLabelRange, blockIdx.x, y);
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) stf(dlogits, row + j, 0.0f);
    if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
    return;
  }
  MaxSum acc{-FLT_MAX, 0.0f};
  if (vec) {
    for (int64_t j = threadIdx.x * 8; j < vocab; j += blockDim.x * 8) {
      float v[8];
      ld8(logits, row + j, v);
#pragma unroll
      for (int e = 0; e < 8; e++) push(acc, capped(v[e], cap));
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) push(acc, capped(ldf(logits, row + j), cap));
  }
  const float x_label = capped(ldf(logits, row + y), cap);  // every thread, before any write
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, o), __shfl_xor_sync(0xffffffffu, acc.s, o)};
    acc = merge(acc, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red[warp] = acc;
  __syncthreads();
  MaxSum tot = red[0];
  for (int w = 1; w < int(blockDim.x >> 5); w++) tot = merge(tot, red[w]);
  const float lse = tot.m + logf(tot.s);
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - x_label;
  if (vec) {
    for (int64_t j = threadIdx.x * 8; j < vocab; j += blockDim.x * 8) {
      float v[8];
      ld8(logits, row + j, v);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        float f;
        const float x = capped(v[e], cap, &f);
        v[e] = (expf(x - lse) - (j + e == y ? 1.0f : 0.0f)) * grad_scale * f;
      }
      st8(dlogits, row + j, v);
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      float f;
      const float x = capped(ldf(logits, row + j), cap, &f);
      stf(dlogits, row + j, (expf(x - lse) - (j == y ? 1.0f : 0.0f)) * grad_scale * f);
    }
  }
}

// Scalars of one AdamW step, formed on the host exactly as the CPU backend forms them.
struct AdamScalars {
  float decay, w1, w1m1, b2f, c2, neg_step_size, bc2_sqrt, eps;
  int small_w;
};

// The CPU backend's operation order with explicit rounding intrinsics: nvcc would otherwise
// contract a*b+c into fused multiply-adds where the CPU rounds twice, and the step would no
// longer match the CPU (and torch) bit for bit. fmaf appears exactly where the CPU uses std::fma.
__global__ void __launch_bounds__(kAdamThreads) adamw_kernel(float* __restrict__ p, const float* __restrict__ g,
                                                             float* __restrict__ m, float* __restrict__ v, int64_t n,
                                                             AdamScalars s) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float pi = __fmul_rn(p[i], s.decay);
    const float gi = g[i], m0 = m[i];
    const float d = __fsub_rn(gi, m0);
    const float mi = s.small_w ? fmaf(s.w1, d, m0) : fmaf(s.w1m1, d, gi);
    const float vi = fmaf(__fmul_rn(s.c2, gi), gi, __fmul_rn(v[i], s.b2f));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
    pi = __fadd_rn(pi, __fdiv_rn(__fmul_rn(s.neg_step_size, mi), denom));
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// Stage 1 of sumsq: per-block double partial sums (fixed grid, so the result is reproducible).
__global__ void __launch_bounds__(kSumsqThreads) sumsq_partial_kernel(FPtr x, int64_t n, double* __restrict__ partial) {
  QLORA_SHARED(double[32], red);
  double s = 0.0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = ldf(x, i);
    s += v * v;
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
// Stage 2: one block adds the partials in a fixed order.
__global__ void __launch_bounds__(kSumsqThreads)
    sumsq_final_kernel(const double* __restrict__ partial, int n_partial, double* __restrict__ out) {
  QLORA_SHARED(double[32], red);
  double s = 0.0;
  for (int i = threadIdx.x; i < n_partial; i += blockDim.x) s += partial[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *out = s;
}

// The Python double a config value was written as (0.9f -> 0.9), as in the CPU backend.
double decimal_value(float f) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  double d = f;
  std::from_chars(buf, r.ptr, d);
  return d;
}

}  // namespace

void CudaBackend::cross_entropy_fwd_bwd(const CrossEntropyArgs& a) {
  const char* op = "cross_entropy_fwd_bwd";
  check_softcap(op, a.softcap);
  check_dim(op, "n", a.n);
  check_dim(op, "vocab", a.vocab);
  check_tensor(op, "logits", a.logits, a.n * a.vocab, true, true);
  check_tensor(op, "dlogits", a.dlogits, a.n * a.vocab, true, true);
  check_tensor(op, "losses", a.losses, a.n, false, true);
  if (a.dlogits.dtype != a.logits.dtype)
    unsupported(op, std::string("dlogits dtype ") + dtype_name(a.dlogits.dtype) + " differs from logits dtype " +
                        dtype_name(a.logits.dtype));
  if (a.n == 0) return;
  check_ptr(op, "labels", a.labels);
  const int vec = a.vocab % 8 == 0 && aligned16(a.logits.data) && aligned16(a.dlogits.data);
  launch(cross_entropy_kernel, {unsigned(a.n), kCeThreads, 0, stream_}, fptr(a.logits), fptr(a.dlogits), a.losses.f32(),
         a.labels, a.vocab, a.grad_scale, a.softcap, vec, d_err_);
  QLORA_CUDA_LAUNCH_CHECK();
}

// torch.optim.AdamW single-tensor step; see the CPU backend for the derivation of each scalar.
void CudaBackend::adamw(const AdamwArgs& a) {
  const char* op = "adamw";
  check_dim(op, "n", a.n);
  check_tensor(op, "param", a.param, a.n, false, true);
  check_tensor(op, "grad", a.grad, a.n, false, true);
  check_tensor(op, "m", a.m, a.n, false, true);
  check_tensor(op, "v", a.v, a.n, false, true);
  if (a.step < 1)
    fail(ErrorKind::Internal, "cuda op adamw, argument 'step'",
         "step must be >= 1 (bias correction divides by 1-beta^step), got " + std::to_string(a.step));
  if (a.n == 0) return;
  const double lr = decimal_value(a.lr), wd = decimal_value(a.weight_decay);
  const double b1 = decimal_value(a.beta1), b2 = decimal_value(a.beta2), eps = decimal_value(a.eps);
  const double step = double(a.step);
  AdamScalars s{};
  s.decay = float(1.0 - lr * wd);
  s.w1 = float(1.0 - b1);
  s.w1m1 = s.w1 - 1.0f;
  s.b2f = float(b2);
  s.c2 = float(1.0 - b2);
  s.neg_step_size = float(-(lr / (1.0 - std::pow(b1, step))));
  s.bc2_sqrt = float(std::pow(1.0 - std::pow(b2, step), 0.5));
  s.eps = float(eps);
  s.small_w = std::fabs(s.w1) < 0.5f;
  const int blocks = int(std::min<int64_t>(ceil_div64(a.n, kAdamThreads), int64_t(sm_count_) * 8));
  launch(adamw_kernel, {blocks, kAdamThreads, 0, stream_}, a.param.f32(), a.grad.f32(), a.m.f32(), a.v.f32(), a.n, s);
  QLORA_CUDA_LAUNCH_CHECK();
}

// Every tensor's partial sums go to its own slots of one array (a fixed grid per tensor, so the
// result is reproducible); one final kernel adds them all; one copy and one synchronization.
void CudaBackend::sumsq(const SumsqArgs& a) {
  check_ptr("sumsq", "out", a.out);
  std::vector<int> blocks(a.xs.size());
  int total_blocks = 0;
  for (size_t i = 0; i < a.xs.size(); i++) {
    const int64_t n = a.xs[i].numel();
    check_tensor("sumsq", "x", a.xs[i], n, true, true);
    blocks[i] = int(cuda_plan::sumsq_blocks(n));
    total_blocks += blocks[i];
  }
  if (total_blocks == 0) return;
  auto* partial = static_cast<double*>(scratch(Scratch::Reduce, size_t(total_blocks + 1) * sizeof(double), "sumsq"));
  for (size_t i = 0, at = 1; i < a.xs.size(); at += size_t(blocks[i]), i++) {
    if (blocks[i] == 0) continue;
    launch(sumsq_partial_kernel, {blocks[i], kSumsqThreads, 0, stream_}, fptr(a.xs[i]), a.xs[i].numel(), partial + at);
    QLORA_CUDA_LAUNCH_CHECK();
  }
  launch(sumsq_final_kernel, {1, kSumsqThreads, 0, stream_}, partial + 1, total_blocks, partial);
  QLORA_CUDA_LAUNCH_CHECK();
  double total = 0.0;
  QLORA_CUDA_CHECK(cudaMemcpyAsync(&total, partial, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  QLORA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  *a.out += total;
}

}  // namespace qlora::cuda
