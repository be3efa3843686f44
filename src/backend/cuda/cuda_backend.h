// CUDA backend factory and device facts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace qlora {

// Null when no usable device is present or the kernels for its architecture were not built;
// `why` says which.
std::unique_ptr<Backend> make_cuda_backend(std::string* why);

struct CudaDeviceInfo {
  int count = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  size_t total_bytes = 0;
};
// Never throws; count == 0 when the driver or device is missing.
CudaDeviceInfo cuda_device_info();
// Architectures this binary carries code for, e.g. "sm_80 sm_90a sm_100a".
std::string cuda_built_archs();

// The CUDA backend's stream (a cudaStream_t) for callers that time or order their own work
// against the ops (benchmarks, dequantize_bf16); null for any other backend.
void* cuda_stream_of(Backend& be);
// Device bytes the CUDA backend allocated itself: the cuBLASLt workspace, the error record and
// op scratch grown without a memory plan (a model's plan binds its own scratch buffers, which
// its Arena holds). 0 for other backends.
size_t cuda_scratch_bytes(const Backend& be);

// Device memory in use on the current device now: total - free from cudaMemGetInfo, so the CUDA
// context and every process on the device count. Sampled by `qlora bench` as its measured peak
// (our allocations only grow during a run). -1 when the query fails.
int64_t cuda_device_used_bytes();

}  // namespace qlora
