// The CUDA runtime API for the host harness: device memory as exact-size host allocations filled
// with NaN bytes (as uninitialized device memory is garbage), copies checked against their
// direction and the allocations they touch, streams and events executed in order at once, the
// device properties of the emulated architecture, and CUDA's error model (a launch error is
// returned once by cudaGetLastError; a fault inside a kernel is sticky).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "backend/cuda/emu/emu_runtime.h"

namespace qlora::emu {
namespace {

std::mutex g_mu;
std::map<uintptr_t, size_t> g_device;  // base -> bytes
std::map<uintptr_t, size_t> g_pinned;  // base -> bytes
size_t g_used = 0, g_peak = 0, g_pinned_used = 0;
std::map<const void*, int> g_fn_smem;
cudaError_t g_sticky = cudaSuccess;
std::string g_sticky_detail;
cudaError_t g_launch = cudaSuccess;
std::string g_launch_detail;

struct Stream {
  unsigned flags;
};
struct Event {
  std::chrono::steady_clock::time_point t;
  bool recorded = false;
};

bool device_range_locked(const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = g_device.upper_bound(a);
  if (it == g_device.begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second && n <= it->second;
}

size_t total_bytes() { return arch() >= 100 ? size_t(180) << 30 : size_t(80) << 30; }

cudaError_t ret(cudaError_t e) { return g_sticky != cudaSuccess ? g_sticky : e; }

}  // namespace

int arch() {
  const char* a = std::getenv("QLORA_CUDA_EMU_ARCH");
  if (!a || !*a) return 90;
  const int v = std::atoi(a[0] == 's' ? a + 3 : a);  // "90" or "sm_90"
  return v == 80 || v == 86 || v == 89 || v == 90 || v == 100 || v == 120 ? v : 90;
}

size_t smem_optin_bytes() { return arch() == 80 ? 166912 : arch() == 86 || arch() == 89 || arch() == 120 ? 101376 : 232448; }

bool is_device_range(const void* p, size_t n) {
  std::lock_guard<std::mutex> lk(g_mu);
  return device_range_locked(p, n);
}

void fault(cudaError_t e, const std::string& detail) {
  std::fprintf(stderr, "qlora CUDA harness: %s\n", detail.c_str());
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_sticky == cudaSuccess) {
    g_sticky = e;
    g_sticky_detail = detail;
  }
}

void set_launch_error(cudaError_t e, const std::string& detail) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_launch == cudaSuccess) {
    g_launch = e;
    g_launch_detail = detail;
  }
}

cudaError_t sticky_error() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_sticky;
}

void clear_errors_for_tests() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_sticky = g_launch = cudaSuccess;
  g_sticky_detail.clear();
  g_launch_detail.clear();
}

int max_dynamic_smem(const void* fn) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_fn_smem.find(fn);
  return it == g_fn_smem.end() ? 0 : it->second;
}

}  // namespace qlora::emu

using namespace qlora::emu;

cudaError_t cudaGetLastError(void) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_sticky != cudaSuccess) return g_sticky;
  const cudaError_t e = g_launch;
  g_launch = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_sticky != cudaSuccess ? g_sticky : g_launch;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (e != cudaSuccess && e == g_sticky) return g_sticky_detail.c_str();
    if (e != cudaSuccess && e == g_launch) return g_launch_detail.c_str();
  }
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "unknown error";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return ret(device == 0 ? cudaSuccess : cudaErrorInvalidDevice); }

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return ret(cudaSuccess);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::memset(p, 0, sizeof(*p));
  const int a = arch();
  std::snprintf(p->name, sizeof(p->name), "qlora CUDA host harness (sm_%d)", a);
  p->major = a / 10;
  p->minor = a % 10;
  p->totalGlobalMem = total_bytes();
  p->sharedMemPerBlock = 48 * 1024;
  p->sharedMemPerBlockOptin = smem_optin_bytes();
  p->sharedMemPerMultiprocessor = smem_optin_bytes() + 1024;
  p->regsPerBlock = 65536;
  p->regsPerMultiprocessor = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsPerMultiProcessor = a == 80 || a == 90 || a == 100 ? 2048 : 1536;
  p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
  p->multiProcessorCount = a == 80 ? 108 : a == 90 ? 132 : a == 100 ? 148 : 84;
  p->l2CacheSize = a == 80 ? 40 << 20 : 50 << 20;
  p->unifiedAddressing = 1;
  p->concurrentKernels = 1;
  return ret(cudaSuccess);
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(p.sharedMemPerBlockOptin); break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    default: return cudaErrorInvalidValue;
  }
  return ret(cudaSuccess);
}

cudaError_t cudaMalloc(void** p, size_t n) {
  *p = nullptr;
  if (sticky_error() != cudaSuccess) return sticky_error();
  if (n == 0) return cudaSuccess;
  if (n > total_bytes()) return cudaErrorMemoryAllocation;
  void* m = nullptr;
  // Exact size (AddressSanitizer sees one byte past the end), cudaMalloc's 256-byte alignment.
  if (posix_memalign(&m, 256, n) != 0 || !m) return cudaErrorMemoryAllocation;
  std::memset(m, 0xff, n);
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_used + n > total_bytes()) {
    std::free(m);
    return cudaErrorMemoryAllocation;
  }
  g_device[reinterpret_cast<uintptr_t>(m)] = n;
  g_used += n;
  g_peak = std::max(g_peak, g_used);
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return ret(cudaSuccess);
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_device.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_device.end()) return g_sticky != cudaSuccess ? g_sticky : cudaErrorInvalidDevicePointer;
  g_used -= it->second;
  g_device.erase(it);
  std::free(p);  // also after a fault, so leak checkers stay quiet; the error is still returned
  return g_sticky != cudaSuccess ? g_sticky : cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t n) {
  *p = nullptr;
  if (posix_memalign(p, 4096, n ? n : 1) != 0) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lk(g_mu);
  g_pinned[reinterpret_cast<uintptr_t>(*p)] = n;
  g_pinned_used += n;
  return ret(cudaSuccess);
}

