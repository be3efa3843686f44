// NVIDIA NVFP4: E2M1 codes, E4M3 scale per 16 elements along a row, f32 per-tensor decode scale.
//
// Scale computation follows TransformerEngine's NVFP4 recipe, 1x16 blocks, no Hadamard transform
// (transformer_engine/pytorch/custom_recipes/reference_nvfp4.py _quantize_blockwise_reference and
// common/cast/nvfp4/core_nvfp4.cuh; summarized in reference/quant_formats.md section 6.2):
//   S_enc = (448 * 6) / global_amax, min(S_enc, FLT_MAX); S_enc = 1 when global_amax == 0
//   S_dec = 1 / S_enc                                   (stored: scales_f32[0])
//   s_b   = e4m3_satfinite(block_amax * (S_enc * (1/6)))  (stored: scales, RNE)
//   enc_b = min(1 / (float(s_b) * S_dec), FLT_MAX)
//   q_i   = e2m1_rn_satfinite(x_i * enc_b)              (stored: data, even element in the low nibble)
//   x^_i  = e2m1(q_i) * float(s_b) * S_dec
// The operation order is TE's; it matters for bit parity with the CUDA kernels.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "quant/formats_impl.h"
#include "quant/minifloat.h"

namespace qlora::detail {

namespace {
constexpr int64_t kBlock = 16;
}

void quantize_nvfp4(const float* w, QuantizedTensor& q) {
  const int64_t rows = q.rows, cols = q.cols;
  const int64_t row_bytes = ceil_div(cols, 2), n_cb = ceil_div(cols, kBlock);
  float global_amax = 0.0f;
#pragma omp parallel for reduction(max : global_amax) schedule(static) if (rows * cols > kOmpMinElems)
  for (int64_t i = 0; i < rows * cols; i++) global_amax = std::max(global_amax, std::fabs(w[i]));
  float s_enc = global_amax == 0.0f ? 1.0f : std::min(448.0f * 6.0f / global_amax, FLT_MAX);
  const float s_dec = 1.0f / s_enc;
  const float block_mul = s_enc * (1.0f / 6.0f);
  q.scales_f32 = {s_dec};
  q.scales.assign(size_t(rows * n_cb), 0);  // (rows, ceil(cols/16))
  q.data.assign(size_t(rows * row_bytes), 0);  // (rows, ceil(cols/2))
#pragma omp parallel for schedule(static) if (rows * cols > kOmpMinElems)
  for (int64_t r = 0; r < rows; r++) {
    const float* wr = w + r * cols;
    for (int64_t cb = 0; cb < n_cb; cb++) {
      const int64_t c0 = cb * kBlock, c1 = std::min(cols, c0 + kBlock);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; c++) amax = std::max(amax, std::fabs(wr[c]));
      const uint8_t sb = f32_to_e4m3(std::min(amax * block_mul, FLT_MAX), /*saturate=*/true);
      q.scales[size_t(r * n_cb + cb)] = sb;
      const float enc = std::min(1.0f / (e4m3_to_f32(sb) * s_dec), FLT_MAX);
      for (int64_t c = c0; c < c1; c++) {
        const uint8_t code = f32_to_e2m1(wr[c] * enc);
        q.data[size_t(r * row_bytes + c / 2)] |= (c % 2 == 0) ? code : uint8_t(code << 4);
      }
    }
  }
}

void dequantize_nvfp4(const QuantizedTensor& q, int64_t r0, int64_t r1, float* out) {
  const int64_t cols = q.cols, row_bytes = ceil_div(cols, 2), n_cb = ceil_div(cols, kBlock);
  const float s_dec = q.scales_f32[0];
#pragma omp parallel for schedule(static) if ((r1 - r0) * cols > kOmpMinElems)
  for (int64_t r = r0; r < r1; r++) {
    for (int64_t c = 0; c < cols; c++) {
      const float sb = e4m3_to_f32(q.scales[size_t(r * n_cb + c / kBlock)]);
      const uint8_t byte = q.data[size_t(r * row_bytes + c / 2)];
      const uint8_t code = (c % 2 == 0) ? uint8_t(byte & 0x0f) : uint8_t(byte >> 4);
      out[(r - r0) * cols + c] = e2m1_to_f32(code) * sb * s_dec;
    }
  }
}

}  // namespace qlora::detail
