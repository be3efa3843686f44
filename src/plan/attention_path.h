// Which attention implementation the CUDA backend runs on a catalog GPU, and the efficiency the
// speed model assumes for it (the same choice as backend/cuda/cudnn_attention.cu makes on the
// device: cuDNN's fused attention on compute capability 9.x and 10.x, the own kernel elsewhere).
#pragma once
#include <string>

#include "core/attention_dq.h"
#include "plan/assumptions.h"
#include "plan/gpu_catalog.h"

namespace qlora {

struct AttentionPath {
  std::string name;         // "cudnn" or "own" ("cpu" for the CPU device)
  std::string description;  // for reports: "cuDNN fused attention (sm_90/sm_100)"
  double efficiency = 0;    // fraction of the bf16 peak (PlanAssumptions; unused on the CPU device)
};

// True for the catalog's compute capability 9.x and 10.x parts (H100, H200, B200, B300, GB200,
// GB300); custom GPUs are not known to be either.
bool gpu_runs_cudnn_attention(const GpuSpec& gpu);

// With dq in its own pass (AttnDq::Recompute) the plan holds no dq slot, which cuDNN's graphs take
// as their workspace: the own kernels are priced. own_only: the model's attention has what cuDNN's
// graphs lack (gpt-oss's sinks).
AttentionPath attention_path(const GpuSpec& gpu, const PlanAssumptions& a, AttnDq dq = AttnDq::Accumulate,
                             bool own_only = false);

}  // namespace qlora
