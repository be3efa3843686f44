// The host CPU as a planning device: its rates come from a short calibration of the CPU backend's
// own ops on this machine (GEMM, LoRA-shaped GEMM, attention, cross-entropy, dequantization,
// memory bandwidth), cached per machine, thread count and BLAS so `qlora plan --gpu cpu` is fast.
#pragma once
#include <string>

#include "plan/gpu_catalog.h"

namespace qlora {

struct CpuCalibration {
  std::string cpu_model, blas, simd;  // what the rates were measured with
  int threads = 0;
  double gemm_flops = 0;         // f32 GEMM FLOP/s at decoder shapes, weights streamed from memory
  double lora_flops = 0;         // f32 GEMM FLOP/s with one dimension 16 (x A^T, h B^T, dB, dA)
  double attn_flops = 0;         // causal attention forward + backward, FLOPs counted as the planner does
  double ce_elems_per_s = 0;     // cross_entropy_fwd_bwd logits per second
  double dequant_elems_per_s = 0;  // NF4 (double quant) -> f32 elements per second
  double mem_bw = 0;             // bytes/s of a streaming y += x
  double seconds = 0;            // how long the calibration took
  bool from_cache = false;
};

// Runs the calibration (a few seconds) unless a cached result for this machine, thread count and
// BLAS exists under $QLORA_CACHE_DIR, $XDG_CACHE_HOME/qlora or ~/.cache/qlora (refresh: always run).
CpuCalibration cpu_calibration(bool refresh = false);

// The device `--gpu cpu` plans for: host memory, the calibrated rates.
GpuSpec cpu_device_spec(const CpuCalibration& c);

}  // namespace qlora
