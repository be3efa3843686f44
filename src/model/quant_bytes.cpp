// Base precisions and their quantized storage (the sizes themselves come from the quant library).
#include "model/quant_bytes.h"

#include <string>

#include "core/error.h"

namespace qlora {

QuantParams base_quant_params(BasePrecision p, int64_t blocksize, bool double_quant) {
  QuantParams q;
  switch (p) {
    case BasePrecision::Fp8: q.format = QuantFormat::FP8_E4M3; break;
    case BasePrecision::Nf4: q.format = QuantFormat::NF4; break;
    case BasePrecision::Fp4: q.format = QuantFormat::FP4; break;
    case BasePrecision::Nvfp4: q.format = QuantFormat::NVFP4; break;
    case BasePrecision::Mxfp4: q.format = QuantFormat::MXFP4; break;
    default:
      fail(ErrorKind::Internal, "base_quant_params", std::string("base precision ") + base_precision_name(p) + " is not quantized");
  }
  if (is_bnb_4bit(p)) {
    if (blocksize < 0 || blocksize > (int64_t(1) << 30))
      fail(ErrorKind::Config, "quant_blocksize", "blocksize " + std::to_string(blocksize) + " is out of range",
           "allowed: 32, 64, 128, 256, 512, 1024, 2048, 4096");
    q.blocksize = int(blocksize);
    q.double_quant = double_quant;
  }
  validate_quant_params(q);
  return q;
}

std::optional<BasePrecision> base_precision_of(const QuantParams& q) {
  switch (q.format) {
    case QuantFormat::NF4: return BasePrecision::Nf4;
    case QuantFormat::FP4: return BasePrecision::Fp4;
    case QuantFormat::NVFP4: return BasePrecision::Nvfp4;
    case QuantFormat::MXFP4: return BasePrecision::Mxfp4;
    case QuantFormat::FP8_E4M3:
      if (q.fp8_scaling == Fp8Scaling::PerTensor) return BasePrecision::Fp8;
      return std::nullopt;
    default: return std::nullopt;
  }
}

int64_t quantized_weight_bytes(BasePrecision p, int64_t out, int64_t in, int64_t bs, bool dq) {
  return quant_storage_bytes(base_quant_params(p, bs, dq), out, in);
}

}  // namespace qlora
