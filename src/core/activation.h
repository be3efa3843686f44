// The gated MLP's activation, a property of the model family (config.json's hidden_act /
// hidden_activation) that every backend's swiglu ops take.
#pragma once
#include <cstdint>

namespace qlora {

enum class Activation : uint8_t {
  Silu,      // silu(g) = g / (1 + e^-g): SwiGLU (Llama, Mistral, Qwen)
  GeluTanh,  // torch's gelu(approximate="tanh"): GeGLU (Gemma's gelu_pytorch_tanh)
};

inline const char* activation_name(Activation a) { return a == Activation::Silu ? "silu" : "gelu_pytorch_tanh"; }

}  // namespace qlora
