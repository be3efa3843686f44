// Base-precision names: which are plain float storage, and how a quantized one maps to QuantParams.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "quant/format.h"

namespace qlora {

// fp32 | f32 | bf16 | fp16 | f16 are plain float storage; everything else is a quantized format.
bool is_float_precision(const std::string& p);
DType float_precision_dtype(const std::string& p, DType fallback);
// The quant format behind a base precision: nf4, fp4, nvfp4, mxfp4, fp8 (= fp8_e4m3, per-tensor
// scale), and the quant library's own names (fp8_e4m3, fp8_e5m2, mxfp8_e4m3). blocksize and
// double_quant only apply to nf4/fp4; the other formats have a fixed block and the config
// defaults for those keys (64, true) must not make them fail. Unknown name -> Error(Config).
QuantParams base_quant_params(const std::string& p, int64_t blocksize, bool double_quant);
// Exact storage bytes of an (out,in) weight in a quantized base format: quant_storage_bytes.
int64_t quantized_weight_bytes(const std::string& p, int64_t out, int64_t in, int64_t blocksize, bool double_quant);
// Allowed base_precision values, for messages.
const char* base_precision_choices();

}  // namespace qlora
