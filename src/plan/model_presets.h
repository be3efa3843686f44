// Resolves `--model` for planning: a preset name, an HF model directory, a config.json or a GGUF
// file (only its header and metadata are read).
#pragma once
#include <string>

#include "model/llama_config.h"

namespace qlora {

// Unknown preset names: Error(Config) listing the presets and suggesting the closest one. Paths
// that do not exist: Error(Io). A directory without config.json or *.gguf: Error(Io) saying so.
LlamaConfig resolve_model(const std::string& spec);

}  // namespace qlora
