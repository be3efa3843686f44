// The engine's buffer list for a model + training shape: the single source of truth that the
// engine allocates from and that `qlora plan` reports.
#pragma once
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "core/memory_plan.h"
#include "model/modes.h"
#include "model/llama_config.h"
#include "model/lora.h"

namespace qlora {

struct ModelPlanOptions {
  Method method = Method::Lora;
  DType compute_dtype = DType::F32;     // activations and unquantized frozen weights (CPU F32, CUDA BF16)
  std::optional<BasePrecision> base_precision;  // unset: the compute dtype's float (base_of)
  int64_t quant_blocksize = 64;
  bool double_quant = true;
  bool quantize_embeddings = false;     // embeddings / lm_head stay in compute dtype unless asked
  LoraSpec lora;                        // r and targets size the adapters; dropout > 0 plans its mask's buffer
  DType optimizer_dtype = DType::F32;
  // ZeRO-1 over this many data-parallel ranks: each AdamW moment is planned as "<name>.shard" of
  // ceil(elements / optimizer_shards) elements, this rank's share (as shard_plan() plans it).
  int64_t optimizer_shards = 1;
  // sharding fsdp: the frozen projections of each decoder layer are one blob (layer_base_blob),
  // split evenly in bytes over base_shards ranks; this rank (base_shard_rank) keeps its share,
  // slice_of(blob, rank, shards), as "layers.<l>.base.shard", and "fsdp.gather" holds two whole
  // layers, all-gathered before use. 0: not sharded (each projection is its own buffer).
  int64_t base_shards = 0, base_shard_rank = 0;
  int64_t micro_batch = 1, seq_len = 2048;
  Checkpointing checkpointing = Checkpointing::None;
  // Checkpointing only: the MLP (gate, up, activation, down and their gradients) runs over tiles of
  // this many tokens in the forward and in the backward's recompute, so its (tokens x intermediate)
  // buffers are one tile long. 0, or at least micro_batch * seq_len: untiled.
  int64_t mlp_tile = 0;
  // How the CUDA attention backward forms dQ: Accumulate plans its f32 accumulator (cuda.attn_dq_acc
  // at every token), Recompute plans none (core/attention_dq.h).
  AttnDq attn_dq = AttnDq::Accumulate;
  int64_t ce_chunk = 1024;              // tokens per cross-entropy chunk
  // Generation through the training forward: each layer's keys and values for this many positions
  // (prompt + answer). 0: no KV cache (a run without sample answers).
  int64_t kv_cache_tokens = 0;
  // Tensor-core dtype of the frozen base's forward GEMMs (qlora plan --gemm-dtype): "bf16" (a
  // quantized base is dequantized a layer ahead), "fp8" (an fp8 base read as stored by the
  // matmul_fp8 op) or "fp4" (an NVFP4/MXFP4 base read as stored by matmul_fp4, with its GEMM
  // scales planned beside it); the backward's dy W stays bf16. Resolve it with
  // resolve_gemm_dtype (model/gemm_dtype.h) before planning: buffers and scratch depend on it.
  GemmDtype gemm_dtype = GemmDtype::Bf16;
  // A mixture-of-experts model's experts stored in another precision than the rest (qlora plan
  // --expert-precision; gpt-oss ships MXFP4 experts beside bf16 attention). Unset: base_of().
  // Planned only: the engine refuses it.
  std::optional<BasePrecision> expert_precision;
};

// Rows of the MLP's (tokens x intermediate) buffers: the tile, or every token of a micro-batch; in a
// mixture-of-experts model one per (token, chosen expert), never tiled.
int64_t mlp_rows(const ModelPlanOptions& o, const LlamaConfig& c);

// The base precision the options run with: as set, else the compute dtype's float.
inline BasePrecision base_of(const ModelPlanOptions& o) { return o.base_precision.value_or(float_base(o.compute_dtype)); }

// The seven projection names in layer order.
const std::vector<std::string>& all_linear_targets();
// The projections a layer holds as plain (out,in) weights: the seven, or in a mixture-of-experts
// model the attention's four (its MLP is the router and the stacked experts, model/experts.h).
const std::vector<std::string>& dense_projections(const LlamaConfig& c);
// (out_features, in_features) of a projection.
std::pair<int64_t, int64_t> projection_shape(const LlamaConfig& c, const std::string& proj);

// One decoder layer's frozen projections back to back as they are stored (packed quantized bytes or
// floats in the base's dtype): projection p (all_linear_targets order) at offset[p], bytes[p] long;
// each offset and the total are 256-byte aligned, so a gathered layer's tensors are aligned as in
// the arena.
struct LayerBaseBlob {
  int64_t offset[7] = {}, bytes[7] = {};
  int64_t total = 0;
};
LayerBaseBlob layer_base_blob(const LlamaConfig& c, const ModelPlanOptions& o);

// Layers of a quantized base dequantized per micro-step in steady state. ws.dequant holds two layers:
// the forward prepares layer l+1 while layer l computes, the backward l-1 while l computes (a layer
// is dequantized once for its recompute and its gradients). The last two layers of the forward are
// still there for the backward, and the first two of the backward for the next forward: 2L - 4.
int64_t dequant_layers_per_micro_step(int64_t n_layer);

// The same with FP8 or FP4 base GEMMs (gemm_dtype "fp8"/"fp4"): the forward and its recompute read the
// weights as stored; only the backward's dy W (bf16: an "NN" product, which cuBLASLt's FP8 kernels
// take only on sm_100) dequantizes, each layer once. From 4 layers on none of the two slots' layers
// survives to be reused: L; below that the 2L - 4 rule's reuse applies.
inline int64_t dequant_layers_per_micro_step(int64_t n_layer, GemmDtype gemm_dtype) {
  if (gemm_dtype == GemmDtype::Bf16) return dequant_layers_per_micro_step(n_layer);
  return n_layer >= 4 ? n_layer : std::max<int64_t>(0, 2 * n_layer - 4);
}

// Appends every buffer of the engine for this configuration to `plan`.
void plan_model_buffers(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o);

}  // namespace qlora
