// The block-scaled FP4 GEMM's scales for NVFP4 and MXFP4 weights (see quant/fp4_gemm.h).
#include "quant/fp4_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "quant/block_scale_layout.h"
#include "quant/minifloat.h"

namespace qlora {

int64_t fp4_gemm_scales_bytes(int64_t rows, int64_t cols) {
  return kFp4GemmHeaderBytes + block_scale_tiled_bytes(rows, (cols + 15) / 16);
}

std::vector<uint8_t> fp4_gemm_scales(const QuantizedTensor& q, int64_t* flushed) {
  const QuantFormat f = q.params.format;
  if (f != QuantFormat::NVFP4 && f != QuantFormat::MXFP4)
    fail(ErrorKind::Internal, "fp4_gemm_scales", std::string("format ") + quant_format_name(f) + " has no FP4 GEMM form",
         "only NVFP4 and MXFP4 weights feed the block-scaled FP4 GEMM");
  const int64_t rows = q.rows, kb16 = (q.cols + 15) / 16;
  std::vector<uint8_t> out(size_t(fp4_gemm_scales_bytes(rows, q.cols)), 0);
  float decode = 0.0f;
  std::vector<uint8_t> s16(size_t(rows * kb16), 0);  // (rows, kb16) e4m3, row-major
  int64_t n_flushed = 0;
  if (f == QuantFormat::NVFP4) {
    decode = q.scales_f32.at(0);
    s16 = q.scales;
  } else {
    const int64_t kb32 = (q.cols + 31) / 32;
    int e_max = 0;  // the largest stored e8m0 byte (0xFF, NaN, never comes from a finite block)
    for (uint8_t e : q.scales)
      if (e != 0xFF) e_max = std::max(e_max, int(e));
    decode = std::ldexp(1.0f, e_max - 127 - 8);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t b = 0; b < kb16; b++) {
        const uint8_t e = q.scales[size_t(r * kb32 + b / 2)];
        const int p = int(e) - e_max + 8;  // this block's scale over the decode scale, 2^p
        uint8_t code = 0;
        if (e == 0xFF)
          code = 0x7F;  // NaN stays NaN
        else if (p >= -9)
          code = f32_to_e4m3(std::ldexp(1.0f, p), true);  // exact: 2^-9 .. 2^8 are e4m3 values
        else if (b % 2 == 0)
          n_flushed++;
        s16[size_t(r * kb16 + b)] = code;
      }
  }
  std::memcpy(out.data(), &decode, 4);
  const std::vector<uint8_t> tiles = tile_block_scales(s16.data(), rows, kb16);
  std::copy(tiles.begin(), tiles.end(), out.begin() + kFp4GemmHeaderBytes);
  if (flushed) *flushed = n_flushed;
  return out;
}

}  // namespace qlora
