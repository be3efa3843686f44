// PlanRequest: everything a plan depends on (model shape, training options, device, topology),
// with defaults filled in and impossible combinations rejected before anything is computed.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/modes.h"
#include "plan/gpu_catalog.h"
#include "plan/sharding.h"

namespace qlora {

struct PlanRequest {
  LlamaConfig model;
  std::string model_label;            // preset name or path, for messages
  GpuSpec gpu;

  std::string method = "lora";        // full | lora | qlora
  std::string base_precision;         // "" = bf16 for full/lora, nf4 for qlora
  std::optional<bool> double_quant;   // nf4/fp4 only; unset = true for those
  int64_t quant_blocksize = 64;       // nf4/fp4 block size (nvfp4/mxfp4 have fixed blocks)
  int64_t lora_r = 16;
  std::vector<std::string> targets;   // empty or "all-linear" = all seven projections
  bool lora_dropout = false;          // dropout on the LoRA input keeps one more buffer
  std::string optimizer_dtype = "fp32";  // AdamW m/v: fp32 | bf16
  int64_t micro_batch = 1;            // sequences per GPU per micro-step
  int64_t seq_len = 2048;             // tokens per sequence
  int64_t grad_accum = 1;             // micro-steps per optimizer step
  bool packing = true;                // documents packed into full sequences (no padding)
  int64_t avg_doc_len = 0;            // mean example length in tokens; 0 = one example fills a sequence
  Checkpointing checkpointing = Checkpointing::None;
  int64_t ce_chunk = 1024;            // tokens per cross-entropy chunk
  Sharding sharding = Sharding::None;
  Topology topo;
  GemmDtype gemm_dtype = GemmDtype::Bf16;  // tensor-core dtype of the base-weight GEMMs
  int64_t kv_cache_tokens = 0;        // sample answers' KV cache (positions); 0 = none
};

// Base precisions the planner accepts, and whether one is a quantized (QLoRA) format.
const std::vector<std::string>& plan_base_precisions();
bool is_quantized_precision(const std::string& p);
bool is_bnb_4bit(const std::string& p);  // nf4 | fp4: bitsandbytes block layout, double-quant capable

// Returns the request with defaults resolved (base precision, double quant, expanded targets) or
// throws Error(Config) naming the option at fault with a hint. Non-fatal problems are warnings
// produced by the planner, not errors.
PlanRequest normalize_request(const PlanRequest& req);

}  // namespace qlora
