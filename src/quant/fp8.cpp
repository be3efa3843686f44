// FP8 E4M3 / E5M2 with f32 scaling per tensor, per 1x128 row block or per 128x128 tile.
//
// Scale per region follows TransformerEngine's current scaling (recipe_common.cuh
// compute_scale_from_amax, without the power-of-two option): scale = fp8_max / amax in f32;
// amax == 0 -> scale 1; an infinite scale (subnormal amax) -> FLT_MAX. Codes are
// fp8_rn_satfinite(x * scale), so nothing becomes NaN/Inf (E4M3 has no Inf, and a plain cast would
// turn |x| > 464 into NaN). Stored per region is scale_inv = 1 / scale, the dequant multiplier that
// cuBLASLt's A/B scale pointers take and DeepSeek-style checkpoints store as weight_scale_inv.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "quant/formats_impl.h"
#include "quant/minifloat.h"

namespace qlora::detail {

namespace {

constexpr int64_t kTile = 128;

struct Fp8Grid {
  int64_t block_rows, block_cols;  // region shape; whole tensor for per-tensor scaling
  int64_t n_br, n_bc;              // regions along rows / cols
};

Fp8Grid fp8_grid(const QuantizedTensor& q) {
  switch (q.params.fp8_scaling) {
    case Fp8Scaling::PerTensor: return {q.rows, q.cols, 1, 1};
    case Fp8Scaling::Block1x128: return {1, kTile, q.rows, ceil_div(q.cols, kTile)};
    case Fp8Scaling::Block128x128: break;
  }
  return {kTile, kTile, ceil_div(q.rows, kTile), ceil_div(q.cols, kTile)};
}

bool is_e4m3(const QuantizedTensor& q) { return q.params.format == QuantFormat::FP8_E4M3; }

}  // namespace

void quantize_fp8(const float* w, QuantizedTensor& q) {
  const bool e4m3 = is_e4m3(q);
  const float fp8_max = e4m3 ? kE4M3Max : kE5M2Max;
  const Fp8Grid g = fp8_grid(q);
  const int64_t n_regions = g.n_br * g.n_bc;
  std::vector<float> amax(static_cast<size_t>(n_regions), 0.0f);  // (n_br, n_bc)
  if (n_regions == 1) {
    float m = 0.0f;
#pragma omp parallel for reduction(max : m) schedule(static) if (q.rows * q.cols > kOmpMinElems)
    for (int64_t i = 0; i < q.rows * q.cols; i++) m = std::max(m, std::fabs(w[i]));
    amax[0] = m;
  } else {
#pragma omp parallel for schedule(static) if (q.rows * q.cols > kOmpMinElems)
    for (int64_t reg = 0; reg < n_regions; reg++) {
      const int64_t r0 = reg / g.n_bc * g.block_rows, c0 = reg % g.n_bc * g.block_cols;
      float m = 0.0f;
      for (int64_t r = r0; r < std::min(q.rows, r0 + g.block_rows); r++)
        for (int64_t c = c0; c < std::min(q.cols, c0 + g.block_cols); c++) m = std::max(m, std::fabs(w[r * q.cols + c]));
      amax[size_t(reg)] = m;
    }
  }
  std::vector<float> scale(amax.size());  // (n_br, n_bc) quantization multipliers
  q.scales_f32.resize(amax.size());       // (n_br, n_bc) scale_inv
  for (size_t i = 0; i < amax.size(); i++) {
    float s = amax[i] == 0.0f ? 1.0f : fp8_max / amax[i];
    if (std::isinf(s)) s = FLT_MAX;
    scale[i] = s;
    q.scales_f32[i] = 1.0f / s;
  }
  q.data.resize(size_t(q.rows * q.cols));  // (rows, cols)
#pragma omp parallel for schedule(static) if (q.rows * q.cols > kOmpMinElems)
  for (int64_t r = 0; r < q.rows; r++) {
    const int64_t br = r / g.block_rows;
    for (int64_t c = 0; c < q.cols; c++) {
      const float v = w[r * q.cols + c] * scale[size_t(br * g.n_bc + c / g.block_cols)];
      q.data[size_t(r * q.cols + c)] = e4m3 ? f32_to_e4m3(v, true) : f32_to_e5m2(v, true);
    }
  }
}

void dequantize_fp8(const QuantizedTensor& q, int64_t r0, int64_t r1, float* out) {
  const bool e4m3 = is_e4m3(q);
  const Fp8Grid g = fp8_grid(q);
#pragma omp parallel for schedule(static) if ((r1 - r0) * q.cols > kOmpMinElems)
  for (int64_t r = r0; r < r1; r++) {
    const int64_t br = r / g.block_rows;
    for (int64_t c = 0; c < q.cols; c++) {
      const float s_inv = q.scales_f32[size_t(br * g.n_bc + c / g.block_cols)];
      const uint8_t code = q.data[size_t(r * q.cols + c)];
      out[(r - r0) * q.cols + c] = (e4m3 ? e4m3_to_f32(code) : e5m2_to_f32(code)) * s_inv;
    }
  }
}

}  // namespace qlora::detail
