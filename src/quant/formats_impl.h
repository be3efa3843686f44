// Internal per-format entry points behind quantize_ref / dequantize_rows_ref (not a public API).
#pragma once
#include <cstdint>

#include "quant/quantize.h"

namespace qlora::detail {

// OpenMP only pays off on big tensors; small calls (one row of a slice) stay on the calling thread.
inline constexpr int64_t kOmpMinElems = int64_t(1) << 16;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Each quantize_* fills the buffers of q; q.params (blocksize resolved), q.rows and q.cols are set
// and w is known to be finite. Each dequantize_* writes rows [r0, r1) to out (r1-r0, cols).
void quantize_bnb4(const float* w, QuantizedTensor& q);
void dequantize_bnb4(const QuantizedTensor& q, int64_t r0, int64_t r1, float* out);
void quantize_nvfp4(const float* w, QuantizedTensor& q);
void dequantize_nvfp4(const QuantizedTensor& q, int64_t r0, int64_t r1, float* out);
void quantize_mx(const float* w, QuantizedTensor& q);
void dequantize_mx(const QuantizedTensor& q, int64_t r0, int64_t r1, float* out);
void quantize_fp8(const float* w, QuantizedTensor& q);
void dequantize_fp8(const QuantizedTensor& q, int64_t r0, int64_t r1, float* out);

}  // namespace qlora::detail
