// Base-precision names and the bytes a frozen projection occupies in each of them.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace qlora {

// fp32 | f32 | bf16 | fp16 | f16 are plain float storage; everything else is a quantized format.
bool is_float_precision(const std::string& p);
DType float_precision_dtype(const std::string& p, DType fallback);
// Exact storage bytes of an (out,in) weight in a quantized base format (nf4, fp4, nvfp4, mxfp4, fp8).
int64_t quantized_weight_bytes(const std::string& p, int64_t out, int64_t in, int64_t blocksize, bool double_quant);
// Allowed base_precision values, for messages.
const char* base_precision_choices();

}  // namespace qlora
