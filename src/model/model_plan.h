// The engine's buffer list for a model + training shape: the single source of truth that the
// engine allocates from and that `qlora plan` reports.
#pragma once
#include <string>
#include <vector>

#include "core/memory_plan.h"
#include "model/llama_config.h"

namespace qlora {

struct ModelPlanOptions {
  std::string method = "lora";          // full | lora | qlora
  DType compute_dtype = DType::F32;     // activations and unquantized frozen weights (CPU F32, CUDA BF16)
  std::string base_precision;           // "" (= compute dtype) | fp32 | bf16 | fp8 | nf4 | fp4 | nvfp4 | mxfp4
  int64_t quant_blocksize = 64;
  bool double_quant = true;
  bool quantize_embeddings = false;     // embeddings / lm_head stay in compute dtype unless asked
  int64_t lora_r = 16;
  std::vector<std::string> targets;     // q_proj ... down_proj
  bool lora_dropout = false;
  DType optimizer_dtype = DType::F32;
  // ZeRO-1 over this many data-parallel ranks: each AdamW moment is planned as "<name>.shard" of
  // ceil(elements / optimizer_shards) elements, this rank's share (as shard_plan() plans it).
  int64_t optimizer_shards = 1;
  int64_t micro_batch = 1, seq_len = 2048;
  std::string checkpointing = "none";   // none | full | offload
  int64_t ce_chunk = 1024;              // tokens per cross-entropy chunk
  // Generation through the training forward: each layer's keys and values for this many positions
  // (prompt + answer). 0: no KV cache (a run without sample answers).
  int64_t kv_cache_tokens = 0;
};

// The seven projection names in layer order.
const std::vector<std::string>& all_linear_targets();
// (out_features, in_features) of a projection.
std::pair<int64_t, int64_t> projection_shape(const LlamaConfig& c, const std::string& proj);

// Layers of a quantized base dequantized per micro-step in steady state. ws.dequant holds two layers:
// the forward prepares layer l+1 while layer l computes, the backward l-1 while l computes (a layer
// is dequantized once for its recompute and its gradients). The last two layers of the forward are
// still there for the backward, and the first two of the backward for the next forward: 2L - 4.
int64_t dequant_layers_per_micro_step(int64_t n_layer);

// Appends every buffer of the engine for this configuration to `plan`.
void plan_model_buffers(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o);

}  // namespace qlora
