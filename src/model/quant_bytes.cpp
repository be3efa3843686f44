// Base precision names and quantized storage sizes (bnb 4-bit layout incl. double quantization).
#include "model/quant_bytes.h"

#include "core/error.h"

namespace qlora {

bool is_float_precision(const std::string& p) {
  return p == "fp32" || p == "f32" || p == "bf16" || p == "fp16" || p == "f16";
}

DType float_precision_dtype(const std::string& p, DType fallback) {
  if (p == "fp32" || p == "f32") return DType::F32;
  if (p == "bf16") return DType::BF16;
  if (p == "fp16" || p == "f16") return DType::F16;
  return fallback;
}

const char* base_precision_choices() { return "fp32, bf16, fp8, nf4, fp4, nvfp4, mxfp4"; }

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t quantized_weight_bytes(const std::string& p, int64_t out, int64_t in, int64_t bs, bool dq) {
  const int64_t n = out * in;
  if (p == "nf4" || p == "fp4") {
    const int64_t blocks = cdiv(n, bs);
    int64_t bytes = cdiv(n, 2) + 16 * 4;  // packed codes + 16-entry code table
    if (dq)  // u8 absmax, fp32 nested absmax per 256 blocks, 256-entry dynamic map, fp32 offset
      bytes += blocks + cdiv(blocks, 256) * 4 + 256 * 4 + 4;
    else
      bytes += blocks * 4;
    return bytes;
  }
  if (p == "nvfp4") return cdiv(n, 2) + cdiv(n, 16) + 4;  // e2m1 codes, e4m3 per 16, fp32 tensor scale
  if (p == "mxfp4") return cdiv(n, 2) + cdiv(n, 32);      // e2m1 codes, e8m0 per 32
  if (p == "fp8") return n + 4;                            // e4m3 + fp32 per-tensor scale
  fail(ErrorKind::Config, "base_precision", "unknown base precision '" + p + "'",
       std::string("choose one of ") + base_precision_choices());
}

}  // namespace qlora