cudaError_t cudaHostAlloc(void** p, size_t n, unsigned int) { return cudaMallocHost(p, n); }

cudaError_t cudaFreeHost(void* p) {
  if (!p) return ret(cudaSuccess);
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_pinned.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_pinned.end()) return cudaErrorInvalidValue;
  g_pinned_used -= it->second;
  g_pinned.erase(it);
  std::free(p);
  return g_sticky != cudaSuccess ? g_sticky : cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
  std::lock_guard<std::mutex> lk(g_mu);
  *total_b = total_bytes();
  *free_b = total_bytes() - g_used;
  return g_sticky != cudaSuccess ? g_sticky : cudaSuccess;
}

namespace {
cudaError_t copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (sticky_error() != cudaSuccess) return sticky_error();
  if (n == 0) return cudaSuccess;
  bool dst_dev, src_dev;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    dst_dev = device_range_locked(dst, n);
    src_dev = device_range_locked(src, n);
  }
  const bool dst_ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice) == dst_dev;
  const bool src_ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice) == src_dev;
  if (!dst_ok || !src_ok) {
    set_launch_error(cudaErrorInvalidValue, "cudaMemcpy: a pointer is not in the memory its kind names, or the copy "
                                            "runs past the end of its device allocation");
    return cudaErrorInvalidValue;
  }
  std::memmove(dst, src, n);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) { return copy(dst, src, n, kind); }

std::atomic<long> g_async_copies[4] = {};  // indexed by cudaMemcpyKind (HostToHost .. DeviceToDevice)
long qlora::emu::async_copies(cudaMemcpyKind direction) {
  const int k = int(direction);
  return k >= 0 && k < 4 ? g_async_copies[k].load(std::memory_order_relaxed) : 0;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t) {
  const cudaError_t e = copy(dst, src, n, kind);
  if (e == cudaSuccess && n > 0) {
    const bool d = is_device_range(dst, n), s = is_device_range(src, n);
    g_async_copies[s ? (d ? 3 : 2) : (d ? 1 : 0)].fetch_add(1, std::memory_order_relaxed);
  }
  return e;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t) {
  if (sticky_error() != cudaSuccess) return sticky_error();
  if (n == 0) return cudaSuccess;
  if (!is_device_range(p, n)) {
    set_launch_error(cudaErrorInvalidValue, "cudaMemset outside a device allocation");
    return cudaErrorInvalidValue;
  }
  std::memset(p, value, n);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t n) { return cudaMemsetAsync(p, value, n, nullptr); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  *s = reinterpret_cast<cudaStream_t>(new Stream{flags});
  return ret(cudaSuccess);
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<Stream*>(s);
  return ret(cudaSuccess);
}
// Work runs when it is enqueued, so every stream is always idle; synchronizations are counted.
std::atomic<long> g_syncs{0};
long qlora::emu::synchronizations() { return g_syncs.load(std::memory_order_relaxed); }
size_t qlora::emu::device_bytes_in_use() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_used;
}
size_t qlora::emu::device_bytes_peak() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_peak;
}
void qlora::emu::reset_device_peak() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_peak = g_used;
}
size_t qlora::emu::pinned_bytes_in_use() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_pinned_used;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  g_syncs.fetch_add(1, std::memory_order_relaxed);
  return ret(cudaSuccess);
}
cudaError_t cudaStreamQuery(cudaStream_t) { return ret(cudaSuccess); }
cudaError_t cudaDeviceSynchronize(void) {
  g_syncs.fetch_add(1, std::memory_order_relaxed);
  return ret(cudaSuccess);
}
std::atomic<long> g_stream_waits{0};
long qlora::emu::stream_waits() { return g_stream_waits.load(std::memory_order_relaxed); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) {
  g_stream_waits.fetch_add(1, std::memory_order_relaxed);
  return ret(cudaSuccess);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new Event{});
  return ret(cudaSuccess);
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<Event*>(e);
  return ret(cudaSuccess);
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  auto* ev = reinterpret_cast<Event*>(e);
  ev->t = std::chrono::steady_clock::now();
  ev->recorded = true;
  return ret(cudaSuccess);
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return ret(cudaSuccess); }
cudaError_t cudaEventQuery(cudaEvent_t) { return ret(cudaSuccess); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  auto *ea = reinterpret_cast<Event*>(a), *eb = reinterpret_cast<Event*>(b);
  if (!ea->recorded || !eb->recorded) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(eb->t - ea->t).count();
  return ret(cudaSuccess);
}

cudaError_t cudaFuncSetAttribute(const void* fn, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || size_t(value) > smem_optin_bytes()) return ret(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(g_mu);
    g_fn_smem[fn] = value;
  }
  return ret(cudaSuccess);
}
