// Row kernels of the CPU backend that are not BLAS: written once on GCC generic vectors (16 f32
// lanes) and compiled per instruction set with runtime dispatch (AVX-512, AVX2+FMA, baseline
// x86-64; plain NEON-or-scalar lowering on other architectures).
#pragma once
#include <cstdint>

// One compiled clone per x86-64 level, picked when the program loads (GNU ifunc).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define QLORA_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define QLORA_SIMD_CLONES
#endif

namespace qlora::cpu {

// max_j x[j]; -inf for n == 0.
float row_max(const float* x, int64_t n);
// x[j] = exp(x[j] - m) in place (exp of -inf or of anything below ~-87.3 is 0); returns sum_j x[j].
float exp_sub_sum(float* x, int64_t n, float m);
// x[j] *= s.
void scale_row(float* x, int64_t n, float s);
// sum_j x[j] * y[j].
float dot_row(const float* x, const float* y, int64_t n);
// x[j] = p[j] * (x[j] - d): the softmax-gradient row of attention (dS = P o (dP - D)).
void softmax_grad_row(float* x, const float* p, int64_t n, float d);

// One cross-entropy row: returns -log softmax(logits)[label] and writes
// d[j] = (softmax_j - [j == label]) * grad_scale. d may alias logits.
float cross_entropy_row(const float* logits, float* d, int64_t vocab, int32_t label, float grad_scale);

// out[j] = silu(g[j]) * u[j]; and its backward (dg, du may alias g, u, dout).
void swiglu_fwd_row(float* out, const float* g, const float* u, int64_t n);
void swiglu_bwd_row(float* dg, float* du, const float* dout, const float* g, const float* u, int64_t n);
// The same with torch's tanh-approximated GELU in place of silu (GeGLU).
void geglu_fwd_row(float* out, const float* g, const float* u, int64_t n);
void geglu_bwd_row(float* dg, float* du, const float* dout, const float* g, const float* u, int64_t n);

// RMSNorm of one row; returns rstd. And the dx row (dw handled by the caller).
float rmsnorm_fwd_row(float* out, const float* x, const float* w, int64_t c, float eps);
void rmsnorm_bwd_row(float* dx, const float* dout, const float* x, const float* w, float rstd, int64_t c);

// 4-bit codes to f32, high nibble first (bitsandbytes order): out[2i] = code[bytes[i] >> 4] * scale,
// out[2i+1] = code[bytes[i] & 15] * scale. One multiply per element, so equal to the scalar form.
void decode_4bit(float* out, const uint8_t* bytes, int64_t n_bytes, const float* code, float scale);

// One rotary head in place, HF rotate_half pairs (j, j+half): x1' = x1 c - x2 s, x2' = x2 c + x1 s
// with s = sign * sin (sign -1: the inverse rotation, the backward).
void rope_row(float* x, const float* cos, const float* sin, int64_t half, float sign);

// The PyTorch AdamW update of n elements (cpu_loss_optim.cpp derives the scalars).
struct AdamwScalars {
  float decay, w1, b2f, c2, neg_step_size, bc2_sqrt, eps;
  bool small_w;
};
void adamw_row(float* p, const float* g, float* m, float* v, int64_t n, const AdamwScalars& s);

// y[j] += x[j].
void add_row(float* y, const float* x, int64_t n);

// The instruction set the dispatched kernels run with on this machine ("avx512", "avx2", "baseline").
const char* simd_level();

}  // namespace qlora::cpu
