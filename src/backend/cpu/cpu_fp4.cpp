// CPU matmul_fp4: the block-scaled FP4 base GEMM's semantics in f32 (the activation quantized to
// NVFP4 by the repository's reference, the weight's stored e2m1 codes with its GEMM scales), so a
// model planned with FP4 base GEMMs computes the same function on every backend.
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "quant/block_scale_layout.h"
#include "quant/fp4_gemm.h"
#include "quant/minifloat.h"
#include "quant/quantize.h"

namespace qlora {

void CpuBackend::matmul_fp4(const MatmulFp4Args& a) {
  const char* op = "matmul_fp4";
  cpu::check_dim(op, "m", a.m);
  cpu::check_dim(op, "out", a.out);
  cpu::check_dim(op, "in", a.in);
  cpu::check_f32(op, "y", a.y, a.m * a.out);
  cpu::check_f32(op, "x", a.x, a.m * a.in);
  if (!a.w || !a.w_scales)
    fail(ErrorKind::Internal, "cpu op matmul_fp4, weight 'w'", "the codes or the GEMM scales are null",
         "pass the packed NVFP4/MXFP4 weight and its fp4_gemm_scales");
  if (a.in % 16 != 0)
    fail(ErrorKind::Unsupported, "cpu op matmul_fp4, weight (" + std::to_string(a.out) + "," + std::to_string(a.in) + ")",
         "in must be a multiple of 16 (one e4m3 scale per 16 elements)", "plan the base GEMMs in bf16 for this model");
  if (std::max({a.m, a.out, a.in}) > INT32_MAX)
    fail(ErrorKind::Unsupported, "cpu op matmul_fp4", "a dimension exceeds the 32-bit BLAS interface",
         "split the matmul into chunks");
  if (a.m == 0 || a.out == 0) return;
  float* y = a.y.f32();  // (m,out)
  std::memset(y, 0, size_t(a.m * a.out) * sizeof(float));
  if (a.in == 0) return;
  const int64_t kb = a.in / 16;
  // q(x): NVFP4 by the reference quantizer (per-tensor decode scale, e4m3 per 16, e2m1 RNE).
  QuantParams p;
  p.format = QuantFormat::NVFP4;
  const QuantizedTensor qx = quantize_ref(a.x.f32(), a.m, a.in, p);
  std::vector<float> xq(size_t(a.m * a.in));  // (m,in) codes times block scales
  for (int64_t r = 0; r < a.m; r++)
    for (int64_t c = 0; c < a.in; c++) {
      const uint8_t b = qx.data[size_t(r * (a.in / 2) + c / 2)];
      xq[size_t(r * a.in + c)] =
          e2m1_to_f32(c % 2 == 0 ? uint8_t(b & 0x0f) : uint8_t(b >> 4)) * e4m3_to_f32(qx.scales[size_t(r * kb + c / 16)]);
    }
  // The weight: codes (quant_layout puts them first) times its tiled e4m3 scales.
  const auto* codes = static_cast<const uint8_t*>(a.w);  // (out, in/2)
  const auto* sf = static_cast<const uint8_t*>(a.w_scales);
  float w_decode = 0.0f;
  std::memcpy(&w_decode, sf, 4);
  const uint8_t* tiles = sf + kFp4GemmHeaderBytes;
  std::vector<float> wq(size_t(a.out * a.in));  // (out,in)
  for (int64_t r = 0; r < a.out; r++)
    for (int64_t c = 0; c < a.in; c++) {
      const uint8_t b = codes[size_t(r * (a.in / 2) + c / 2)];
      wq[size_t(r * a.in + c)] = e2m1_to_f32(c % 2 == 0 ? uint8_t(b & 0x0f) : uint8_t(b >> 4)) *
                                 e4m3_to_f32(tiles[size_t(block_scale_offset(r, c / 16, kb))]);
    }
  // The decode scales multiply the f32 sum, as cuBLASLt's alpha does: alpha * acc.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(a.m), int(a.out), int(a.in), qx.scales_f32[0] * w_decode,
              xq.data(), int(a.in), wq.data(), int(a.in), 0.0f, y, int(a.out));
}

}  // namespace qlora
