// CUDA elementwise ops: add, bias_add, scale, SwiGLU and inverted dropout (fwd and bwd).
// One map kernel per op functor; every tensor may be F32 or BF16 (math in f32).
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/hash_uniform.h"

namespace qlora::cuda {

namespace {

constexpr int kThreads = 256;  // every launch in this file; the kernels' __launch_bounds__

template <int N>
struct Ptrs {
  FPtr p[N];
};

// out_j[i] = f(in_0[i], ..., i). Outputs may alias inputs: each element is read into registers
// by the thread that writes it. vec: every pointer 16-byte aligned, so 8 elements per load.
template <int NIN, int NOUT, class F>
__global__ void __launch_bounds__(kThreads) map_kernel(Ptrs<NIN> in, Ptrs<NOUT> out, int64_t n, int vec, F f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_from = 0;
  if (vec) {
    for (int64_t g = tid; g < n / 8; g += stride) {
      float x[NIN][8], y[NOUT][8];
#pragma unroll
      for (int j = 0; j < NIN; j++) ld8(in.p[j], g * 8, x[j]);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        float xi[NIN], yi[NOUT];
#pragma unroll
        for (int j = 0; j < NIN; j++) xi[j] = x[j][e];
        f(xi, yi, g * 8 + e);
#pragma unroll
        for (int j = 0; j < NOUT; j++) y[j][e] = yi[j];
      }
#pragma unroll
      for (int j = 0; j < NOUT; j++) st8(out.p[j], g * 8, y[j]);
    }
    scalar_from = n / 8 * 8;
  }
  for (int64_t i = scalar_from + tid; i < n; i += stride) {
    float xi[NIN], yi[NOUT];
#pragma unroll
    for (int j = 0; j < NIN; j++) xi[j] = ldf(in.p[j], i);
    f(xi, yi, i);
#pragma unroll
    for (int j = 0; j < NOUT; j++) stf(out.p[j], i, yi[j]);
  }
}

struct AddF {
  __device__ void operator()(const float* x, float* y, int64_t) const { y[0] = x[0] + x[1]; }
};
struct ScaleF {
  float s;
  __device__ void operator()(const float* x, float* y, int64_t) const { y[0] = x[0] * s; }
};
// silu written as torch's CPU kernel is, g / (1 + e^-g), like the CPU backend.
struct SwigluFwdF {
  __device__ void operator()(const float* x, float* y, int64_t) const { y[0] = x[0] / (1.0f + expf(-x[0])) * x[1]; }
};
struct SwigluBwdF {  // in: dout, gate, up; out: dgate, dup
  __device__ void operator()(const float* x, float* y, int64_t) const {
    const float d = x[0], g = x[1], u = x[2];
    const float s = 1.0f / (1.0f + expf(-g));
    y[0] = d * u * (s * (1.0f + g * (1.0f - s)));
    y[1] = d * (g / (1.0f + expf(-g)));
  }
};
// gelu(approximate="tanh") as torch's CUDA GeluCUDAKernelImpl / GeluBackwardCUDAKernelImpl write it,
// like the CPU backend: GeGLU is out = gelu_tanh(gate) * up.
constexpr float kGeluBeta = 0.7978845608028654f, kGeluKappa = 0.044715f;  // sqrt(2/pi), 0.044715
struct GegluFwdF {
  __device__ void operator()(const float* x, float* y, int64_t) const {
    const float g = x[0], inner = kGeluBeta * (g + kGeluKappa * (g * g * g));
    y[0] = 0.5f * g * (1.0f + tanhf(inner)) * x[1];
  }
};
struct GegluBwdF {  // in: dout, gate, up; out: dgate, dup
  __device__ void operator()(const float* x, float* y, int64_t) const {
    const float d = x[0], g = x[1], u = x[2];
    const float g_sq = g * g, t = tanhf(kGeluBeta * (g + kGeluKappa * g_sq * g));
    const float dgelu = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * g_sq);
    y[0] = d * u * dgelu;
    y[1] = d * (0.5f * g * (1.0f + t));
  }
};
struct ClampedSwigluFwdF {  // gpt-oss (core/activation.h, as the CPU backend)
  ClampedSwigluParams p;
  __device__ void operator()(const float* x, float* y, int64_t) const { y[0] = clamped_swiglu(x[0], x[1], p); }
};
struct ClampedSwigluBwdF {  // in: dout, gate, up; out: dgate, dup
  ClampedSwigluParams p;
  __device__ void operator()(const float* x, float* y, int64_t) const { clamped_swiglu_bwd(x[0], x[1], x[2], p, y[0], y[1]); }
};
struct DropoutF {
  float p, keep_scale;
  uint64_t seed, stream, offset;
  __device__ void operator()(const float* x, float* y, int64_t i) const {
    y[0] = hash_uniform_hd(seed, stream, offset + uint64_t(i)) >= p ? x[0] * keep_scale : 0.0f;
  }
};
// y (N,M) += bias (M): the bias index is the column.
__global__ void __launch_bounds__(kThreads) bias_add_kernel(FPtr y, FPtr bias, int64_t n_rows, int64_t m, int vec) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {  // m % 8 == 0: a group of 8 never straddles a row
    const int64_t groups = n_rows * m / 8;
    for (int64_t g = tid; g < groups; g += stride) {
      float v[8], b[8];
      ld8(y, g * 8, v);
      ld8(bias, (g * 8) % m, b);
#pragma unroll
      for (int e = 0; e < 8; e++) v[e] += b[e];
      st8(y, g * 8, v);
    }
  } else {
    for (int64_t i = tid; i < n_rows * m; i += stride) stf(y, i, ldf(y, i) + ldf(bias, i % m));
  }
}

