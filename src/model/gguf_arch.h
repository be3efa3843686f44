// llama.cpp's GGUF architectures and the Hugging Face model types they hold: the one table both
// GGUF import (model/gguf_model.cpp) and export (tasks/gguf_export.cpp) read.
#pragma once
#include <string>
#include <vector>

namespace qlora {

struct GgufArch {
  const char* arch;        // general.architecture
  const char* model_type;  // config.json's model_type
  bool qkv_bias;           // the architecture's q/k/v projections have biases
  bool qk_norm;            // per-head RMSNorm on q and k
  bool read;               // import reads this architecture as this model_type (export-only rows: false)
};

// Every row, import rows first. Mistral and Mixtral are written as llama (as convert_hf_to_gguf.py
// does); a llama GGUF with experts reads as mixtral (model/gguf_model.cpp).
const std::vector<GgufArch>& gguf_archs();
// The row import reads `arch` with, or null.
const GgufArch* gguf_arch_to_read(const std::string& arch);
// The architecture a model_type is written as, or null.
const GgufArch* gguf_arch_to_write(const std::string& model_type);
// "llama, qwen2, ..." : the architectures import reads, for messages.
std::string gguf_readable_archs();

}  // namespace qlora
