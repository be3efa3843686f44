// The tensor-core dtype of the frozen base's forward GEMMs (config gemm_dtype, qlora plan
// --gemm-dtype), resolved once before planning by the engine and the planner alike.
#pragma once
#include <string>

#include "model/llama_config.h"
#include "model/model_plan.h"

namespace qlora {

// What the device can run: FP8 GEMMs (CUDA: compute capability 8.9 or later) and block-scaled FP4
// GEMMs (10.x). `device` names it in errors ("this GPU (compute capability 8.0)", "A100 80GB").
struct GemmCaps {
  bool fp8 = true, fp4 = true;
  std::string device = "the CPU backend";
};

// Bf16: every base is dequantized to bf16 a layer ahead (the default).
// Fp8:  an fp8 base (e4m3, per-tensor scale) read as stored by matmul_fp8 in the forward.
// Fp4:  an NVFP4 or MXFP4 base read as stored by matmul_fp4 (cuBLASLt's NVFP4 GEMM) in the
//       forward, with GEMM scales made at load (quant/fp4_gemm.h).
// The backward's dy W stays bf16 on the dequantized layer for both. Anything the base, the
// model's shapes or the device cannot run is an Error(Config) naming gemm_dtype, never a silent
// fallback, so the plan and the run assume the same GEMMs.
GemmDtype resolve_gemm_dtype(const ModelPlanOptions& o, const LlamaConfig& c, const GemmCaps& caps);

}  // namespace qlora
