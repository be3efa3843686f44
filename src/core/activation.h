// The gated MLP's activation, a property of the model family (config.json's hidden_act /
// hidden_activation) that every backend's swiglu ops take.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define QLORA_ACT_HD __host__ __device__ __forceinline__
#else
#define QLORA_ACT_HD inline
#endif

namespace qlora {

enum class Activation : uint8_t {
  Silu,      // silu(g) = g / (1 + e^-g): SwiGLU (Llama, Mistral, Qwen)
  GeluTanh,  // torch's gelu(approximate="tanh"): GeGLU (Gemma's gelu_pytorch_tanh)
  // gpt-oss's clamped SwiGLU (GptOssExperts._apply_gate), with its alpha and limit:
  // g' = min(g, limit), u' = clamp(u, -limit, limit), out = (u' + 1) g' sigmoid(alpha g').
  ClampedSwiglu,
};

// The clamped SwiGLU's constants (config.json's swiglu_alpha, swiglu_limit; gpt-oss: 1.702, 7).
struct ClampedSwigluParams {
  float alpha = 1.702f, limit = 7.0f;
};

// One element of the clamped SwiGLU and of its backward, shared by the CPU and CUDA backends, in
// f32 in the order torch evaluates GptOssExperts._apply_gate and its autograd: the sigmoid's
// gradient s (1 - s) times alpha added to s, the clamps passing the gradient where
// g <= limit and -limit <= u <= limit (torch's clamp backward keeps the bounds).
QLORA_ACT_HD float clamped_swiglu(float g, float u, ClampedSwigluParams p) {
  const float gc = g > p.limit ? p.limit : g;
  const float uc = u < -p.limit ? -p.limit : u > p.limit ? p.limit : u;
  const float s = 1.0f / (1.0f + expf(-(gc * p.alpha)));
  return (uc + 1.0f) * (gc * s);
}
QLORA_ACT_HD void clamped_swiglu_bwd(float d, float g, float u, ClampedSwigluParams p, float& dg, float& du) {
  const float gc = g > p.limit ? p.limit : g;
  const float uc = u < -p.limit ? -p.limit : u > p.limit ? p.limit : u;
  const float s = 1.0f / (1.0f + expf(-(gc * p.alpha)));
  const float dglu = d * (uc + 1.0f);
  dg = g <= p.limit ? dglu * s + (dglu * gc) * (s * (1.0f - s)) * p.alpha : 0.0f;
  du = u >= -p.limit && u <= p.limit ? d * (gc * s) : 0.0f;
}

inline const char* activation_name(Activation a) {
  return a == Activation::Silu ? "silu" : a == Activation::GeluTanh ? "gelu_pytorch_tanh" : "clamped_swiglu";
}

}  // namespace qlora
