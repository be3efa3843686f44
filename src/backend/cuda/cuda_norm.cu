// CUDA token embedding, RMSNorm and rotary embedding, forward and backward (f32 math, bf16|f32 io).
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend_impl.cuh"

namespace qlora::cuda {

namespace {

// Block sizes, each the __launch_bounds__ of its kernels. The row kernels (one block per row:
// embedding, rmsnorm fwd and dx) take row_threads(), which is at most kRowThreads.
constexpr int kRowThreads = 256;
constexpr int kDwCols = 32, kDwRowLanes = 8;  // rmsnorm_dw_partial_kernel: 32 columns x 8 row lanes
constexpr int kDwFinalThreads = 256;
constexpr int kRopeThreads = 128;

// out[i,:] = table[tokens[i],:]; one block per token row. A bad id records a device error and
// writes a zero row, so nothing downstream reads uninitialised memory before the error surfaces.
__global__ void __launch_bounds__(kRowThreads)
    embedding_fwd_kernel(FPtr out, FPtr table, const int32_t* __restrict__ tokens, int64_t c, int64_t vocab, int vec,
                         DeviceErrorRecord* err) {
  const int64_t i = blockIdx.x;
  const int32_t tok = tokens[i];
  const bool ok = tok >= 0 && tok < vocab;
  if (!ok && threadIdx.x == 0) record_device_error(err, kErrTokenRange, i, tok);
  const int64_t src = int64_t(ok ? tok : 0) * c, dst = i * c;
  if (vec) {
    for (int64_t j = threadIdx.x * 8; j < c; j += blockDim.x * 8) {
      float v[8];
      ld8(table, src + j, v);
      if (!ok)
        for (float& x : v) x = 0.0f;
      st8(out, dst + j, v);
    }
  } else {
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) stf(out, dst + j, ok ? ldf(table, src + j) : 0.0f);
  }
}

// dtable[tokens[i],:] += dout[i,:] with atomics (repeated tokens hit the same row). The f32 sum
// order over repeated tokens is not fixed, so dtable is reproducible to rounding only.
__global__ void __launch_bounds__(kRowThreads)
    embedding_bwd_kernel(FPtr dtable, FPtr dout, const int32_t* __restrict__ tokens, int64_t c, int64_t vocab,
                         DeviceErrorRecord* err) {
  const int64_t i = blockIdx.x;
  const int32_t tok = tokens[i];
  if (tok < 0 || tok >= vocab) {
    if (threadIdx.x == 0) record_device_error(err, kErrTokenRange, i, tok);
    return;
  }
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float g = ldf(dout, i * c + j);
    const int64_t k = int64_t(tok) * c + j;
    if (dtable.bf16)
      atomicAdd(static_cast<__nv_bfloat16*>(dtable.p) + k, __float2bfloat16_rn(g));
    else
      atomicAdd(static_cast<float*>(dtable.p) + k, g);
  }
}

// One block per row: sum of squares, then out = (w + w_off) * (x * rstd) as HF's LlamaRMSNorm
// (w_off 0) and Gemma's RMSNorm (w_off 1, the weight stored as an offset from one) compute it.
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_fwd_kernel(FPtr out, float* __restrict__ rstd, FPtr x, FPtr w, float w_off, int64_t c, float eps, int vec) {
  QLORA_SHARED(float[32], red);
  const int64_t row = int64_t(blockIdx.x) * c;
  float ss = 0.0f;
  if (vec) {
    for (int64_t j = threadIdx.x * 8; j < c; j += blockDim.x * 8) {
      float v[8];
      ld8(x, row + j, v);
#pragma unroll
      for (int e = 0; e < 8; e++) ss += v[e] * v[e];
    }
  } else {
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float v = ldf(x, row + j);
      ss += v * v;
    }
  }
  ss = block_sum(ss, red);
  const float r = 1.0f / sqrtf(ss / float(c) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  if (vec) {
    for (int64_t j = threadIdx.x * 8; j < c; j += blockDim.x * 8) {
      float v[8], wv[8];
      ld8(x, row + j, v);
      ld8(w, j, wv);
#pragma unroll
      for (int e = 0; e < 8; e++) v[e] = (wv[e] + w_off) * (v[e] * r);
      st8(out, row + j, v);
    }
  } else {
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) stf(out, row + j, (ldf(w, j) + w_off) * (ldf(x, row + j) * r));
  }
}

