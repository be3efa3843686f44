// QuantizedTensor (owning host buffers) and the scalar CPU reference quantize_ref / dequantize_ref.
#pragma once
#include <cstdint>
#include <vector>

#include "quant/format.h"

namespace qlora {

// A quantized [rows, cols] weight. Which buffers are filled depends on the format:
//   NF4/FP4:   data ((rows*cols+1)/2) bnb nibbles over the flattened tensor, high nibble first;
//              absmax (n_blocks) f32, or with double quant absmax_q (n_blocks) u8 +
//              nested_absmax (ceil(n_blocks/256)) f32 + offset + nested_code (256) f32.
//   NVFP4:     data (rows, ceil(cols/2)) low nibble first; scales (rows, ceil(cols/16)) E4M3;
//              scales_f32 (1) = per-tensor decode scale.
//   MXFP4:     data (rows, ceil(cols/2)) low nibble first; scales (rows, ceil(cols/32)) E8M0.
//   MXFP8:     data (rows, cols) E4M3; scales (rows, ceil(cols/32)) E8M0.
//   FP8:       data (rows, cols); scales_f32 = dequant multipliers (scale_inv): (1), (rows, ceil(cols/128))
//              or (ceil(rows/128), ceil(cols/128)).
// Scales are row-major and unswizzled; the cuBLASLt tile layout is the CUDA backend's business.
struct QuantizedTensor {
  QuantParams params;  // blocksize resolved (never 0)
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data;
  std::vector<float> absmax;
  std::vector<uint8_t> absmax_q;
  std::vector<float> nested_absmax;
  std::vector<float> nested_code;
  float offset = 0.0f;  // held only with double quant
  std::vector<uint8_t> scales;
  std::vector<float> scales_f32;

  int64_t numel() const { return rows * cols; }
  // Every byte this tensor holds (the offset counts when double quant is on).
  int64_t nbytes() const;
};

// Quantizes w (rows, cols), row-major f32. Errors: Config (bad params), Shape (empty shape),
// Data (a NaN/Inf element, named by row and column).
QuantizedTensor quantize_ref(const float* w, int64_t rows, int64_t cols, const QuantParams& p);

// Checks that every buffer has the size the format and shape call for (a tensor assembled by a
// checkpoint loader, say); throws Error(Format) naming the buffer. dequantize_* call it.
void validate_quantized(const QuantizedTensor& q);

// out (rows, cols) f32.
void dequantize_ref(const QuantizedTensor& q, float* out);
// out (r1-r0, cols) f32: rows [r0, r1) only, so a consumer can dequantize in slices.
void dequantize_rows_ref(const QuantizedTensor& q, int64_t r0, int64_t r1, float* out);
// bf16 output: the f32 result rounded to nearest even (what bnb's bf16 dequant produces).
void dequantize_ref_bf16(const QuantizedTensor& q, uint16_t* out);
void dequantize_rows_ref_bf16(const QuantizedTensor& q, int64_t r0, int64_t r1, uint16_t* out);

}  // namespace qlora
