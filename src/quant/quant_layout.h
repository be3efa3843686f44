// The packed storage of one quantized weight: every section of a QuantizedTensor back to back in
// one buffer (an arena buffer on the backend's device), and packing/unpacking it on the host.
#pragma once
#include <cstdint>

#include "quant/quantize.h"

namespace qlora {

// Byte offset and element count of each section of one quantized (rows, cols) weight; offset -1
// where the format has no such section. The f32 sections come first so they stay 4-byte aligned
// (the arena aligns every buffer to 256 bytes), the byte sections follow; except FP8 codes whose
// count is a multiple of 4, which come first so that an FP8 GEMM can read them in place. Sizes follow
// quant/quantize.h; total is asserted to equal quant_storage_bytes, so the plan (which uses
// quant_storage_bytes) and this layout cannot drift apart.
struct QuantLayout {
  struct Section {
    int64_t offset = -1, count = 0;
  };
  Section absmax, nested_absmax, offset, nested_code, scales_f32;  // f32
  Section data, absmax_q, scales;                                  // u8
  int64_t total = 0;
};
QuantLayout quant_layout(const QuantParams& p, int64_t rows, int64_t cols);

// q -> blob of quant_layout(...).total bytes. Error(Format) when q's buffers do not fit the layout.
void pack_quantized(const QuantizedTensor& q, uint8_t* blob);
// blob -> q, reusing q's vector capacity so a scratch tensor allocates only once.
void unpack_quantized(const uint8_t* blob, const QuantParams& p, int64_t rows, int64_t cols, QuantizedTensor& q);

}  // namespace qlora
