// Step-time estimate: FLOPs / (peak x efficiency) for GEMMs and attention, bytes / bandwidth for
// memory-bound work, plus the communication and offload traffic that compute cannot hide.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/memory_plan.h"
#include "plan/assumptions.h"
#include "plan/flops.h"
#include "plan/plan_request.h"

namespace qlora {

struct SpeedEstimate {
  FlopCounts per_token;              // FLOPs per processed token
  double tokens_per_step = 0;        // processed by all GPUs in one optimizer step (padding included)
  double useful_tokens_per_step = 0; // real (non-padding) tokens
  double flops_per_step = 0;         // all GPUs
  // Seconds per optimizer step on one GPU (every GPU does the same work).
  double t_gemm = 0, t_attn = 0, t_memory = 0;
  std::string attention_path;        // the engine's attention on this GPU (plan/attention_path.h)
  double t_comm = 0, t_comm_exposed = 0;
  double t_offload = 0, t_offload_exposed = 0;
  // Base-weight dequantization on a GPU: on a side stream, hidden under the base GEMMs up to
  // PlanAssumptions::dequant_overlap of their time (its bytes are also in memory_bytes).
  double t_dequant = 0, t_dequant_exposed = 0;
  double step_time_s = 0;
  double tokens_per_second = 0;          // useful tokens, all GPUs
  double tokens_per_second_per_gpu = 0;
  double mfu = 0;                        // model FLOPs (no recompute) / (step time x bf16 peak)
  std::vector<std::pair<std::string, double>> memory_bytes;  // per GPU per step, by source
  std::vector<std::pair<std::string, double>> comm_bytes;    // per GPU per step, by collective
};

// `req` must be normalized; `opts` its resolved engine options (PlanResult::options); `replica`
// is one model replica's plan (before sharding).
SpeedEstimate estimate_speed(const PlanRequest& req, const ModelPlanOptions& opts, const MemoryPlan& replica,
                             const PlanAssumptions& a = plan_assumptions());

// Seconds for a collective over `bytes` (the full tensor) on `topo`: ring inside the node, then
// across nodes on each GPU's 1/G share. factor 1 = all-gather or reduce-scatter, 2 = all-reduce.
double collective_seconds(double bytes, double factor, const Topology& topo, const GpuSpec& gpu, double efficiency);

}  // namespace qlora
