// Activation offload on the CPU: host memory is the device's, so a copy is a memcpy made at once
// and there is never a pending copy to wait for. The model runs the same offload code path as on
// a GPU, which is how the CPU tests check that offload computes exactly what `full` does.
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace qlora {

void CpuBackend::offload_copy(const OffloadCopyArgs& a) {
  const char* op = "offload_copy";
  cpu::check_dim(op, "bytes", a.bytes);
  if (a.bytes == 0) return;
  cpu::check_ptr(op, "dst", a.dst);
  cpu::check_ptr(op, "src", a.src);
  const auto* s = static_cast<const char*>(a.src);
  auto* d = static_cast<char*>(a.dst);
  if (s < d + a.bytes && d < s + a.bytes)
    fail(ErrorKind::Internal, "cpu op offload_copy", "source and destination overlap (" + std::to_string(a.bytes) + " bytes)",
         "offload copies go between a device buffer and a host buffer");
  std::memcpy(d, s, size_t(a.bytes));
}

void CpuBackend::offload_wait(const OffloadWaitArgs& a) {
  cpu::check_dim("offload_wait", "bytes", a.bytes);
  if (a.bytes > 0) cpu::check_ptr("offload_wait", "p", a.p);
}

}  // namespace qlora
