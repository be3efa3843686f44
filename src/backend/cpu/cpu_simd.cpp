// Row kernels on GCC generic vectors, one clone per x86-64 level chosen at load time (ifunc).
#include "backend/cpu/cpu_simd.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace qlora::cpu {


namespace {

constexpr int kW = 16;  // lanes of one generic vector
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));

inline vf splat(float x) { return vf{} + x; }
inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
// The first n (< 16) lanes from p, the rest `fill`.
inline vf load_part(const float* p, int64_t n, float fill) {
  vf v = splat(fill);
  for (int64_t j = 0; j < n; j++) v[j] = p[j];
  return v;
}
inline void store_part(float* p, vf v, int64_t n) {
  for (int64_t j = 0; j < n; j++) p[j] = v[j];
}
inline float hsum(vf v) {
  float s = 0.0f;
  for (int j = 0; j < kW; j++) s += v[j];
  return s;
}
inline float hmax(vf v) {
  float m = v[0];
  for (int j = 1; j < kW; j++) m = v[j] > m ? v[j] : m;
  return m;
}
inline vf vmax(vf a, vf b) { return a > b ? a : b; }

// e^x in f32 (Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial, 2^n from the
// exponent bits); about 1 ulp. Below -87.33 (and -inf) it is 0; above 88.37 it saturates.
inline vf vexp(vf x) {
  const vi under = x < splat(-87.33654f);
  x = vmax(x, splat(-87.33654f));
  x = x < splat(88.37626f) ? x : splat(88.37626f);
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf n = (x * splat(1.44269504088896341f) + magic) - magic;
  vf r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  vf p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;  // 2^n from its exponent bits
  std::memcpy(&scale, &e, sizeof scale);
  const vf res = p * scale;
  return under ? splat(0.0f) : res;
}

inline float exp1(float x) {
  vf v = splat(x);
  return vexp(v)[0];
}

}  // namespace

QLORA_SIMD_CLONES
float row_max(const float* x, int64_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  vf m = splat(ninf);
  int64_t j = 0;
  for (; j + kW <= n; j += kW) m = vmax(m, load(x + j));
  if (j < n) m = vmax(m, load_part(x + j, n - j, ninf));
  return hmax(m);
}

QLORA_SIMD_CLONES
float exp_sub_sum(float* x, int64_t n, float mx) {
  const vf m = splat(mx);
  vf s = {};
  int64_t j = 0;
  for (; j + kW <= n; j += kW) {
    const vf e = vexp(load(x + j) - m);
    store(x + j, e);
    s += e;
  }
  if (j < n) {
    const vf e = vexp(load_part(x + j, n - j, -std::numeric_limits<float>::infinity()) - m);
    store_part(x + j, e, n - j);
    s += e;
  }
  return hsum(s);
}

QLORA_SIMD_CLONES
void scale_row(float* x, int64_t n, float s) {
  const vf v = splat(s);
  int64_t j = 0;
  for (; j + kW <= n; j += kW) store(x + j, load(x + j) * v);
  for (; j < n; j++) x[j] *= s;
}

QLORA_SIMD_CLONES
float dot_row(const float* x, const float* y, int64_t n) {
  vf s = {};
  int64_t j = 0;
  for (; j + kW <= n; j += kW) s += load(x + j) * load(y + j);
  if (j < n) s += load_part(x + j, n - j, 0.0f) * load_part(y + j, n - j, 0.0f);
  return hsum(s);
}

QLORA_SIMD_CLONES
void softmax_grad_row(float* x, const float* p, int64_t n, float d) {
  const vf dv = splat(d);
  int64_t j = 0;
  for (; j + kW <= n; j += kW) store(x + j, load(p + j) * (load(x + j) - dv));
  for (; j < n; j++) x[j] = p[j] * (x[j] - d);
}

QLORA_SIMD_CLONES
void decode_4bit(float* out, const uint8_t* bytes, int64_t n_bytes, const float* code, float scale) {
  int64_t i = 0;
#if !defined(__clang__)  // GCC's variable-index __builtin_shuffle; clang builds (the fuzzers) take the scalar loop
  typedef uint8_t vb __attribute__((vector_size(16)));
  const vf table = load(code), s = splat(scale);
  const vi lo_first = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
  const vi hi_first = lo_first + 8;
  for (; i + 16 <= n_bytes; i += 16) {
    vb raw;
    std::memcpy(&raw, bytes + i, sizeof raw);
    const vi b = __builtin_convertvector(raw, vi);
    const vi hi = b >> 4, lo = b & 15;
    store(out + 2 * i, __builtin_shuffle(table, __builtin_shuffle(hi, lo, lo_first)) * s);
    store(out + 2 * i + kW, __builtin_shuffle(table, __builtin_shuffle(hi, lo, hi_first)) * s);
  }
#endif
  for (; i < n_bytes; i++) {
    out[2 * i] = code[bytes[i] >> 4] * scale;
    out[2 * i + 1] = code[bytes[i] & 15] * scale;
  }
}

QLORA_SIMD_CLONES
void rope_row(float* x, const float* cos, const float* sin, int64_t half, float sign) {
  int64_t j = 0;
  const vf sg = splat(sign);
  for (; j + kW <= half; j += kW) {
    const vf x1 = load(x + j), x2 = load(x + half + j), c = load(cos + j), s = load(sin + j) * sg;
    store(x + j, x1 * c - x2 * s);
    store(x + half + j, x2 * c + x1 * s);
  }
  for (; j < half; j++) {
    const float x1 = x[j], x2 = x[half + j], c = cos[j], s = sign * sin[j];
    x[j] = x1 * c - x2 * s;
    x[half + j] = x2 * c + x1 * s;
  }
}

