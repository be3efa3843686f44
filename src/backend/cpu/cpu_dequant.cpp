// CPU dequantization op: bitsandbytes NF4/FP4 blocks decoded 32 codes per vector step; the other
// formats through the scalar reference (quant/quantize.h). Results equal dequantize_ref exactly.
#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_simd.h"
#include "core/error.h"
#include "quant/bnb4.h"
#include "quant/quant_layout.h"

namespace qlora {

namespace {

void dequantize_bnb4(const uint8_t* blob, const QuantLayout& L, const QuantParams& p, int64_t n, float* out) {
  const float* code = p.format == QuantFormat::NF4 ? nf4_code() : fp4_code();
  auto f32_at = [&](const QuantLayout::Section& s) {
    return s.offset < 0 ? nullptr : reinterpret_cast<const float*>(blob + s.offset);
  };
  const float* absmax = f32_at(L.absmax);
  const float* nested_absmax = f32_at(L.nested_absmax);
  const float* nested_code = f32_at(L.nested_code);
  const float offset = L.offset.offset < 0 ? 0.0f : *f32_at(L.offset);
  const uint8_t* absmax_q = L.absmax_q.offset < 0 ? nullptr : blob + L.absmax_q.offset;
  const uint8_t* data = blob + L.data.offset;
  const int64_t bs = p.blocksize, nb = (n + bs - 1) / bs;
  // Blocks start at even elements (bnb block sizes are even), so each covers whole bytes but the last.
#pragma omp parallel for schedule(static) if (n > cpu::kParallelMin)
  for (int64_t b = 0; b < nb; b++) {
    const float am = bnb_block_absmax(absmax, absmax_q, nested_absmax, nested_code, offset, b);
    const int64_t e0 = b * bs, e1 = std::min(n, e0 + bs);
    cpu::decode_4bit(out + e0, data + e0 / 2, (e1 - e0) / 2, code, am);
    if ((e1 - e0) % 2) out[e1 - 1] = code[data[(e1 - 1) / 2] >> 4] * am;  // odd tail: high nibble only
  }
}

}  // namespace

void CpuBackend::dequantize(const DequantizeArgs& a) {
  const char* op = "dequantize";
  cpu::check_dim(op, "rows", a.rows);
  cpu::check_dim(op, "cols", a.cols);
  const int64_t n = a.rows * a.cols;
  cpu::check_f32(op, "out", a.out, n);
  if (n == 0) return;
  cpu::check_ptr(op, "src", a.src);
  QuantParams p = a.params;
  p.blocksize = quant_blocksize(p);  // validates the parameters
  const QuantLayout L = quant_layout(p, a.rows, a.cols);
  const auto* blob = static_cast<const uint8_t*>(a.src);
  if (p.format == QuantFormat::NF4 || p.format == QuantFormat::FP4) {
    dequantize_bnb4(blob, L, p, n, a.out.f32());
    return;
  }
  static thread_local QuantizedTensor q;  // reused: one projection's sections at a time
  unpack_quantized(blob, p, a.rows, a.cols, q);
  dequantize_ref(q, a.out.f32());
}

}  // namespace qlora
