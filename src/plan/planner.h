// The planner: one GPU's MemoryPlan (the engine's own buffer list, full fine-tune state, sharding,
// estimated library overhead), whether it fits, why not, and the speed estimate.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/memory_plan.h"
#include "model/model_plan.h"
#include "plan/plan_request.h"
#include "plan/speed_model.h"

namespace qlora {

struct PlanResult {
  PlanRequest req;                 // normalized
  // The engine's options for it, resolved once (model_plan_options): GEMM dtype, auto MLP tile.
  // Sharding fsdp: the last rank's.
  ModelPlanOptions options;
  MemoryPlan replica;              // one model replica's buffers (engine buffers + full fine-tune state)
  MemoryPlan plan;                 // one GPU's buffers after sharding, with the overhead lines
  std::map<MemCategory, int64_t> categories;  // device bytes per category (all eight present)
  int64_t total_bytes = 0;         // device bytes needed per GPU
  int64_t device_bytes = 0;        // the GPU's memory
  int64_t headroom_bytes = 0;      // device - total (negative when it does not fit)
  int64_t host_bytes = 0;          // pinned host memory per GPU (offloaded checkpoints, CUDA upload staging)
  bool fits = false;
  std::vector<std::string> warnings;
  std::vector<std::string> why;    // when it does not fit: what takes the memory
  SpeedEstimate speed;
  // sharding fsdp: each rank's planned device bytes without overhead (ranks differ by the
  // remainders of the even byte split); empty for the other shardings (every rank as `plan`).
  std::vector<int64_t> per_rank_bytes;
};

// Options handed to plan_model_buffers for a request (GPU compute dtype bf16). Sharding fsdp:
// those of rank `rank` (-1: the last, which holds the largest share).
ModelPlanOptions model_plan_options(const PlanRequest& req, int rank = -1);

// The planned bytes one GPU (or the CPU) can hold: its memory less the overhead lines that do not
// grow with the plan, and less the fragmentation share of what remains. The auto MLP tile is the
// largest that keeps the plan under it (mlp_tile_for_budget).
int64_t plan_memory_budget(const PlanRequest& req, const PlanAssumptions& a = plan_assumptions());

// The estimated library overhead lines for one GPU whose planned buffers take `planned` bytes.
std::vector<std::pair<std::string, int64_t>> overhead_lines(const PlanRequest& req, int64_t planned,
                                                            const PlanAssumptions& a = plan_assumptions());

// Normalizes the request (throws on impossible input) and computes the plan. Never allocates.
PlanResult make_plan(const PlanRequest& req);

}  // namespace qlora