// dx = r w dout - (r^3 / C) x sum_k(w_k dout_k x_k); one block per row. dx may alias dout: each
// element is read by the thread that later writes it, and the row sum is complete before writes.
// The 4 blocks per SM (<= 64 registers) is there for ptxas: from the thread bound alone it aims at
// 40 registers on sm_90a and spills 8 bytes; at 4 blocks it uses 46 and spills nothing.
__global__ void __launch_bounds__(kRowThreads, 4)
    rmsnorm_bwd_dx_kernel(FPtr dx, FPtr dout, FPtr x, FPtr w, float w_off, const float* __restrict__ rstd, int64_t c,
                          int vec) {
  QLORA_SHARED(float[32], red);
  const int64_t row = int64_t(blockIdx.x) * c;
  float dot = 0.0f;
  if (vec) {
    for (int64_t j = threadIdx.x * 8; j < c; j += blockDim.x * 8) {
      float d[8], xv[8], wv[8];
      ld8(dout, row + j, d);
      ld8(x, row + j, xv);
      ld8(w, j, wv);
#pragma unroll
      for (int e = 0; e < 8; e++) dot += (wv[e] + w_off) * d[e] * xv[e];
    }
  } else {
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) dot += (ldf(w, j) + w_off) * ldf(dout, row + j) * ldf(x, row + j);
  }
  dot = block_sum(dot, red);
  const float r = rstd[blockIdx.x];
  const float coef = r * r * r * dot / float(c);
  if (vec) {
    for (int64_t j = threadIdx.x * 8; j < c; j += blockDim.x * 8) {
      float d[8], xv[8], wv[8];
      ld8(dout, row + j, d);
      ld8(x, row + j, xv);
      ld8(w, j, wv);
#pragma unroll
      for (int e = 0; e < 8; e++) d[e] = r * (wv[e] + w_off) * d[e] - coef * xv[e];
      st8(dx, row + j, d);
    }
  } else {
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
      stf(dx, row + j, r * (ldf(w, j) + w_off) * ldf(dout, row + j) - coef * ldf(x, row + j));
  }
}

// dw partial sums: block (32 columns x 8 row lanes), grid.y splits the rows. partial (gridDim.y, C).
__global__ void __launch_bounds__(kDwCols * kDwRowLanes)
    rmsnorm_dw_partial_kernel(float* __restrict__ partial, FPtr dout, FPtr x, const float* __restrict__ rstd, int64_t n,
                              int64_t c) {
  QLORA_SHARED(float[kDwRowLanes][kDwCols + 1], acc);
  const int64_t col = int64_t(blockIdx.x) * kDwCols + threadIdx.x;
  float s = 0.0f;
  if (col < c)
    for (int64_t i = int64_t(blockIdx.y) * kDwRowLanes + threadIdx.y; i < n; i += int64_t(gridDim.y) * kDwRowLanes)
      s += ldf(dout, i * c + col) * ldf(x, i * c + col) * rstd[i];
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    float t = 0.0f;
#pragma unroll
    for (int y = 0; y < kDwRowLanes; y++) t += acc[y][threadIdx.x];
    partial[int64_t(blockIdx.y) * c + col] = t;
  }
}

// dw[j] += sum over the row splits, in a fixed order (deterministic).
__global__ void __launch_bounds__(kDwFinalThreads)
    rmsnorm_dw_final_kernel(FPtr dw, const float* __restrict__ partial, int splits, int64_t c) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  float s = 0.0f;
  for (int y = 0; y < splits; y++) s += partial[int64_t(y) * c + j];
  stf(dw, j, ldf(dw, j) + s);
}

// cos and sin of the f32 angle a, to match the CPU backend, which rounds std::cos/std::sin of
// double(a) to f32. sincosf itself cannot be used: its exact reduction for |a| > 105615 (Payne-
// Hanek) keeps a table in a 32-byte stack frame, and the static gates forbid local memory (ptxas
// keeps that path, and the frame, even for an argument already reduced as below). Instead:
//  1. r = a - 2pi k, k = rint(a / 2pi), in double. a * (1/2pi) gives the k of a / 2pi except where
//     that is within ~1e-16 of a half-integer, and there r is pi or -pi either way. The fma forms
//     a - k * kTwoPi exactly and rounds once (<= 2^-52 pi); kTwoPi is 2pi to 2.5e-16, so r is off by
//     at most 2.5e-16 |k|: < 1e-11 for |a| < 2.6e5 (positions below 262144 at inv_freq <= 1), and
//     < 1e-7 for any f32 angle of an int32 position.
//  2. float(r): |r| <= pi (+ one f32 ulp), rounding error <= 2^-23 = 1.2e-7.
//  3. __sincosf (MUFU.SIN/COS): absolute error <= 2^-21.41 (sin) and 2^-21.19 (cos) on [-pi, pi].
// So cos and sin are within ~5.5e-7 absolute of the CPU's (whose own f32 rounding is <= 3e-8),
// for every angle; sincosf of the unreduced angle was within ~1.2e-7. (The host harness's
// __sincosf is libm's correctly rounded sincosf: it proves the algorithm, not the ulps.)
__device__ __forceinline__ void rope_cos_sin(float a, float* c, float* s) {
  constexpr double kTwoPi = 6.283185307179586;       // 2pi rounded to double
  constexpr double kInvTwoPi = 0.15915494309189535;  // 1/(2pi) rounded to double
  const double ad = double(a);
  const float r = float(fma(-rint(ad * kInvTwoPi), kTwoPi, ad));
  __sincosf(r, s, c);
}

