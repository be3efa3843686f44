// Base precision names and their quantized storage (the sizes themselves come from the quant library).
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

QuantParams base_quant_params(const std::string& p, int64_t blocksize, bool double_quant) {
  QuantParams q;
  const auto f = p == "fp8" ? std::optional<QuantFormat>(QuantFormat::FP8_E4M3) : quant_format_from_name(p);
  if (!f)
    fail(ErrorKind::Config, "base_precision", "unknown base precision '" + p + "'",
         std::string("choose one of ") + base_precision_choices());
  q.format = *f;
  if (q.format == QuantFormat::NF4 || q.format == QuantFormat::FP4) {
    if (blocksize < 0 || blocksize > (int64_t(1) << 30))
      fail(ErrorKind::Config, "quant_blocksize", "blocksize " + std::to_string(blocksize) + " is out of range",
           "allowed: 32, 64, 128, 256, 512, 1024, 2048, 4096");
    q.blocksize = int(blocksize);
    q.double_quant = double_quant;
  }
  validate_quant_params(q);
  return q;
}

int64_t quantized_weight_bytes(const std::string& p, int64_t out, int64_t in, int64_t bs, bool dq) {
  return quant_storage_bytes(base_quant_params(p, bs, dq), out, in);
}

}  // namespace qlora
