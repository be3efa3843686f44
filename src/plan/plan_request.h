// PlanRequest: everything a plan depends on (model shape, training options, device, topology),
// with defaults filled in and impossible combinations rejected before anything is computed.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/engine_spec.h"
#include "model/modes.h"
#include "plan/gpu_catalog.h"
#include "plan/sharding.h"

namespace qlora {

// The engine spec (what runs: model/engine_spec.h) plus where and how long: the model's shape, the
// GPU and the topology, the optimizer steps' accumulation and the data's packing. The spec's
// lora.targets: empty = the model's LoRA modules (lora_modules), "all-linear" = all seven
// projections (refused on a mixture-of-experts model); lora.dropout > 0 keeps one more
// buffer; sharding: Zero1/2/3 are planned over the replica (shard_plan), Fsdp as the engine runs it.
struct PlanRequest : EngineSpec {
  LlamaConfig model;
  std::string model_label;            // preset name or path, for messages
  GpuSpec gpu;

  int64_t grad_accum = 1;             // micro-steps per optimizer step
  bool packing = true;                // documents packed into full sequences (no padding)
  int64_t avg_doc_len = 0;            // mean example length in tokens; 0 = one example fills a sequence
  Topology topo;
  // A mixture-of-experts model's experts in their own precision (--expert-precision; a checkpoint
  // that ships them so, gpt-oss's MXFP4, by default). Unset: the base precision.
  std::optional<BasePrecision> expert_precision;
  // A training config's router_aux_loss_coef over the model's own (nullopt: the model's).
  std::optional<double> router_aux_loss_coef;

  DType compute_dtype() const { return gpu.is_cpu ? DType::F32 : DType::BF16; }
  BasePrecision base() const { return resolved_base(*this, compute_dtype()); }
};

// Returns the request with defaults resolved (base precision, double quant, expanded targets) or
// throws Error(Config) naming the option at fault with a hint. Non-fatal problems are warnings
// produced by the planner, not errors.
PlanRequest normalize_request(const PlanRequest& req);

}  // namespace qlora
