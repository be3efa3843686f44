// Quantized frozen weights in the arena: host QuantizedTensors stored into and read back from
// planned buffers (quant/quant_layout.h).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "quant/quant_layout.h"
#include "quant/quantize.h"

namespace qlora {

// Moves quantized weights between host QuantizedTensors and backend buffers (through host scratch
// off the CPU). Dequantizing a stored buffer is the backend's `dequantize` op.
class QuantizedWeightIo {
 public:
  explicit QuantizedWeightIo(Backend& be) : be_(be) {}
  void store(const QuantizedTensor& q, void* dst);  // dst: quant_layout(q).total bytes on the device
  void load(const void* src, const QuantParams& p, int64_t rows, int64_t cols, QuantizedTensor& q);

 private:
  Backend& be_;
  std::vector<uint8_t> blob_;  // host copy of one packed buffer
  QuantizedTensor q_;          // scratch tensor
};

}  // namespace qlora
