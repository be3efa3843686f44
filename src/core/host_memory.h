// How much memory the machine can still give this process.
#pragma once
#include <cstdint>

namespace qlora {

// /proc/meminfo's MemAvailable in bytes (memory the kernel can hand out without swapping); 0 when
// it cannot be read.
int64_t available_host_bytes();

// /proc/self/status's VmRSS in bytes (this process's resident memory now); 0 when it cannot be read.
int64_t resident_host_bytes();

}  // namespace qlora
