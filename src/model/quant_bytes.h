// A base precision's quantized storage: its QuantParams and exact bytes.
#pragma once
#include <cstdint>
#include <optional>

#include "model/modes.h"
#include "quant/format.h"

namespace qlora {

// The quant format behind a quantized base precision: Nf4, Fp4 (blocksize and double_quant apply),
// Nvfp4, Mxfp4 (fixed blocks; the config defaults for those keys must not make them fail), Fp8
// (e4m3, one scale per tensor). A float precision is an Error(Internal).
QuantParams base_quant_params(BasePrecision p, int64_t blocksize, bool double_quant);
// The base precision that stores weights as `q`; nullopt for the quant library's formats the
// engine does not train on (fp8 e4m3 with block scales, fp8 e5m2, mxfp8).
std::optional<BasePrecision> base_precision_of(const QuantParams& q);
// Exact storage bytes of an (out,in) weight in a quantized base format: quant_storage_bytes.
int64_t quantized_weight_bytes(BasePrecision p, int64_t out, int64_t in, int64_t blocksize, bool double_quant);

}  // namespace qlora
