// GPU dequantization of the quantized weight formats (quant/format.h) to bf16, in one pass.
// The table's dequantize op calls it for every bf16 output (straight from the packed blob).
#pragma once
#include <cstdint>
#include <vector>

#include "quant/format.h"

namespace qlora {

class Backend;
struct QuantizedTensor;

namespace cuda {

// Device-resident buffers of one quantized (rows, cols) weight, laid out exactly as the host
// QuantizedTensor's (quant/quantize.h). Pointers a format does not use stay null.
struct QuantDeviceView {
  QuantParams params;  // blocksize resolved (never 0)
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;           // packed codes
  float code4[16] = {};                    // NF4/FP4: the 16-entry code table (bnb quant_map)
  const float* absmax = nullptr;           // NF4/FP4 without double quant: (n_blocks)
  const uint8_t* absmax_q = nullptr;       // NF4/FP4 double quant: (n_blocks) u8
  const float* nested_absmax = nullptr;    //   (ceil(n_blocks/256))
  const float* nested_code = nullptr;      //   (256)
  float offset = 0.0f;                     //   added after the nested scale
  const float* offset_dev = nullptr;       //   or read from device memory (a packed blob), if set
  const uint8_t* scales = nullptr;         // NVFP4: E4M3 (rows, ceil(cols/16)); MX: E8M0 (rows, ceil(cols/32))
  const float* scales_f32 = nullptr;       // NVFP4: (1) tensor scale; FP8: scale_inv per region
};

// out (rows, cols) bf16 on the device, ordered on `cuda_backend`'s stream (which must be the
// CUDA backend). Each element is the f32 value of dequantize_ref rounded to nearest even, so the
// result equals dequantize_ref_bf16 bit for bit. Rows whose packed bytes are 16-byte aligned go
// through 16-byte loads; other shapes take an element-wise path.
void dequantize_bf16(Backend& cuda_backend, const QuantDeviceView& q, void* out);

// Device copies of a host QuantizedTensor (tests and benchmarks). Frees its buffers through the
// backend it was made with. code4 must be filled by the caller for NF4/FP4 (nf4_code()/fp4_code()
// from quant/bnb4.h), so this header needs no link against the quant library.
class QuantDeviceBuffers {
 public:
  QuantDeviceBuffers(Backend& be, const QuantizedTensor& q, const float* code4);
  ~QuantDeviceBuffers();
  QuantDeviceBuffers(const QuantDeviceBuffers&) = delete;
  QuantDeviceBuffers& operator=(const QuantDeviceBuffers&) = delete;
  const QuantDeviceView& view() const { return view_; }
  int64_t device_bytes() const { return bytes_; }  // bytes uploaded (what a dequant pass reads)

 private:
  const void* upload(const void* src, size_t bytes);
  Backend& be_;
  QuantDeviceView view_;
  std::vector<void*> allocs_;
  int64_t bytes_ = 0;
};

}  // namespace cuda
}  // namespace qlora
