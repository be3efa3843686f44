// Resolving gemm_dtype against the base, the model's shapes and the device (model/gemm_dtype.h).
#include "model/gemm_dtype.h"

#include "core/error.h"
#include "quant/fp4_gemm.h"

namespace qlora {

GemmDtype resolve_gemm_dtype(const ModelPlanOptions& o, const LlamaConfig& c, const GemmCaps& caps) {
  const GemmDtype g = o.gemm_dtype;
  if (g == GemmDtype::Bf16) return g;
  const BasePrecision bp = o.base_precision.value_or(BasePrecision::Bf16);
  const std::string base = base_precision_name(bp);
  if (g == GemmDtype::Fp8) {
    if (bp != BasePrecision::Fp8)
      fail(ErrorKind::Config, "gemm_dtype fp8",
           "reads an fp8 base as stored, but base_precision is '" + base + "'",
           "set base_precision: fp8, or gemm_dtype: bf16 (a quantized base is dequantized to bf16)");
    if (!caps.fp8)
      fail(ErrorKind::Config, "gemm_dtype fp8", caps.device + " has no FP8 tensor cores (compute capability 8.9 or later)",
           "use gemm_dtype: bf16");
    for (const auto& t : all_linear_targets()) {
      const auto [out, in] = projection_shape(c, t);
      if (in % 16 != 0 || out % 8 != 0)
        fail(ErrorKind::Config, "gemm_dtype fp8, projection " + t + " (" + std::to_string(out) + "," + std::to_string(in) + ")",
             "cuBLASLt's FP8 kernels need in % 16 == 0 and out % 8 == 0", "use gemm_dtype: bf16 for this model");
    }
    return g;
  }
  {  // GemmDtype::Fp4
    if (bp != BasePrecision::Nvfp4 && bp != BasePrecision::Mxfp4)
      fail(ErrorKind::Config, "gemm_dtype fp4",
           "reads an NVFP4 or MXFP4 base as stored, but base_precision is '" + base + "'",
           "set base_precision: nvfp4 (or mxfp4), or gemm_dtype: bf16");
    if (!caps.fp4)
      fail(ErrorKind::Config, "gemm_dtype fp4",
           caps.device + " cannot run the block-scaled FP4 GEMM (cuBLASLt's NVFP4 kernels, as the engine calls them, "
                         "need compute capability 10.x)",
           "use gemm_dtype: bf16 (the FP4 base is dequantized to bf16), or fp8 with an fp8 base");
    if (o.base_shards > 0)
      fail(ErrorKind::Config, "gemm_dtype fp4", "is not implemented with sharding: fsdp (the GEMM scales are made "
           "from whole projections at load)", "use gemm_dtype: bf16 with sharding: fsdp");
    for (const auto& t : all_linear_targets()) {
      const auto [out, in] = projection_shape(c, t);
      if (!fp4_gemm_shape_ok(out, in))
        fail(ErrorKind::Config, "gemm_dtype fp4, projection " + t + " (" + std::to_string(out) + "," + std::to_string(in) + ")",
             "cuBLASLt's FP4 kernels need in % 32 == 0 and out % 8 == 0", "use gemm_dtype: bf16 for this model");
    }
    return g;
  }
}

}  // namespace qlora
