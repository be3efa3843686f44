// Opens what `model_name_or_path` names (a Hugging Face model directory today) as a config,
// a tensor source and a text encoder.
#pragma once
#include <memory>
#include <string>

#include "model/llama_config.h"
#include "model/llama_model.h"
#include "train/data.h"

namespace qlora {

struct ModelSource {
  LlamaConfig config;
  TensorSource tensors;
  TextEncoder encoder;
  std::shared_ptr<void> keepalive;  // mapped files behind `tensors`
};

ModelSource open_model_source(const std::string& model_name_or_path);

// Bytes 0..255 are ids 0..255, BOS 256, EOS 257: the fallback for models without a tokenizer.
TextEncoder byte_level_encoder();

}  // namespace qlora
