// Quantization formats as data: the traits table, block structs, QuantParams and exact storage sizes.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace qlora {

enum class QuantFormat : uint8_t { NF4, FP4, NVFP4, MXFP4, MXFP8_E4M3, FP8_E4M3, FP8_E5M2 };

// What one block scale is stored as.
enum class ScaleKind : uint8_t {
  AbsmaxF32,  // bitsandbytes: f32 absmax per block (u8 + nested f32 state with double quant)
  E4M3,       // NVFP4: one E4M3 byte per 16 elements, plus one f32 per-tensor decode scale
  E8M0,       // OCP MX: one power-of-two byte per 32 elements
  F32,        // FP8: f32 dequant multiplier (scale_inv) per tensor / 1x128 / 128x128 block
};

// Which half of a byte holds the even element of a 4-bit pair.
enum class NibbleOrder : uint8_t {
  None,       // 8-bit codes
  HighFirst,  // bitsandbytes: element 2j -> bits 7..4
  LowFirst,   // NVIDIA / OCP MX / PyTorch fp4x2: element 2j -> bits 3..0
};

struct QuantFormatTraits {
  QuantFormat format;
  const char* name;        // config spelling: "nf4", "mxfp8_e4m3", ...
  int bits;                // bits per element code (4 or 8)
  int block_elems;         // elements per block scale; 0 = set by QuantParams.blocksize (bnb),
                           // 1 = the FP8 scaling mode decides
  int block_bytes;         // packed bytes of one full block (0 when block_elems is 0 or 1)
  ScaleKind scale;
  int scale_bytes;         // bytes per block scale (bnb without double quant: 4)
  NibbleOrder nibbles;
  bool flat_blocks;        // blocks run over the row-major flattened tensor (bnb) rather than
                           // along each row, where the last block of a row may be partial
  int default_blocksize;   // what QuantParams.blocksize = 0 means
  const char* description;
};

// One row per QuantFormat, in enum order. Tests iterate this, so a new row is tested on arrival.
std::span<const QuantFormatTraits> quant_formats();
const QuantFormatTraits& quant_traits(QuantFormat f);
const char* quant_format_name(QuantFormat f);
std::optional<QuantFormat> quant_format_from_name(std::string_view name);

// Packed data of one full block, where the block size is fixed by the format. Scales live in
// their own arrays (that is the layout cuBLASLt and checkpoints use), so they are not members.
struct BlockNVFP4 {
  uint8_t qs[8];  // 16 E2M1 codes, even element in the low nibble
};
struct BlockMXFP4 {
  uint8_t qs[16];  // 32 E2M1 codes, even element in the low nibble
};
struct BlockMXFP8 {
  uint8_t qs[32];  // 32 E4M3 codes
};
static_assert(sizeof(BlockNVFP4) == 8 && sizeof(BlockMXFP4) == 16 && sizeof(BlockMXFP8) == 32);

enum class Fp8Scaling : uint8_t { PerTensor, Block1x128, Block128x128 };

// MX shared-scale rule; see quant/mx.cpp for the reasoning behind the default.
enum class MxScaleRule : uint8_t {
  Floor,  // OCP MX v1.0: 2^(floor(log2 amax) - emax_elem); the block max may saturate
  Ceil,   // TransformerEngine / cuBLAS: 2^ceil(log2(amax / max_elem)); never saturates
};

struct QuantParams {
  QuantFormat format = QuantFormat::NF4;
  int blocksize = 0;          // 0 = the format's default; bnb allows 32..4096 (powers of two)
  bool double_quant = false;  // bnb compress_statistics; NF4/FP4 only
  Fp8Scaling fp8_scaling = Fp8Scaling::PerTensor;  // FP8_E4M3 / FP8_E5M2 only
  MxScaleRule mx_scale_rule = MxScaleRule::Floor;  // MXFP4 / MXFP8_E4M3 only
};

// Throws Error(Config) naming the offending value and what is allowed.
void validate_quant_params(const QuantParams& p);
// blocksize with 0 resolved to the default (validates first).
int quant_blocksize(const QuantParams& p);

// Exact bytes of every buffer a quantized (rows, cols) weight holds: packed codes plus absmax or
// (u8 absmax + nested f32 absmax + f32 offset + 256 f32 code), block scales, tensor scales.
// Equals QuantizedTensor::nbytes() of quantize_ref's output.
int64_t quant_storage_bytes(const QuantParams& p, int64_t rows, int64_t cols);

}  // namespace qlora
