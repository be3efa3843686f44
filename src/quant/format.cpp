// Quant format traits table, parameter validation and storage-size formulas.
#include "quant/format.h"

#include <string>

#include "core/error.h"
#include "quant/formats_impl.h"

namespace qlora {

using detail::ceil_div;

namespace {

constexpr QuantFormatTraits kFormats[] = {
    {QuantFormat::NF4, "nf4", 4, 0, 0, ScaleKind::AbsmaxF32, 4, NibbleOrder::HighFirst, true, 64,
     "bitsandbytes NormalFloat4: 16 N(0,1) quantiles, f32 absmax per block, optional double quant"},
    {QuantFormat::FP4, "fp4", 4, 0, 0, ScaleKind::AbsmaxF32, 4, NibbleOrder::HighFirst, true, 64,
     "bitsandbytes FP4 (not OCP E2M1): values {0, 1/192, 1/6, 1/4, 1/3, 1/2, 2/3, 1} x absmax"},
    {QuantFormat::NVFP4, "nvfp4", 4, 16, 8, ScaleKind::E4M3, 1, NibbleOrder::LowFirst, false, 16,
     "NVIDIA NVFP4: E2M1 values, E4M3 scale per 16 elements, f32 per-tensor decode scale"},
    {QuantFormat::MXFP4, "mxfp4", 4, 32, 16, ScaleKind::E8M0, 1, NibbleOrder::LowFirst, false, 32,
     "OCP MXFP4: E2M1 values, E8M0 power-of-two scale per 32 elements"},
    {QuantFormat::MXFP8_E4M3, "mxfp8_e4m3", 8, 32, 32, ScaleKind::E8M0, 1, NibbleOrder::None, false, 32,
     "OCP MXFP8: E4M3 values, E8M0 power-of-two scale per 32 elements"},
    {QuantFormat::FP8_E4M3, "fp8_e4m3", 8, 1, 0, ScaleKind::F32, 4, NibbleOrder::None, false, 1,
     "FP8 E4M3FN (max 448, saturating) with f32 scale per tensor, 1x128 or 128x128 block"},
    {QuantFormat::FP8_E5M2, "fp8_e5m2", 8, 1, 0, ScaleKind::F32, 4, NibbleOrder::None, false, 1,
     "FP8 E5M2 (max 57344, saturating) with f32 scale per tensor, 1x128 or 128x128 block"},
};

constexpr bool table_in_enum_order() {
  for (size_t i = 0; i < std::size(kFormats); i++)
    if (size_t(kFormats[i].format) != i) return false;
  return true;
}
static_assert(table_in_enum_order(), "kFormats rows must follow QuantFormat order");
static_assert(kFormats[size_t(QuantFormat::NVFP4)].block_bytes == sizeof(BlockNVFP4));
static_assert(kFormats[size_t(QuantFormat::MXFP4)].block_bytes == sizeof(BlockMXFP4));
static_assert(kFormats[size_t(QuantFormat::MXFP8_E4M3)].block_bytes == sizeof(BlockMXFP8));

bool is_bnb(QuantFormat f) { return f == QuantFormat::NF4 || f == QuantFormat::FP4; }
bool is_fp8(QuantFormat f) { return f == QuantFormat::FP8_E4M3 || f == QuantFormat::FP8_E5M2; }

constexpr int64_t kNestedBlock = 256;  // bnb double quant: absmax blocks per nested scale

}  // namespace

std::span<const QuantFormatTraits> quant_formats() { return kFormats; }

const QuantFormatTraits& quant_traits(QuantFormat f) {
  if (size_t(f) >= std::size(kFormats))
    fail(ErrorKind::Internal, "quant format", "unknown quant format id " + std::to_string(int(f)));
  return kFormats[size_t(f)];
}

const char* quant_format_name(QuantFormat f) { return quant_traits(f).name; }

std::optional<QuantFormat> quant_format_from_name(std::string_view name) {
  for (const auto& t : kFormats)
    if (name == t.name) return t.format;
  return std::nullopt;
}

void validate_quant_params(const QuantParams& p) {
  const auto& t = quant_traits(p.format);
  const std::string where = std::string("quant params (format ") + t.name + ")";
  if (is_bnb(p.format)) {
    const int b = p.blocksize;
    const bool pow2 = b > 0 && (b & (b - 1)) == 0;
    if (b != 0 && !(pow2 && b >= 32 && b <= 4096))
      fail(ErrorKind::Config, where + " blocksize",
           "blocksize " + std::to_string(b) + " is not supported for " + t.name,
           "allowed: 32, 64, 128, 256, 512, 1024, 2048, 4096 (0 = default 64)");
  } else {
    if (p.blocksize != 0 && p.blocksize != t.default_blocksize)
      fail(ErrorKind::Config, where + " blocksize",
           "blocksize " + std::to_string(p.blocksize) + " is not supported for " + t.name,
           std::string("allowed: ") + (is_fp8(p.format) ? "0 (use fp8_scaling to pick per-tensor or 1x128/128x128 blocks)"
                                                        : std::to_string(t.default_blocksize) + " or 0"));
    if (p.double_quant)
      fail(ErrorKind::Config, where + " double_quant", "double quantization is only defined for nf4 and fp4",
           "set double_quant: false for this format");
  }
}

int quant_blocksize(const QuantParams& p) {
  validate_quant_params(p);
  return p.blocksize != 0 ? p.blocksize : quant_traits(p.format).default_blocksize;
}

int64_t quant_storage_bytes(const QuantParams& p, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0)
    fail(ErrorKind::Shape, "quant_storage_bytes",
         "shape (" + std::to_string(rows) + ", " + std::to_string(cols) + ") is empty or negative");
  const int64_t bs = quant_blocksize(p);
  const int64_t n = rows * cols;
  switch (p.format) {
    case QuantFormat::NF4:
    case QuantFormat::FP4: {
      const int64_t nb = ceil_div(n, bs);
      const int64_t packed = (n + 1) / 2;
      if (!p.double_quant) return packed + nb * 4;
      return packed + nb + ceil_div(nb, kNestedBlock) * 4 + 4 + 256 * 4;
    }
    case QuantFormat::NVFP4:
      return rows * ceil_div(cols, 2) + rows * ceil_div(cols, 16) + 4;
    case QuantFormat::MXFP4:
      return rows * ceil_div(cols, 2) + rows * ceil_div(cols, 32);
    case QuantFormat::MXFP8_E4M3:
      return n + rows * ceil_div(cols, 32);
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2:
      switch (p.fp8_scaling) {
        case Fp8Scaling::PerTensor: return n + 4;
        case Fp8Scaling::Block1x128: return n + rows * ceil_div(cols, 128) * 4;
        case Fp8Scaling::Block128x128: return n + ceil_div(rows, 128) * ceil_div(cols, 128) * 4;
      }
  }
  fail(ErrorKind::Internal, "quant_storage_bytes", "unhandled format");
}

}  // namespace qlora
