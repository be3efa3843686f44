// bitsandbytes NF4/FP4 pieces: code tables, the 8-bit dynamic map and double quantization.
#pragma once
#include <cstdint>
#include <vector>

#include "quant/quantize.h"

namespace qlora {

// get_4bit_type("nf4"/"fp4") as f32, indexed by the 4-bit code (the checkpoint's quant_map).
const float* nf4_code();  // (16)
const float* fp4_code();  // (16)
// create_dynamic_map(signed=True) as bitsandbytes 0.50 builds it under torch 2.x (the nested_quant_map
// of double quant). Older torch versions produced a map differing in the last ulp of ~40 entries;
// a checkpoint loader must use the map stored with the weights, as dequantize_ref does.
const float* dynamic_map_signed();  // (256)

// The double-quant offset: torch's float32 mean of the block absmax on CPU, reproduced in torch's
// single-thread summation order (cascade sum, 8-lane vectors as on AVX2 / default builds). With
// several threads and more than 32768 blocks, or with AVX-512 or CUDA, torch sums in another order
// and the offset can differ in the last bit; a checkpoint stores its offset, so loading is exact.
float bnb_absmax_mean(const float* absmax, int64_t n);

// bitsandbytes' native CPU 8-bit blockwise quantizer (used for double quant): per block
// absmax = max|x|, v = x * (1/absmax), code = nearest entry of `code256` through a 65536-bin
// table over [-1, 1]. x (n) -> q (n), absmax (ceil(n/blocksize)).
void bnb_quantize_blockwise_8bit(const float* x, int64_t n, int blocksize, const float* code256,
                                 uint8_t* q, float* absmax);

// Per-block f32 absmax of an NF4/FP4 tensor: absmax as stored, or with double quant
// nested_code[absmax_q[b]] * nested_absmax[b/256] + offset (multiply, then add, in f32).
float bnb_block_absmax(const QuantizedTensor& q, int64_t block);
// The same from the raw sections (absmax null: double quant), for readers of packed buffers.
inline float bnb_block_absmax(const float* absmax, const uint8_t* absmax_q, const float* nested_absmax,
                              const float* nested_code, float offset, int64_t block) {
  if (!absmax_q) return absmax[block];
  const float scaled = nested_code[absmax_q[block]] * nested_absmax[block / 256];  // 256 blocks per nested scale
  return scaled + offset;
}

}  // namespace qlora
