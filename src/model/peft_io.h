// PEFT adapter files: adapter_config.json + adapter_model.safetensors, read and written.
#pragma once
#include <map>
#include <string>

#include "model/decoder_model.h"

namespace qlora {

// adapter_config.json text as PEFT writes it for a LoRA on a causal LM. The text model of a
// multimodal checkpoint (`multimodal` non-empty, LlamaConfig::multimodal) gets its targets as the
// regex peft_text_model_targets() makes, so PEFT adapts the language model and not the vision tower.
std::string peft_adapter_config_json(const LoraSpec& lora, const std::string& base_model,
                                     const std::string& multimodal = "");
// ".*language_model.*\.(q_proj|v_proj)": PEFT matches a string target_modules against whole
// module names ("model.language_model.layers.0.self_attn.q_proj"); read back by
// read_peft_adapter_config.
std::string peft_text_model_targets(const std::vector<std::string>& targets);
// Writes adapter_config.json + adapter_model.safetensors into `dir` (an existing directory;
// callers use AtomicDir so a half-written adapter never appears under its final name).
void write_peft_adapter(const std::string& dir, DecoderModel& model, const std::string& base_model,
                        const std::map<std::string, std::string>& metadata = {});
// Loads LoRA weights from a PEFT adapter directory into the model. Checks r, targets and shapes;
// errors name the file and the key.
void load_peft_adapter(const std::string& dir, DecoderModel& model);
// Reads the LoRA hyper-parameters of an adapter_config.json.
LoraSpec read_peft_adapter_config(const std::string& path);

// A parameter's values and shape as PEFT stores them, from the engine's (w, g, ...: same layout as
// p.w). Only an expert stack's lora_B differs (TrainParam::experts): the engine's (E*out, r) with
// expert e's rows at e*out is PEFT's (out, r*E) with expert e's column j at j*E + e.
std::vector<float> to_peft_layout(const TrainParam& p, const std::vector<float>& engine);
std::vector<float> from_peft_layout(const TrainParam& p, const std::vector<float>& peft);
std::vector<int64_t> peft_shape(const TrainParam& p);

// Optimizer moments as "<peft_key>.exp_avg" / ".exp_avg_sq" in a safetensors file (in the engine's
// layout: only the engine reads them back).
void write_optimizer_state(const std::string& path, DecoderModel& model);
void load_optimizer_state(const std::string& path, DecoderModel& model);

}  // namespace qlora
