// The engine spec a training config describes: the one place a TrainConfig becomes an EngineSpec
// (model/engine_spec.h). `qlora train`, `qlora eval` and `qlora plan --config` all make it here.
#pragma once
#include <cstdint>

#include <optional>

#include "model/engine_spec.h"
#include "model/llama_config.h"
#include "train/preference.h"
#include "train/train_config.h"

namespace qlora {

// Method (qlora for a quantized base), base precision, quantization, LoRA, checkpointing, GEMM
// dtype, sharding and the shapes (per_device_train_batch_size x max_length), each parsed from its
// key (the error names it).
EngineSpec engine_spec(const TrainConfig& c);

// router_aux_loss_coef set to a number: the model's load-balancing loss coefficient becomes it (0:
// none), whatever its config.json says; auto leaves the model's own. Error(Config) naming the key
// for a model without experts.
void apply_router_aux_loss(const TrainConfig& c, LlamaConfig& model);

// The longest row a config's batches can hold: max_length, or twice it for preference objectives,
// whose rows hold two documents of at most max_length tokens each.
int64_t row_tokens_cap(const TrainConfig& c);

// The preference objective of a config (rl, loss_type, beta, ...), or nullopt for rl: sft.
std::optional<PreferenceSpec> preference_spec(const TrainConfig& c);

// Positions of the sample answers' KV cache for rows of seq_len tokens: a prompt as long as a
// training row plus its answer; 0 without sample_prompts.
int64_t sample_kv_tokens(const TrainConfig& c, int64_t seq_len);

// The spec at the shapes a run actually uses (the longest row may be shorter than max_length; the
// micro-batch may serve evaluation too), with the KV cache sized to match.
EngineSpec with_shapes(EngineSpec s, const TrainConfig& c, int64_t micro_batch, int64_t seq_len);

}  // namespace qlora
