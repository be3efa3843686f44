// Mixture-of-experts layers (Mixtral, Qwen3-MoE): the engine's names and shapes of a layer's router
// and stacked experts, and the checkpoint's per-expert tensors read as those stacks.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/llama_config.h"
#include "model/decoder_model.h"
#include "quant/quantize.h"

namespace qlora {

// The three expert weights of a layer, each stacked over the experts as one buffer
// "layers.<l>.experts.<kind>" of shape (n_experts, out, in): gate_proj and up_proj
// (expert_intermediate_size, hidden_size), down_proj (hidden_size, expert_intermediate_size).
const std::vector<std::string>& expert_kinds();
std::pair<int64_t, int64_t> expert_shape(const LlamaConfig& c, const std::string& kind);
// A quantized base stores each expert's packed weight (quant/quant_layout.h) at this byte stride
// (256-byte aligned) in its stack.
int64_t expert_stride_bytes(const LlamaConfig& c, const std::string& kind, const QuantParams& q);

// The checkpoint's name of expert e's `kind` weight in layer l: Mixtral's
// "model.layers.<l>.block_sparse_moe.experts.<e>.w1.weight" (w1 gate, w3 up, w2 down), Qwen3-MoE's
// "model.layers.<l>.mlp.experts.<e>.gate_proj.weight"; and of the router (Mixtral
// "block_sparse_moe.gate.weight", Qwen3-MoE "mlp.gate.weight").
std::string hf_expert_name(const LlamaConfig& c, int64_t layer, int64_t expert, const std::string& kind);
std::string hf_router_name(const LlamaConfig& c, int64_t layer);
// Layer, expert and kind (expert_kinds) of a checkpoint's per-expert tensor named as
// hf_expert_name names it; nullopt for any other name.
struct ExpertTensor {
  int64_t layer = 0, expert = 0;
  std::string kind;
};
std::optional<ExpertTensor> hf_expert_of(const LlamaConfig& c, const std::string& hf_name);
// The (out,in) shape of a checkpoint tensor those two name; nullopt for any other name.
std::optional<std::pair<int64_t, int64_t>> hf_moe_tensor_shape(const LlamaConfig& c, const std::string& hf_name);

// gpt-oss (GptOssForCausalLM): the shape of its tensors besides the Llama ones (sinks, o_proj's and
// the router's biases, the fused expert stacks (E, in, out) and their biases); nullopt for any
// other name or model. And which fused stack a name is ("gate_up_proj", "down_proj"; "" if none).
std::optional<std::vector<int64_t>> gpt_oss_tensor_shape(const LlamaConfig& c, const std::string& hf_name);
std::string gpt_oss_stack(const LlamaConfig& c, const std::string& hf_name);

// src itself for a dense model; else a source that also answers the engine's names
// "model.layers.<l>.mlp.experts.<kind>" (the stack, (n_experts, out, in), read expert by expert) and
// "model.layers.<l>.mlp.router.weight" (the router under the family's name). A quantized expert is
// read dequantized (read_quantized answers false for the stacks).
TensorSource experts_source(const LlamaConfig& c, const TensorSource& src);

}  // namespace qlora
