// CUDA backend factory and device facts.
#pragma once
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

}  // namespace qlora
