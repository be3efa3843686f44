// cuBLASLt's tiled layout of 1D block scaling factors (MXFP8/MXFP4 e8m0 per 32, NVFP4 e4m3 per 16
// along K), as the cuBLAS documentation describes it ("1D Block Scaling Factors Layout"): the
// scales of a matrix with `outer` rows of `k_blocks` blocks each are stored in tiles of 128 rows x
// 4 blocks (512 bytes, padded with zeros), the tiles of one 128-row band next to each other; inside
// a tile, row r and block c sit at (r % 32) * 16 + (r / 32) * 4 + c. Our formats store the scales
// row-major (outer, k_blocks) (quant/mx.cpp, quant/nvfp4.cpp); tile_block_scales converts.
#pragma once
#include <cstdint>
#include <vector>

// The two index functions also compile for the device (the FP4 GEMM's activation quantizer).
#if defined(__CUDACC__)
#define QLORA_BSL_HD __host__ __device__
#else
#define QLORA_BSL_HD
#endif

namespace qlora {

QLORA_BSL_HD inline int64_t block_scale_tiled_bytes(int64_t outer, int64_t k_blocks) {
  return (outer + 127) / 128 * 128 * ((k_blocks + 3) / 4 * 4);
}

QLORA_BSL_HD inline int64_t block_scale_offset(int64_t row, int64_t block, int64_t k_blocks) {
  const int64_t tiles_k = (k_blocks + 3) / 4;
  return ((row / 128) * tiles_k + block / 4) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + block % 4;
}

// Row-major (outer, k_blocks) scales -> the tiled layout, block_scale_tiled_bytes long.
inline std::vector<uint8_t> tile_block_scales(const uint8_t* s, int64_t outer, int64_t k_blocks) {
  std::vector<uint8_t> t(size_t(block_scale_tiled_bytes(outer, k_blocks)), 0);
  for (int64_t r = 0; r < outer; r++)
    for (int64_t b = 0; b < k_blocks; b++) t[size_t(block_scale_offset(r, b, k_blocks))] = s[r * k_blocks + b];
  return t;
}

}  // namespace qlora