QLORA_SIMD_CLONES
void add_row(float* y, const float* x, int64_t n) {
  int64_t j = 0;
  for (; j + kW <= n; j += kW) store(y + j, load(y + j) + load(x + j));
  for (; j < n; j++) y[j] += x[j];
}

QLORA_SIMD_CLONES
float cross_entropy_row(const float* logits, float* d, int64_t vocab, int32_t label, float grad_scale) {
  // Everything read from logits is read before d (which may alias it) is written.
  const float label_logit = logits[label];
  const float mx = row_max(logits, vocab);
  const vf m = splat(mx);
  vf s = {};
  int64_t j = 0;
  for (; j + kW <= vocab; j += kW) s += vexp(load(logits + j) - m);
  if (j < vocab) s += vexp(load_part(logits + j, vocab - j, -std::numeric_limits<float>::infinity()) - m);
  const float lse = mx + std::log(hsum(s));
  const vf l = splat(lse), gs = splat(grad_scale);
  for (j = 0; j + kW <= vocab; j += kW) store(d + j, vexp(load(logits + j) - l) * gs);
  for (; j < vocab; j++) d[j] = exp1(logits[j] - lse) * grad_scale;
  d[label] -= grad_scale;
  return lse - label_logit;
}

// silu(g) = g / (1 + e^-g), as torch's CPU kernel writes it.
QLORA_SIMD_CLONES
void swiglu_fwd_row(float* out, const float* g, const float* u, int64_t n) {
  const vf one = splat(1.0f);
  int64_t j = 0;
  for (; j + kW <= n; j += kW) {
    const vf gv = load(g + j);
    store(out + j, gv / (one + vexp(-gv)) * load(u + j));
  }
  for (; j < n; j++) out[j] = g[j] / (1.0f + exp1(-g[j])) * u[j];
}

QLORA_SIMD_CLONES
void swiglu_bwd_row(float* dg, float* du, const float* dout, const float* g, const float* u, int64_t n) {
  const vf one = splat(1.0f);
  int64_t j = 0;
  for (; j + kW <= n; j += kW) {
    const vf gv = load(g + j), uv = load(u + j), dv = load(dout + j);
    const vf e = one + vexp(-gv);
    const vf s = one / e;
    store(dg + j, dv * uv * (s * (one + gv * (one - s))));
    store(du + j, dv * (gv / e));
  }
  for (; j < n; j++) {
    const float gv = g[j], uv = u[j], dv = dout[j];
    const float e = 1.0f + exp1(-gv);
    const float s = 1.0f / e;
    dg[j] = dv * uv * (s * (1.0f + gv * (1.0f - s)));
    du[j] = dv * (gv / e);
  }
}

// gelu_tanh(g) = 0.5 g (1 + tanh(b (g + k g^3))), b = sqrt(2/pi), k = 0.044715, in f32 as torch's
// CPU GeluKernel (approximate="tanh") and GeluBackwardKernel write it.
namespace {
constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluKappa = 0.044715f;
}  // namespace

void geglu_fwd_row(float* out, const float* g, const float* u, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    const float x = g[j], inner = kGeluBeta * (x + kGeluKappa * (x * x * x));
    out[j] = 0.5f * x * (1.0f + std::tanh(inner)) * u[j];
  }
}

void geglu_bwd_row(float* dg, float* du, const float* dout, const float* g, const float* u, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    const float x = g[j], uv = u[j], d = dout[j];
    const float x_sq = x * x, t = std::tanh(kGeluBeta * (x + kGeluKappa * x_sq * x));
    const float gelu = 0.5f * x * (1.0f + t);
    const float dgelu = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * x_sq);
    dg[j] = d * uv * dgelu;
    du[j] = d * gelu;
  }
}

// Like HF LlamaRMSNorm in fp32: mean(x^2) + eps as f32, then rsqrt.
QLORA_SIMD_CLONES
float rmsnorm_fwd_row(float* out, const float* x, const float* w, int64_t c, float eps) {
  const float var_eps = dot_row(x, x, c) / float(c) + eps;
  const float r = float(1.0 / std::sqrt(double(var_eps)));
  const vf rv = splat(r);
  int64_t j = 0;
  for (; j + kW <= c; j += kW) store(out + j, load(w + j) * (load(x + j) * rv));
  for (; j < c; j++) out[j] = w[j] * (x[j] * r);
  return r;
}

// y_j = w_j x_j r, r = (mean(x^2)+eps)^-1/2:  dx_j = r w_j dout_j - (r^3 / C) x_j sum_k(w_k dout_k x_k).
QLORA_SIMD_CLONES
void rmsnorm_bwd_row(float* dx, const float* dout, const float* x, const float* w, float rstd, int64_t c) {
  vf s = {};
  int64_t j = 0;
  for (; j + kW <= c; j += kW) s += load(w + j) * load(dout + j) * load(x + j);
  float dot = hsum(s);
  for (; j < c; j++) dot += w[j] * dout[j] * x[j];
  const float coef = rstd * rstd * rstd * dot / float(c);
  const vf rv = splat(rstd), cv = splat(coef);
  for (j = 0; j + kW <= c; j += kW) store(dx + j, rv * load(w + j) * load(dout + j) - cv * load(x + j));
  for (; j < c; j++) dx[j] = rstd * w[j] * dout[j] - coef * x[j];
}

const char* simd_level() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return "avx512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
  return "baseline";
#else
  return "baseline";
#endif
}

}  // namespace qlora::cpu
