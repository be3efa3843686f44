// Full fine-tuning's output: the trained weights as a Hugging Face model directory, which
// transformers loads (from_pretrained) and the engine opens as a base (model_name_or_path).
#pragma once
#include <string>
#include <vector>

#include "model/decoder_model.h"

namespace qlora {

// Writes dir/model.safetensors (every trained weight under its Hugging Face name, in f32: the CPU
// trains f32 weights) and dir/config.json (the base directory's own with its dtype set to float32,
// or, for a GGUF base, written from the model's config), and copies the base directory's tokenizer
// files and generation_config.json. Returns notes on what could not be carried over.
std::vector<std::string> write_trained_model(const std::string& dir, DecoderModel& model, const std::string& base);

}  // namespace qlora
