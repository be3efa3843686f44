// quantize_ref / dequantize_ref: argument checks, then dispatch to the per-format reference.
#include "quant/quantize.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/formats_impl.h"

namespace qlora {

using detail::ceil_div;

namespace {

std::string shape_str(int64_t rows, int64_t cols) {
  return "(" + std::to_string(rows) + ", " + std::to_string(cols) + ")";
}

void check_finite(const float* w, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows * cols; i++) {
    if (!std::isfinite(w[i]))
      fail(ErrorKind::Data,
           "weight element (row " + std::to_string(i / cols) + ", col " + std::to_string(i % cols) + ")",
           std::string("non-finite value ") + (std::isnan(w[i]) ? "nan" : "inf") + " cannot be quantized",
           "the source weights are corrupt; check the checkpoint or the step that produced them");
  }
}

void expect_size(const char* buffer, size_t have, int64_t want, const QuantizedTensor& q) {
  if (int64_t(have) != want)
    fail(ErrorKind::Format, std::string("quantized tensor buffer '") + buffer + "'",
         "holds " + std::to_string(have) + " elements, expected " + std::to_string(want) + " for " +
             quant_format_name(q.params.format) + " of shape " + shape_str(q.rows, q.cols),
         "the tensor was assembled from inconsistent parts (shape, blocksize or format)");
}

void check_rows(const QuantizedTensor& q, int64_t r0, int64_t r1) {
  validate_quantized(q);
  if (r0 < 0 || r1 < r0 || r1 > q.rows)
    fail(ErrorKind::Shape, "dequantize rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ")",
         "row range outside the quantized tensor of shape " + shape_str(q.rows, q.cols),
         "use 0 <= r0 <= r1 <= rows");
}

}  // namespace

void validate_quantized(const QuantizedTensor& q) {
  if (q.rows <= 0 || q.cols <= 0)
    fail(ErrorKind::Format, "quantized tensor", "shape " + shape_str(q.rows, q.cols) + " is empty");
  if (q.params.blocksize == 0)
    fail(ErrorKind::Format, "quantized tensor", "blocksize is unresolved (0)", "set params.blocksize");
  validate_quant_params(q.params);
  const int64_t rows = q.rows, cols = q.cols, n = rows * cols;
  const bool dq = q.params.double_quant;
  switch (q.params.format) {
    case QuantFormat::NF4:
    case QuantFormat::FP4: {
      const int64_t nb = ceil_div(n, q.params.blocksize);
      expect_size("data", q.data.size(), (n + 1) / 2, q);
      expect_size("absmax", q.absmax.size(), dq ? 0 : nb, q);
      expect_size("absmax_q", q.absmax_q.size(), dq ? nb : 0, q);
      expect_size("nested_absmax", q.nested_absmax.size(), dq ? ceil_div(nb, 256) : 0, q);
      expect_size("nested_code", q.nested_code.size(), dq ? 256 : 0, q);
      return;
    }
    case QuantFormat::NVFP4:
      expect_size("data", q.data.size(), rows * ceil_div(cols, 2), q);
      expect_size("scales", q.scales.size(), rows * ceil_div(cols, 16), q);
      expect_size("scales_f32", q.scales_f32.size(), 1, q);
      return;
    case QuantFormat::MXFP4:
    case QuantFormat::MXFP8_E4M3: {
      const bool fp4 = q.params.format == QuantFormat::MXFP4;
      expect_size("data", q.data.size(), fp4 ? rows * ceil_div(cols, 2) : n, q);
      expect_size("scales", q.scales.size(), rows * ceil_div(cols, 32), q);
      return;
    }
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: {
      const int64_t ns = q.params.fp8_scaling == Fp8Scaling::PerTensor    ? 1
                         : q.params.fp8_scaling == Fp8Scaling::Block1x128 ? rows * ceil_div(cols, 128)
                                                                           : ceil_div(rows, 128) * ceil_div(cols, 128);
      expect_size("data", q.data.size(), n, q);
      expect_size("scales_f32", q.scales_f32.size(), ns, q);
      return;
    }
  }
}

int64_t QuantizedTensor::nbytes() const {
  int64_t n = int64_t(data.size()) + int64_t(absmax.size()) * 4 + int64_t(absmax_q.size()) +
              int64_t(nested_absmax.size()) * 4 + int64_t(nested_code.size()) * 4 +
              int64_t(scales.size()) + int64_t(scales_f32.size()) * 4;
  if (params.double_quant) n += 4;  // offset
  return n;
}

QuantizedTensor quantize_ref(const float* w, int64_t rows, int64_t cols, const QuantParams& p) {
  if (rows <= 0 || cols <= 0)
    fail(ErrorKind::Shape, "quantize_ref", "weight shape " + shape_str(rows, cols) + " is empty",
         "quantize a 2-D weight with at least one row and one column");
  QuantizedTensor q;
  q.params = p;
  q.params.blocksize = quant_blocksize(p);  // validates p
  q.rows = rows;
  q.cols = cols;
  check_finite(w, rows, cols);
  switch (p.format) {
    case QuantFormat::NF4:
    case QuantFormat::FP4: detail::quantize_bnb4(w, q); break;
    case QuantFormat::NVFP4: detail::quantize_nvfp4(w, q); break;
    case QuantFormat::MXFP4:
    case QuantFormat::MXFP8_E4M3: detail::quantize_mx(w, q); break;
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: detail::quantize_fp8(w, q); break;
  }
  return q;
}

void dequantize_rows_ref(const QuantizedTensor& q, int64_t r0, int64_t r1, float* out) {
  check_rows(q, r0, r1);
  if (r0 == r1) return;
  switch (q.params.format) {
    case QuantFormat::NF4:
    case QuantFormat::FP4: detail::dequantize_bnb4(q, r0, r1, out); break;
    case QuantFormat::NVFP4: detail::dequantize_nvfp4(q, r0, r1, out); break;
    case QuantFormat::MXFP4:
    case QuantFormat::MXFP8_E4M3: detail::dequantize_mx(q, r0, r1, out); break;
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: detail::dequantize_fp8(q, r0, r1, out); break;
  }
}

void dequantize_ref(const QuantizedTensor& q, float* out) { dequantize_rows_ref(q, 0, q.rows, out); }

void dequantize_rows_ref_bf16(const QuantizedTensor& q, int64_t r0, int64_t r1, uint16_t* out) {
  check_rows(q, r0, r1);
  std::vector<float> row(size_t(q.cols));  // (cols)
  for (int64_t r = r0; r < r1; r++) {
    dequantize_rows_ref(q, r, r + 1, row.data());
    for (int64_t c = 0; c < q.cols; c++) out[(r - r0) * q.cols + c] = f32_to_bf16(row[size_t(c)]);
  }
}

void dequantize_ref_bf16(const QuantizedTensor& q, uint16_t* out) { dequantize_rows_ref_bf16(q, 0, q.rows, out); }

}  // namespace qlora