// Rotates each (j, j+R/2) pair (R = rotary_dim) of every head of one token by sign * pos *
// inv_freq[j]; dims from R on stay. The angle is the f32 product, as in HF and the CPU backend;
// cos/sin, times `scale` (LongRoPE's attention factor), are computed once per token.
__global__ void __launch_bounds__(kRopeThreads)
    rope_kernel(FPtr x, const float* __restrict__ inv_freq, const int32_t* __restrict__ positions, int64_t n_head,
                int64_t head_dim, int64_t rotary_dim, float sign, float scale) {
  QLORA_DYNAMIC_SMEM(cs_bytes, 16);
  float* cs = reinterpret_cast<float*>(cs_bytes);  // (2, R/2): cos then sin
  const int64_t half = rotary_dim / 2;
  const float pos = float(positions[blockIdx.x]);
  for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
    float s, c;
    rope_cos_sin(__fmul_rn(pos, inv_freq[j]), &c, &s);
    cs[j] = __fmul_rn(c, scale);
    cs[half + j] = sign * __fmul_rn(s, scale);
  }
  __syncthreads();
  const int64_t base = int64_t(blockIdx.x) * n_head * head_dim;
  for (int64_t idx = threadIdx.x; idx < n_head * half; idx += blockDim.x) {
    const int64_t h = idx / half, j = idx % half;
    const int64_t i1 = base + h * head_dim + j, i2 = i1 + half;
    const float x1 = ldf(x, i1), x2 = ldf(x, i2), c = cs[j], s = cs[half + j];
    stf(x, i1, x1 * c - x2 * s);
    stf(x, i2, x2 * c + x1 * s);
  }
}

// Threads for a row kernel: 64, 128 or kRowThreads (its __launch_bounds__), by the row's work items.
static_assert(kRowThreads >= 128 && kRowThreads % 32 == 0, "block_sum needs whole warps");
int row_threads(int64_t c, bool vec) {
  const int64_t per = vec ? c / 8 : c;
  if (per >= 512) return kRowThreads;
  if (per >= 128) return 128;
  return 64;
}

}  // namespace

void CudaBackend::embedding_fwd(const EmbeddingFwdArgs& a) {
  const char* op = "embedding_fwd";
  check_dim(op, "n", a.n);
  check_dim(op, "c", a.c);
  check_dim(op, "vocab", a.vocab);
  check_tensor(op, "out", a.out, a.n * a.c, true, true);
  check_tensor(op, "table", a.table, a.vocab * a.c, true, true);
  if (a.n == 0 || a.c == 0) return;
  check_ptr(op, "tokens", a.tokens);
  const int vec = a.c % 8 == 0 && aligned16(a.out.data) && aligned16(a.table.data);
  launch(embedding_fwd_kernel, {unsigned(a.n), row_threads(a.c, vec), 0, stream_}, fptr(a.out), fptr(a.table), a.tokens,
         a.c, a.vocab, vec, d_err_);
  QLORA_CUDA_LAUNCH_CHECK();
}

void CudaBackend::embedding_bwd(const EmbeddingBwdArgs& a) {
  const char* op = "embedding_bwd";
  check_dim(op, "n", a.n);
  check_dim(op, "c", a.c);
  check_dim(op, "vocab", a.vocab);
  check_tensor(op, "dtable", a.dtable, a.vocab * a.c, true, true);
  check_tensor(op, "dout", a.dout, a.n * a.c, true, true);
  if (a.n == 0 || a.c == 0) return;
  check_ptr(op, "tokens", a.tokens);
  launch(embedding_bwd_kernel, {unsigned(a.n), row_threads(a.c, false), 0, stream_}, fptr(a.dtable), fptr(a.dout),
         a.tokens, a.c, a.vocab, d_err_);
  QLORA_CUDA_LAUNCH_CHECK();
}

