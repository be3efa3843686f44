// OCP MX formats: MXFP4 (E2M1) and MXFP8 (E4M3) with one E8M0 scale per 32 elements along a row.
//
// Shared scale X = 2^e, stored as the E8M0 byte e + 127. Two rules (QuantParams.mx_scale_rule):
//   Floor (default): e = floor(log2(block_amax)) - emax_elem, clamped to [-127, 127]; emax_elem is 2
//     for E2M1 and 8 for E4M3. This is the OCP MX v1.0 rule (MX paper Algorithm 1, Microsoft's
//     microxcaling reference code, torchao's default); an all-zero block gets e = -127 (byte 0).
//     The block max lands in [2^emax, 2^(emax+1)) and values above the element max saturate
//     (MXFP4: amax 7 -> 6).
//   Ceil: e = ceil(log2(block_amax * (1/max_elem))) with TransformerEngine's f32 arithmetic
//     (float_to_e8m0 rounding up), so nothing saturates but one binade of resolution may be lost.
// Default is Floor because it is the spec: files we write decode identically in every MX reader,
// and for weights clipping one element per block usually costs less than halving the resolution
// of all 32. Ceil is there for parity with TE-produced MXFP8 tensors and cuBLAS-side quantizers.
// Elements: x * 2^-e (exact), then round to nearest even with saturation to +-max, like NVIDIA's
// cvt.rn.satfinite and ml_dtypes (microxcaling rounds half away from zero by default instead).
// Packing: MXFP4 puts the even element in the low nibble (gpt-oss checkpoints, transformers).
#include <algorithm>
#include <cmath>

#include "quant/formats_impl.h"
#include "quant/minifloat.h"

namespace qlora::detail {

namespace {

constexpr int64_t kBlock = 32;

bool is_fp4(const QuantizedTensor& q) { return q.params.format == QuantFormat::MXFP4; }

int shared_exponent(float amax, bool fp4, MxScaleRule rule) {
  if (rule == MxScaleRule::Floor) {
    if (amax == 0.0f) return -127;
    int k;
    std::frexp(amax, &k);  // amax in [2^(k-1), 2^k)
    const int e = (k - 1) - (fp4 ? 2 : 8);
    return std::clamp(e, -127, 127);
  }
  const float max_rcp = fp4 ? 1.0f / kE2M1Max : 1.0f / kE4M3Max;
  const float t = amax * max_rcp;
  if (t == 0.0f) return -127;
  return int(f32_to_e8m0(t, E8M0Round::Up)) - 127;
}

}  // namespace

void quantize_mx(const float* w, QuantizedTensor& q) {
  const bool fp4 = is_fp4(q);
  const int64_t rows = q.rows, cols = q.cols, n_cb = ceil_div(cols, kBlock);
  const int64_t row_bytes = fp4 ? ceil_div(cols, 2) : cols;
  q.scales.assign(size_t(rows * n_cb), 0);     // (rows, ceil(cols/32)) E8M0
  q.data.assign(size_t(rows * row_bytes), 0);  // (rows, row_bytes)
#pragma omp parallel for schedule(static) if (rows * cols > kOmpMinElems)
  for (int64_t r = 0; r < rows; r++) {
    const float* wr = w + r * cols;
    for (int64_t cb = 0; cb < n_cb; cb++) {
      const int64_t c0 = cb * kBlock, c1 = std::min(cols, c0 + kBlock);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; c++) amax = std::max(amax, std::fabs(wr[c]));
      const int e = shared_exponent(amax, fp4, q.params.mx_scale_rule);
      q.scales[size_t(r * n_cb + cb)] = uint8_t(e + 127);
      for (int64_t c = c0; c < c1; c++) {
        const float v = std::ldexp(wr[c], -e);
        if (fp4) {
          const uint8_t code = f32_to_e2m1(v);
          q.data[size_t(r * row_bytes + c / 2)] |= (c % 2 == 0) ? code : uint8_t(code << 4);
        } else {
          q.data[size_t(r * row_bytes + c)] = f32_to_e4m3(v, /*saturate=*/true);
        }
      }
    }
  }
}

void dequantize_mx(const QuantizedTensor& q, int64_t r0, int64_t r1, float* out) {
  const bool fp4 = is_fp4(q);
  const int64_t cols = q.cols, n_cb = ceil_div(cols, kBlock);
  const int64_t row_bytes = fp4 ? ceil_div(cols, 2) : cols;
#pragma omp parallel for schedule(static) if ((r1 - r0) * cols > kOmpMinElems)
  for (int64_t r = r0; r < r1; r++) {
    for (int64_t c = 0; c < cols; c++) {
      const uint8_t s = q.scales[size_t(r * n_cb + c / kBlock)];
      float v;
      if (fp4) {
        const uint8_t byte = q.data[size_t(r * row_bytes + c / 2)];
        v = e2m1_to_f32((c % 2 == 0) ? uint8_t(byte & 0x0f) : uint8_t(byte >> 4));
      } else {
        v = e4m3_to_f32(q.data[size_t(r * row_bytes + c)]);
      }
      out[(r - r0) * cols + c] = s == 0xff ? NAN : std::ldexp(v, int(s) - 127);
    }
  }
}

}  // namespace qlora::detail