int grid_for(int64_t work, int sm_count) {
  const int64_t blocks = ceil_div64(std::max<int64_t>(work, 1), kThreads);
  return int(std::min<int64_t>(blocks, int64_t(sm_count) * 16));
}

template <int NIN, int NOUT, class F>
void launch_map(const CudaBackend& be, const Tensor* const (&in)[NIN], const Tensor* const (&out)[NOUT], int64_t n, F f) {
  if (n == 0) return;
  Ptrs<NIN> pi;
  Ptrs<NOUT> po;
  bool vec = true;
  for (int j = 0; j < NIN; j++) {
    pi.p[j] = fptr(*in[j]);
    vec = vec && aligned16(in[j]->data);
  }
  for (int j = 0; j < NOUT; j++) {
    po.p[j] = fptr(*out[j]);
    vec = vec && aligned16(out[j]->data);
  }
  const int blocks = grid_for(vec ? n / 8 + 1 : n, be.sm_count());
  launch(map_kernel<NIN, NOUT, F>, {blocks, kThreads, 0, be.stream()}, pi, po, n, vec, f);
  QLORA_CUDA_LAUNCH_CHECK();
}

}  // namespace

void CudaBackend::add(const AddArgs& a) {
  check_dim("add", "n", a.n);
  check_tensor("add", "y", a.y, a.n, true, true);
  check_tensor("add", "x", a.x, a.n, true, true);
  launch_map<2, 1>(*this, {&a.y, &a.x}, {&a.y}, a.n, AddF{});
}

void CudaBackend::bias_add(const BiasAddArgs& a) {
  check_dim("bias_add", "n", a.n);
  check_dim("bias_add", "m", a.m);
  check_tensor("bias_add", "y", a.y, a.n * a.m, true, true);
  check_tensor("bias_add", "bias", a.bias, a.m, true, true);
  if (a.n * a.m == 0) return;
  const int vec = a.m % 8 == 0 && aligned16(a.y.data) && aligned16(a.bias.data);
  const int64_t work = vec ? a.n * a.m / 8 : a.n * a.m;
  launch(bias_add_kernel, {grid_for(work, sm_count()), kThreads, 0, stream()}, fptr(a.y), fptr(a.bias), a.n, a.m, vec);
  QLORA_CUDA_LAUNCH_CHECK();
}

