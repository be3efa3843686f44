// Opens what `model_name_or_path` names — a Hugging Face model directory or a GGUF file — as a
// config, a tensor source, a tokenizer and a text encoder for the data layer.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "model/llama_config.h"
#include "model/decoder_model.h"
#include "text/tokenizer.h"
#include "train/data.h"

namespace qlora {

struct ModelSource {
  LlamaConfig config;
  TensorSource tensors;
  std::shared_ptr<const Tokenizer> tokenizer;  // null: no usable tokenizer (pre-tokenized data only)
  TextEncoder encoder;                         // what the data layer calls; fails clearly without a tokenizer
  std::string format;                          // "hf" | "gguf"
  std::shared_ptr<void> keepalive;             // mapped files behind `tensors`
  // The checkpoint's own name of the tensor `tensors` calls `hf_name` (a multimodal checkpoint keeps
  // its text model under a prefix); null: the same name.
  std::function<std::string(const std::string& hf_name)> file_name;
};

ModelSource open_model_source(const std::string& model_name_or_path);

// The data layer's view of a tokenizer: encode(text) adds what the tokenizer's post-processor adds
// (e.g. BOS); eos is appended by the data layer after a trained text.
TextEncoder text_encoder(std::shared_ptr<const Tokenizer> tok, const std::string& name);

}  // namespace qlora
