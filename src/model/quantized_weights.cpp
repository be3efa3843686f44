// Quantized weights in the arena: host <-> backend copies and dequantization through the backend op.
#include "model/quantized_weights.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace qlora {

void QuantizedWeightIo::store(const QuantizedTensor& q, void* dst) {
  const QuantLayout L = quant_layout(q.params, q.rows, q.cols);
  if (be_.device() == DeviceKind::Cpu) {
    pack_quantized(q, static_cast<uint8_t*>(dst));
    return;
  }
  blob_.resize(size_t(L.total));
  pack_quantized(q, blob_.data());
  be_.copy_to_device(dst, blob_.data(), blob_.size());
}

void QuantizedWeightIo::load(const void* src, const QuantParams& p, int64_t rows, int64_t cols, QuantizedTensor& q) {
  if (be_.device() == DeviceKind::Cpu) {
    unpack_quantized(static_cast<const uint8_t*>(src), p, rows, cols, q);
    return;
  }
  blob_.resize(size_t(quant_layout(p, rows, cols).total));
  be_.copy_to_host(blob_.data(), src, blob_.size());
  unpack_quantized(blob_.data(), p, rows, cols, q);
}

}  // namespace qlora