void CudaBackend::scale(const ScaleArgs& a) {
  check_dim("scale", "n", a.n);
  check_tensor("scale", "x", a.x, a.n, true, true);
  launch_map<1, 1>(*this, {&a.x}, {&a.x}, a.n, ScaleF{a.s});
}

void CudaBackend::swiglu_fwd(const SwigluFwdArgs& a) {
  const char* op = "swiglu_fwd";
  check_dim(op, "n", a.n);
  check_tensor(op, "out", a.out, a.n, true, true);
  check_tensor(op, "gate", a.gate, a.n, true, true);
  check_tensor(op, "up", a.up, a.n, true, true);
  if (a.act == Activation::Silu) launch_map<2, 1>(*this, {&a.gate, &a.up}, {&a.out}, a.n, SwigluFwdF{});
  else if (a.act == Activation::GeluTanh) launch_map<2, 1>(*this, {&a.gate, &a.up}, {&a.out}, a.n, GegluFwdF{});
  else launch_map<2, 1>(*this, {&a.gate, &a.up}, {&a.out}, a.n, ClampedSwigluFwdF{a.clamp});
}

void CudaBackend::swiglu_bwd(const SwigluBwdArgs& a) {
  const char* op = "swiglu_bwd";
  check_dim(op, "n", a.n);
  check_tensor(op, "dgate", a.dgate, a.n, true, true);
  check_tensor(op, "dup", a.dup, a.n, true, true);
  check_tensor(op, "dout", a.dout, a.n, true, true);
  check_tensor(op, "gate", a.gate, a.n, true, true);
  check_tensor(op, "up", a.up, a.n, true, true);
  if (a.act == Activation::Silu) launch_map<3, 2>(*this, {&a.dout, &a.gate, &a.up}, {&a.dgate, &a.dup}, a.n, SwigluBwdF{});
  else if (a.act == Activation::GeluTanh)
    launch_map<3, 2>(*this, {&a.dout, &a.gate, &a.up}, {&a.dgate, &a.dup}, a.n, GegluBwdF{});
  else launch_map<3, 2>(*this, {&a.dout, &a.gate, &a.up}, {&a.dgate, &a.dup}, a.n, ClampedSwigluBwdF{a.clamp});
}

// Same mask as the CPU backend: keep element i iff hash_uniform(seed, stream, i) >= p.
static void dropout_apply(CudaBackend& be, const char* op, const DropoutArgs& a) {
  check_dim(op, "n", a.n);
  check_tensor(op, "out", a.out, a.n, true, true);
  check_tensor(op, "x", a.x, a.n, true, true);
  if (!(a.p >= 0.0f && a.p <= 1.0f))
    fail(ErrorKind::Config, std::string("cuda op ") + op + ", argument 'p'",
         "dropout probability " + std::to_string(a.p) + " is outside [0, 1]", "lora_dropout must be in [0, 1)");
  if (a.p == 0.0f) {
    if (a.out.data != a.x.data) launch_map<1, 1>(be, {&a.x}, {&a.out}, a.n, ScaleF{1.0f});
    return;
  }
  // p == 1 drops everything; 1/(1-p) would be inf and 0*inf NaN, so it gets its own scale.
  const float keep_scale = a.p < 1.0f ? 1.0f / (1.0f - a.p) : 0.0f;
  launch_map<1, 1>(be, {&a.x}, {&a.out}, a.n, DropoutF{a.p, keep_scale, a.seed, a.stream, a.offset});
}

void CudaBackend::dropout_fwd(const DropoutArgs& a) { dropout_apply(*this, "dropout_fwd", a); }
void CudaBackend::dropout_bwd(const DropoutArgs& a) { dropout_apply(*this, "dropout_bwd", a); }

}  // namespace qlora::cuda
