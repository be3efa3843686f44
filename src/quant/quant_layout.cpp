// The packed storage layout of one quantized weight, and packing/unpacking a QuantizedTensor.
#include "quant/quant_layout.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace qlora {

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

QuantLayout quant_layout(const QuantParams& p, int64_t rows, int64_t cols) {
  QuantLayout L;
  const int64_t n = rows * cols, bs = quant_blocksize(p);
  int64_t n_absmax = 0, n_nested = 0, n_code = 0, n_scales_f32 = 0, n_offset = 0;
  int64_t n_data = 0, n_absmax_q = 0, n_scales = 0;
  switch (p.format) {
    case QuantFormat::NF4:
    case QuantFormat::FP4: {
      const int64_t nb = cdiv(n, bs);
      n_data = (n + 1) / 2;
      if (p.double_quant) {
        n_absmax_q = nb;
        n_nested = cdiv(nb, 256);
        n_offset = 1;
        n_code = 256;
      } else {
        n_absmax = nb;
      }
      break;
    }
    case QuantFormat::NVFP4:
      n_data = rows * cdiv(cols, 2);
      n_scales = rows * cdiv(cols, 16);
      n_scales_f32 = 1;
      break;
    case QuantFormat::MXFP4:
    case QuantFormat::MXFP8_E4M3:
      n_data = p.format == QuantFormat::MXFP4 ? rows * cdiv(cols, 2) : n;
      n_scales = rows * cdiv(cols, 32);
      break;
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2:
      n_data = n;
      n_scales_f32 = p.fp8_scaling == Fp8Scaling::PerTensor    ? 1
                     : p.fp8_scaling == Fp8Scaling::Block1x128 ? rows * cdiv(cols, 128)
                                                               : cdiv(rows, 128) * cdiv(cols, 128);
      break;
  }
  int64_t at = 0;
  auto place = [&](QuantLayout::Section& s, int64_t count, int64_t elem) {
    if (count == 0) return;
    s.offset = at;
    s.count = count;
    at += count * elem;
  };
  // FP8 and e2m1 (NVFP4, MXFP4) codes whose byte count is a multiple of 4 go first, at the
  // buffer's 256-byte alignment: the FP8 and block-scaled FP4 GEMMs read them in place, and
  // cuBLASLt takes only 16-byte aligned operands there. The f32 scales after them stay 4-byte
  // aligned. (Any shape those GEMMs take has cols % 16 == 0.)
  const bool gemm_codes = p.format == QuantFormat::FP8_E4M3 || p.format == QuantFormat::FP8_E5M2 ||
                          p.format == QuantFormat::NVFP4 || p.format == QuantFormat::MXFP4;
  const bool data_first = gemm_codes && n_data % 4 == 0;
  if (data_first) place(L.data, n_data, 1);
  place(L.absmax, n_absmax, 4);
  place(L.nested_absmax, n_nested, 4);
  place(L.offset, n_offset, 4);
  place(L.nested_code, n_code, 4);
  place(L.scales_f32, n_scales_f32, 4);
  if (!data_first) place(L.data, n_data, 1);
  place(L.absmax_q, n_absmax_q, 1);
  place(L.scales, n_scales, 1);
  L.total = at;
  if (L.total != quant_storage_bytes(p, rows, cols))
    fail(ErrorKind::Internal, "quant_layout", std::string(quant_format_name(p.format)) + ": layout holds " +
                                                  std::to_string(L.total) + " bytes, quant_storage_bytes says " +
                                                  std::to_string(quant_storage_bytes(p, rows, cols)));
  return L;
}

namespace {

template <class T>
void put(uint8_t* blob, const QuantLayout::Section& s, const std::vector<T>& v, const char* name) {
  if (int64_t(v.size()) != s.count)
    fail(ErrorKind::Format, std::string("quantized tensor buffer '") + name + "'",
         "holds " + std::to_string(v.size()) + " elements, the storage layout expects " + std::to_string(s.count));
  if (s.count) std::memcpy(blob + s.offset, v.data(), v.size() * sizeof(T));
}

template <class T>
void take(const uint8_t* blob, const QuantLayout::Section& s, std::vector<T>& v) {
  v.resize(size_t(s.count));
  if (s.count) std::memcpy(v.data(), blob + s.offset, v.size() * sizeof(T));
}

}  // namespace

void pack_quantized(const QuantizedTensor& q, uint8_t* blob) {
  const QuantLayout L = quant_layout(q.params, q.rows, q.cols);
  put(blob, L.absmax, q.absmax, "absmax");
  put(blob, L.nested_absmax, q.nested_absmax, "nested_absmax");
  put(blob, L.nested_code, q.nested_code, "nested_code");
  put(blob, L.scales_f32, q.scales_f32, "scales_f32");
  put(blob, L.data, q.data, "data");
  put(blob, L.absmax_q, q.absmax_q, "absmax_q");
  put(blob, L.scales, q.scales, "scales");
  if (L.offset.count) std::memcpy(blob + L.offset.offset, &q.offset, 4);
}

void unpack_quantized(const uint8_t* blob, const QuantParams& p, int64_t rows, int64_t cols, QuantizedTensor& q) {
  const QuantLayout L = quant_layout(p, rows, cols);
  q.params = p;
  q.params.blocksize = quant_blocksize(p);
  q.rows = rows;
  q.cols = cols;
  take(blob, L.absmax, q.absmax);
  take(blob, L.nested_absmax, q.nested_absmax);
  take(blob, L.nested_code, q.nested_code);
  take(blob, L.scales_f32, q.scales_f32);
  take(blob, L.data, q.data);
  take(blob, L.absmax_q, q.absmax_q);
  take(blob, L.scales, q.scales);
  q.offset = 0.0f;
  if (L.offset.count) std::memcpy(&q.offset, blob + L.offset.offset, 4);
}


}  // namespace qlora
