// CPU matmul_fp8: the FP8 base GEMM's semantics in f32 (activation quantized to e4m3 per tensor,
// the weight's stored e4m3 codes and scale), so a model planned with FP8 base GEMMs computes the
// same function on every backend.
#include <cblas.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "quant/minifloat.h"
#include "quant/quant_layout.h"

namespace qlora {

void CpuBackend::matmul_fp8(const MatmulFp8Args& a) {
  const char* op = "matmul_fp8";
  cpu::check_dim(op, "m", a.m);
  cpu::check_dim(op, "out", a.out);
  cpu::check_dim(op, "in", a.in);
  cpu::check_f32(op, "y", a.y, a.m * a.out);
  cpu::check_f32(op, "x", a.x, a.m * a.in);
  if (a.amax.data) cpu::check_f32(op, "amax", a.amax, 1);
  if (!a.w) fail(ErrorKind::Internal, "cpu op matmul_fp8, weight 'w'", "is null", "pass the packed FP8 weight");
  if (std::max({a.m, a.out, a.in}) > INT32_MAX)
    fail(ErrorKind::Unsupported, "cpu op matmul_fp8", "a dimension exceeds the 32-bit BLAS interface",
         "split the matmul into chunks");
  const float* x = a.x.f32();  // (m,in)
  float amax = 0.0f;
  for (int64_t i = 0; i < a.m * a.in; i++) amax = std::max(amax, std::fabs(x[i]));
  if (a.amax.data) *a.amax.f32() = amax;
  if (a.m == 0 || a.out == 0) return;
  float* y = a.y.f32();  // (m,out)
  std::memset(y, 0, size_t(a.m * a.out) * sizeof(float));
  if (a.in == 0) return;
  // Current scaling, as quant/fp8.cpp scales a weight (and the CUDA kernel the activation).
  float s = amax == 0.0f ? 1.0f : kE4M3Max / amax;
  if (std::isinf(s)) s = FLT_MAX;
  const float x_scale_inv = 1.0f / s;
  std::vector<float> xq(size_t(a.m * a.in));  // (m,in) decoded e4m3 codes of x * s
  for (size_t i = 0; i < xq.size(); i++) xq[i] = e4m3_to_f32(f32_to_e4m3(x[i] * s, true));
  QuantParams p;
  p.format = QuantFormat::FP8_E4M3;
  p.fp8_scaling = Fp8Scaling::PerTensor;
  const QuantLayout L = quant_layout(p, a.out, a.in);
  const auto* blob = static_cast<const uint8_t*>(a.w);
  float w_scale_inv = 0.0f;
  std::memcpy(&w_scale_inv, blob + L.scales_f32.offset, 4);
  const uint8_t* codes = blob + L.data.offset;  // (out,in)
  std::vector<float> wq(size_t(a.out * a.in));   // (out,in) decoded codes
  for (size_t i = 0; i < wq.size(); i++) wq[i] = e4m3_to_f32(codes[i]);
  // The scales multiply the f32 sum of code products, in cuBLASLt's order: alpha * (sa * sb) * acc.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(a.m), int(a.out), int(a.in), w_scale_inv * x_scale_inv,
              xq.data(), int(a.in), wq.data(), int(a.in), 0.0f, y, int(a.out));
}

}  // namespace qlora
