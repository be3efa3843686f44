// A base model with a PEFT LoRA adapter folded into its weights, one tensor at a time: what
// `qlora merge` writes as a Hugging Face model and `qlora export` as a GGUF. Memory stays near one
// tensor: nothing holds the whole model.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/json_util.h"
#include "io/safetensors.h"
#include "model/llama_config.h"
#include "model/decoder_model.h"
#include "model/lora.h"

namespace qlora {

// A PEFT adapter directory (adapter_config.json + adapter_model.safetensors) checked against a base
// config: every LoRA tensor its targets call for is present with the shape the base implies, and
// it holds nothing else (no modules_to_save, no embedding LoRA). Errors name the file and tensor.
struct PeftAdapter {
  std::string dir;
  LoraSpec spec;
  std::shared_ptr<const SafetensorsArchive> weights;
};
PeftAdapter open_peft_adapter(const std::string& dir, const LlamaConfig& cfg);

// HF shape of a base tensor named by llama_hf_tensor_names(cfg).
std::vector<int64_t> llama_hf_tensor_shape(const LlamaConfig& cfg, const std::string& hf_name);

// The projection "layers.L.q_proj" of an HF weight name ("model.layers.L.self_attn.q_proj.weight"),
// or "" for tensors LoRA does not touch (norms, embeddings, biases).
std::string lora_module_of(const std::string& hf_name);


class MergedModel {
 public:
  // base: the source `open_model_source` gives for an HF directory, a GGUF file or a bnb-4bit
  // checkpoint; adapter: nullopt for the base alone.
  MergedModel(LlamaConfig cfg, TensorSource base, std::optional<PeftAdapter> adapter);

  const LlamaConfig& config() const { return cfg_; }
  const std::vector<std::string>& names() const { return names_; }  // HF state-dict order
  std::vector<int64_t> shape(const std::string& hf_name) const { return llama_hf_tensor_shape(cfg_, hf_name); }
  // Whether the adapter changes this tensor.
  bool merged(const std::string& hf_name) const;
  // fp32 values of the tensor: the base dequantized, plus scale * B·A for an adapted projection
  // (the product summed in double over the rank, then added to the fp32 base value).
  void read(const std::string& hf_name, float* dst) const;
  std::vector<float> read(const std::string& hf_name) const;

  // The base's own quantized bytes of `hf_name`, rows x cols as TensorSource::read_quantized gives
  // them, where the adapter leaves the tensor alone and the base stores it quantized (gpt-oss's
  // MXFP4 experts); nullopt otherwise.
  std::optional<QuantizedTensor> stored_quantized(const std::string& hf_name, int64_t rows, int64_t cols) const;
  // How the base stores its experts when not as its other weights (gpt-oss's MXFP4), else nullopt.
  const std::optional<QuantParams>& base_expert_quant() const { return base_.stored_expert_quant; }

  // How the base stores its weights ("bf16", "float32", "nf4 (double quant)" ...), for messages.
  const std::string& base_precision() const { return base_precision_; }
  bool base_quantized() const { return base_.stored_quant.has_value(); }
  const std::optional<PeftAdapter>& adapter() const { return adapter_; }

 private:
  LlamaConfig cfg_;
  TensorSource base_;
  std::optional<PeftAdapter> adapter_;
  std::vector<std::string> names_;
  std::string base_precision_;
  // The adapter of the last expert stack read: read() goes expert by expert through a layer, and
  // each expert's pair is a slice of the stack's A and B (not thread-safe, as read() is not shared).
  struct ExpertCache {
    std::string key;
    std::vector<float> a, b;
  };
  mutable ExpertCache expert_cache_;
};

}  // namespace qlora
