// gpt-oss checkpoints (quantization_config quant_method "mxfp4"): the experts' weights ship as
// MXFP4 blocks and E8M0 scales, everything else as floats.
#pragma once
#include <memory>
#include <string>

#include "io/safetensors.h"
#include "model/tensor_source.h"

namespace qlora {

// The MXFP4 parameters of those blocks: 32 elements per E8M0 scale (the OCP MX block).
QuantParams mxfp4_expert_params();

// Rows first, first + step, ... (count of them) of an MXFP4 weight, their codes and scales
// copied (an MXFP4 row is its own cols/2 code bytes and cols/32 scales).
QuantizedTensor mxfp4_rows(const QuantizedTensor& q, int64_t first, int64_t count, int64_t step = 1);

// A source over such a checkpoint. A float tensor reads as itself. An expert stack `name`
// ("model.layers.<l>.mlp.experts.gate_up_proj" / "down_proj") stored as `name`_blocks
// (E, out, in/32, 16) U8 (the even element in the low nibble) and `name`_scales (E, out, in/32)
// U8 reads:
//  - in f32 as transformers' GptOssExperts parameter, (E, in, out): each element
//    code * 2^(scale - 127), as transformers' convert_moe_packed_tensors dequantizes it;
//  - as stored through read_quantized, one MXFP4 (E * out, in) weight: expert e's rows
//    [e * out, (e + 1) * out), its codes and scales byte for byte.
// stored_expert_quant says so (the experts are adopted as shipped, the rest stays float).
TensorSource mxfp4_experts_source(std::shared_ptr<const SafetensorsArchive> ar, const std::string& description);

}  // namespace qlora
