// The assumption set in force and its printable description.
#include "plan/assumptions.h"

#include "plan/units.h"

namespace qlora {

const PlanAssumptions& plan_assumptions() {
  static const PlanAssumptions a;
  return a;
}

std::vector<std::string> describe_assumptions(const PlanAssumptions& a) {
  const std::string tag = a.measured ? "measured" : "placeholder, not yet measured on qlora";
  auto pct = [](double x) { return fmt_fixed(100 * x, 0) + "%"; };
  return {
      "bf16 GEMM efficiency " + pct(a.gemm_efficiency) + " of peak (" + tag + "; GEMM microbenchmark ~790/989 TFLOP/s on H100)",
      "fp8/fp4 GEMM efficiency " + pct(a.lowp_gemm_efficiency) + " of peak (" + tag + "; guess)",
      "attention efficiency " + pct(a.attention_efficiency) + " of bf16 peak with cuDNN fused attention on sm_90/sm_100, " +
          pct(a.own_attention_efficiency) + " with the own kernel elsewhere (" + tag +
          "; FlashAttention-3 paper's cuDNN figures on H100, FlashAttention-2 paper on A100)",
      "memory-bound kernels at " + pct(a.memory_bw_efficiency) + " of bandwidth (" + tag + "; ~2.5 of 3.35 TB/s dequant on H100)",
      "collectives at " + pct(a.comm_efficiency) + " of link/NIC bandwidth, " + pct(a.comm_overlap) +
          " of compute time hides them (" + tag + ")",
      "activation offload: a layer input's copy hidden under " + pct(a.offload_overlap) + " of one layer's compute (" + tag + "; Unsloth reports ~1-2% overhead)",
      "next-layer dequantization (side stream) hidden under " + pct(a.dequant_overlap) + " of the base GEMMs' time (" + tag + ")",
      "overhead: context " + fmt_gib(double(a.cuda_context_bytes)) + ", NCCL " + fmt_gib(double(a.nccl_bytes)) + " (multi-GPU), fragmentation " + pct(a.fragmentation_fraction) +
          ", driver reserve " + fmt_fixed(100 * a.driver_reserve_fraction, 1) + "% (" + tag + ")",
  };
}

}  // namespace qlora
