// The scales a block-scaled FP4 GEMM reads beside an NVFP4 or MXFP4 weight's stored e2m1 codes:
// cuBLASLt's NVFP4 form (CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: an e4m3 scale per 16 elements
// of a row in the tiled layout of quant/block_scale_layout.h, and one f32 per-tensor decode scale
// that goes into alpha). Built once when the weights are loaded.
//
// NVFP4: its own block scales, tiled, and its stored decode scale. The codes are used as stored
// (even element in the low nibble, as cuBLASLt's CUDA_R_4F_E2M1 packs them).
// MXFP4: cuBLASLt has no VEC32_UE8M0 kernel on e2m1 data, so each e8m0 scale 2^e of a 32-block
// becomes the e4m3 scale 2^(e - E + 8) of both its 16-blocks, E the tensor's largest block
// exponent, and the decode scale is 2^(E - 8): the product is unchanged wherever 2^(e - E + 8) is
// an e4m3 value (E - e <= 17, down to e4m3's smallest subnormal 2^-9). A block more than 17
// octaves below the tensor's largest gets scale 0 (its elements are below 2^-17 of the tensor's
// largest block scale times 6); fp4_gemm_scales counts them.
#pragma once
#include <cstdint>
#include <vector>

#include "quant/quantize.h"

namespace qlora {

// Header: the f32 decode scale at byte 0, padded to 256 bytes so the tiles keep the arena's
// 256-byte alignment (the harness checks 16; what the real kernels want beyond that is not
// documented, and 240 bytes per projection are nothing).
inline constexpr int64_t kFp4GemmHeaderBytes = 256;
// Bytes of the GEMM scales of a (rows, cols) weight: header + tiled e4m3 scales per 16 of cols.
int64_t fp4_gemm_scales_bytes(int64_t rows, int64_t cols);
// Whether a (out, in) weight can feed the block-scaled GEMM: in % 32 == 0 (e2m1 rows of 16-byte
// multiples) and out % 8 == 0 (bf16 output rows of 16-byte multiples).
inline bool fp4_gemm_shape_ok(int64_t out, int64_t in) { return in > 0 && out > 0 && in % 32 == 0 && out % 8 == 0; }
// The GEMM scales of an NVFP4 or MXFP4 tensor (fp4_gemm_scales_bytes long). `flushed`, if given,
// receives the number of MXFP4 blocks whose scale became 0.
std::vector<uint8_t> fp4_gemm_scales(const QuantizedTensor& q, int64_t* flushed = nullptr);

}  // namespace qlora
