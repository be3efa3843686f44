// The attention path of a planned GPU (attention_path.h).
#include "plan/attention_path.h"

#include <algorithm>

namespace qlora {

bool gpu_runs_cudnn_attention(const GpuSpec& gpu) {
  static const char* const kSm9xOr10x[] = {"h100-sxm", "h100-nvl", "h200", "b200", "b200-180gb", "b300", "gb200", "gb300"};
  return std::any_of(std::begin(kSm9xOr10x), std::end(kSm9xOr10x), [&](const char* n) { return gpu.name == n; });
}

AttentionPath attention_path(const GpuSpec& gpu, const PlanAssumptions& a, AttnDq dq, bool own_only) {
  if (gpu.is_cpu) return {"cpu", "CPU tiled attention (calibrated rate)", 1.0};
  if (dq == AttnDq::Recompute)
    return {"own", "own flash-attention kernels (mma.sync), dq in its own pass", a.own_attention_efficiency};
  if (gpu_runs_cudnn_attention(gpu) && !own_only)
    return {"cudnn", "cuDNN fused attention (sm_90/sm_100)", a.attention_efficiency};
  return {"own", "own flash-attention kernel (mma.sync)", a.own_attention_efficiency};
}

}  // namespace qlora
