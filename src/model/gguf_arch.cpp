#include "model/gguf_arch.h"

namespace qlora {

const std::vector<GgufArch>& gguf_archs() {
  static const std::vector<GgufArch> rows = {
      {.arch = "llama", .model_type = "llama", .qkv_bias = false, .qk_norm = false, .read = true},
      {.arch = "qwen2", .model_type = "qwen2", .qkv_bias = true, .qk_norm = false, .read = true},
      {.arch = "qwen3", .model_type = "qwen3", .qkv_bias = false, .qk_norm = true, .read = true},
      {.arch = "gemma2", .model_type = "gemma2", .qkv_bias = false, .qk_norm = false, .read = true},
      {.arch = "gemma3", .model_type = "gemma3_text", .qkv_bias = false, .qk_norm = true, .read = true},
      {.arch = "phi3", .model_type = "phi3", .qkv_bias = false, .qk_norm = false, .read = true},
      {.arch = "qwen3moe", .model_type = "qwen3_moe", .qkv_bias = false, .qk_norm = true, .read = true},
      {.arch = "gpt-oss", .model_type = "gpt_oss", .qkv_bias = true, .qk_norm = false, .read = true},
      {.arch = "llama", .model_type = "mistral", .qkv_bias = false, .qk_norm = false, .read = false},
      {.arch = "llama", .model_type = "mixtral", .qkv_bias = false, .qk_norm = false, .read = false},
      {.arch = "gemma3", .model_type = "gemma3", .qkv_bias = false, .qk_norm = true, .read = false},  // its text model
  };
  return rows;
}

const GgufArch* gguf_arch_to_read(const std::string& arch) {
  for (const GgufArch& a : gguf_archs())
    if (a.read && arch == a.arch) return &a;
  return nullptr;
}

const GgufArch* gguf_arch_to_write(const std::string& model_type) {
  for (const GgufArch& a : gguf_archs())
    if (model_type == a.model_type) return &a;
  return nullptr;
}

std::string gguf_readable_archs() {
  std::string s;
  for (const GgufArch& a : gguf_archs())
    if (a.read) s += (s.empty() ? "" : ", ") + std::string(a.arch);
  return s;
}

}  // namespace qlora
