// Pre-quantized checkpoints: the bitsandbytes-4bit layout transformers saves and loads (nf4/fp4),
// and qlora.cpp's own layout for the other formats. Both are Hugging Face model directories whose
// config.json carries a `quantization_config`; embeddings, norms, biases and lm_head stay floats.
//
// bitsandbytes (quant_method "bitsandbytes", load_in_4bit), per quantized Linear, W = "<module>.weight",
// n = out*in flattened row-major, nb = ceil(n / blocksize):
//   W                                   U8 [(n+1)/2, 1]  nibbles, even element in the HIGH nibble
//                                       (other bnb_4bit_quant_storage dtypes: the same bytes)
//   W.absmax                            U8 [nb] with double quant (codes of absmax - offset), else F32 [nb]
//   W.quant_map                         F32 [16]  the nf4/fp4 code table
//   W.nested_absmax                     F32 [ceil(nb/256)]  double quant only
//   W.nested_quant_map                  F32 [256] double quant only (bnb's dynamic map)
//   W.quant_state.bitsandbytes__<type>  U8  UTF-8 JSON {"quant_type", "blocksize", "dtype", "shape",
//                                       and with double quant "nested_blocksize": 256,
//                                       "nested_dtype": "float32", "nested_offset"}
// config.json has no blocksize; each quant_state carries it (bitsandbytes' default is 64).
//
// qlora.cpp (quant_method "qlora_cpp"; keys quant_format, blocksize, fp8_scaling, mx_scale_rule,
// version 1), scales row-major and unswizzled, as quant/quantize.h holds them:
//   nvfp4       W U8 [out, ceil(in/2)] E2M1 (even element in the LOW nibble),
//               W_scale F8_E4M3 [out, ceil(in/16)], W_scale_2 F32 [1] (per-tensor decode scale)
//   mxfp4       W U8 [out, ceil(in/2)] E2M1 (low nibble first), W_scale U8 [out, ceil(in/32)] E8M0
//   mxfp8_e4m3  W F8_E4M3 [out, in], W_scale U8 [out, ceil(in/32)] E8M0
//   fp8_e4m3/fp8_e5m2  W F8_E4M3|F8_E5M2 [out, in], W_scale_inv F32: [1] per tensor,
//               [out, ceil(in/128)] 1x128 blocks or [ceil(out/128), ceil(in/128)] 128x128 blocks
// where W_scale means "<module>.weight_scale" (the ModelOpt / compressed-tensors spelling).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "io/json_util.h"
#include "io/safetensors.h"
#include "model/decoder_model.h"
#include "quant/quantize.h"

namespace qlora {

struct CheckpointQuant {
  std::string method;              // "bitsandbytes" | "qlora_cpp" | "mxfp4" (gpt-oss's experts)
  QuantParams params;              // blocksize resolved
  std::string storage = "uint8";   // bnb_4bit_quant_storage
  std::string compute_dtype;       // bnb_4bit_compute_dtype, informational
};

// config.json's quantization_config (nullopt when absent). The bnb blocksize is read from the
// first quant_state in `ar`. Errors: Unsupported for other methods, 8-bit and unknown layouts;
// Format for a malformed entry. `where` names config.json.
std::optional<CheckpointQuant> read_checkpoint_quant(const json& config, const SafetensorsArchive& ar,
                                                     const std::string& where);

// Whether weight `name` ("model.layers.0.self_attn.q_proj.weight") is stored quantized.
bool is_quantized_weight(const SafetensorsArchive& ar, const CheckpointQuant& cq, const std::string& name);
// Reads it as stored, checking every part against the (rows, cols) the model expects and against
// cq: quant_state JSON vs tensor shapes, blocksize vs the absmax count, code tables. Errors name
// the tensor.
QuantizedTensor read_quantized_weight(const SafetensorsArchive& ar, const CheckpointQuant& cq,
                                      const std::string& name, int64_t rows, int64_t cols);

// A TensorSource over a quantized checkpoint: read_f32 dequantizes quantized weights (so the
// checkpoint also loads into a float base), read_quantized hands them over as stored.
TensorSource quantized_checkpoint_source(std::shared_ptr<const SafetensorsArchive> ar, CheckpointQuant cq,
                                         const std::string& description);

// Writing. orig_dtype is the torch spelling of the source weights ("float32", "bfloat16", ...).
json quantization_config_json(const QuantParams& p, const std::string& compute_dtype);
void add_quantized_weight(SafetensorsWriter& w, const std::string& name, const QuantizedTensor& q,
                          const std::string& orig_dtype);
// The quant_state JSON exactly as bitsandbytes writes it (Python json.dumps of its dict).
std::string bnb_quant_state_json(const QuantizedTensor& q, const std::string& orig_dtype);
// Python's repr() of a double: shortest round-trip digits, exponent form below 1e-4 or from 1e16.
std::string python_float_repr(double v);

}  // namespace qlora
