// Quantized frozen weights in the arena: every section of a QuantizedTensor packed back to back in
// one planned buffer, and the dequantization of such a buffer into a compute-dtype workspace.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "quant/quantize.h"

namespace qlora {

// Byte offset and element count of each section of one quantized (rows, cols) weight; offset -1
// where the format has no such section. The f32 sections come first so they stay 4-byte aligned
// (the arena aligns every buffer to 256 bytes), the byte sections follow. Sizes follow
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

// Moves quantized weights between host QuantizedTensors and backend buffers, and dequantizes a
// backend buffer into a (rows, cols) compute-dtype buffer. On the CPU backend the arena is host
// memory and f32 dequantization writes straight into the destination; elsewhere the packed bytes
// travel through host scratch (one projection at a time).
class QuantizedWeightIo {
 public:
  explicit QuantizedWeightIo(Backend& be) : be_(be) {}
  void store(const QuantizedTensor& q, void* dst);  // dst: quant_layout(q).total bytes on the device
  void load(const void* src, const QuantParams& p, int64_t rows, int64_t cols, QuantizedTensor& q);
  // dst (rows, cols) of dtype dst_t (F32, BF16 or F16) on the device "=" dequantize(src).
  void dequantize(const void* src, const QuantParams& p, int64_t rows, int64_t cols, void* dst, DType dst_t);

 private:
  Backend& be_;
  std::vector<uint8_t> blob_;  // host copy of one packed buffer
  QuantizedTensor q_;          // scratch tensor
  std::vector<float> f32_;     // (rows, cols) host result when it cannot go straight to dst
  std::vector<uint8_t> conv_;  // (rows, cols) in dst_t
};

}  // namespace qlora