void CudaBackend::rmsnorm_fwd(const RmsnormFwdArgs& a) {
  const char* op = "rmsnorm_fwd";
  check_dim(op, "n", a.n);
  check_dim(op, "c", a.c);
  check_tensor(op, "out", a.out, a.n * a.c, true, true);
  check_tensor(op, "rstd", a.rstd, a.n, false, true);
  check_tensor(op, "x", a.x, a.n * a.c, true, true);
  check_tensor(op, "w", a.w, a.c, true, true);
  if (a.n == 0 || a.c == 0) return;
  const int vec = a.c % 8 == 0 && aligned16(a.out.data) && aligned16(a.x.data) && aligned16(a.w.data);
  launch(rmsnorm_fwd_kernel, {unsigned(a.n), row_threads(a.c, vec), 0, stream_}, fptr(a.out), a.rstd.f32(), fptr(a.x),
         fptr(a.w), a.w_offset, a.c, a.eps, vec);
  QLORA_CUDA_LAUNCH_CHECK();
}

void CudaBackend::rmsnorm_bwd(const RmsnormBwdArgs& a) {
  const char* op = "rmsnorm_bwd";
  check_dim(op, "n", a.n);
  check_dim(op, "c", a.c);
  check_tensor(op, "dx", a.dx, a.n * a.c, true, true);
  if (!a.dw.empty()) check_tensor(op, "dw", a.dw, a.c, true, true);
  check_tensor(op, "dout", a.dout, a.n * a.c, true, true);
  check_tensor(op, "x", a.x, a.n * a.c, true, true);
  check_tensor(op, "w", a.w, a.c, true, true);
  check_tensor(op, "rstd", a.rstd, a.n, false, true);
  if (a.n == 0 || a.c == 0) return;
  // dw first: dx may overwrite dout in place (callers reuse the gradient buffer).
  if (!a.dw.empty()) {
    const int splits = int(std::clamp<int64_t>(ceil_div64(a.n, 64), 1, 128));
    auto* partial = static_cast<float*>(scratch(Scratch::Reduce, size_t(splits) * size_t(a.c) * 4, op));
    const dim3 grid(unsigned(ceil_div64(a.c, kDwCols)), unsigned(splits)), block(kDwCols, kDwRowLanes);
    launch(rmsnorm_dw_partial_kernel, {grid, block, 0, stream_}, partial, fptr(a.dout), fptr(a.x), a.rstd.f32(), a.n,
           a.c);
    QLORA_CUDA_LAUNCH_CHECK();
    launch(rmsnorm_dw_final_kernel, {unsigned(ceil_div64(a.c, kDwFinalThreads)), kDwFinalThreads, 0, stream_},
           fptr(a.dw), partial, splits, a.c);
    QLORA_CUDA_LAUNCH_CHECK();
  }
  const int vec = a.c % 8 == 0 && aligned16(a.dx.data) && aligned16(a.dout.data) && aligned16(a.x.data) &&
                  aligned16(a.w.data);
  launch(rmsnorm_bwd_dx_kernel, {unsigned(a.n), row_threads(a.c, vec), 0, stream_}, fptr(a.dx), fptr(a.dout), fptr(a.x),
         fptr(a.w), a.w_offset, a.rstd.f32(), a.c, vec);
  QLORA_CUDA_LAUNCH_CHECK();
}

static void rope_apply(CudaBackend& be, const char* op, const RopeArgs& a, float sign) {
  check_dim(op, "n", a.n);
  check_dim(op, "n_head", a.n_head);
  check_dim(op, "head_dim", a.head_dim);
  const int64_t rot = a.rot();
  if (rot % 2 != 0 || rot > a.head_dim)
    fail(ErrorKind::Shape, std::string("cuda op ") + op + ", dimension 'rotary_dim'",
         "rotary_dim " + std::to_string(rot) + " of head_dim " + std::to_string(a.head_dim) +
             ": rotary pairs need an even count, at most head_dim");
  check_tensor(op, "x", a.x, a.n * a.n_head * a.head_dim, true, true);
  check_tensor(op, "inv_freq", a.inv_freq, rot / 2, false, true);
  if (a.n == 0 || a.n_head == 0 || a.head_dim == 0) return;
  check_ptr(op, "positions", a.positions);
  const size_t smem = size_t(rot) * sizeof(float);
  launch(rope_kernel, {unsigned(a.n), kRopeThreads, smem, be.stream()}, fptr(a.x), a.inv_freq.f32(), a.positions,
         a.n_head, a.head_dim, rot, sign, a.scale);
  QLORA_CUDA_LAUNCH_CHECK();
}

void CudaBackend::rope_fwd(const RopeArgs& a) { rope_apply(*this, "rope_fwd", a, 1.0f); }
void CudaBackend::rope_bwd(const RopeArgs& a) { rope_apply(*this, "rope_bwd", a, -1.0f); }

}  // namespace qlora::cuda
