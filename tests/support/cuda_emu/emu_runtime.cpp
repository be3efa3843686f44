// The CUDA runtime API for the host harness: device memory as exact-size host allocations filled
// with NaN bytes (as uninitialized device memory is garbage), closed to host code except while
// device work runs (DeviceAccess, emu_runtime.h), copies checked against their
// direction and the allocations they touch, streams as queues that run only when the program
// orders them (emu_runtime.h), the device properties of the emulated architecture, and CUDA's
// error model (a launch error is returned once by cudaGetLastError; a fault inside a kernel is
// sticky).
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cuda_emu/emu_runtime.h"

namespace qlora::emu {
namespace {

std::mutex g_mu;
std::map<uintptr_t, size_t> g_device;  // base -> bytes
std::shared_ptr<const DeviceRanges> g_ranges;  // g_device as launches see it; null after a change
std::map<uintptr_t, size_t> g_pinned;  // base -> bytes
size_t g_used = 0, g_peak = 0, g_pinned_used = 0;
std::map<const void*, int> g_fn_smem;
cudaError_t g_sticky = cudaSuccess;
std::string g_sticky_detail;
cudaError_t g_launch = cudaSuccess;
std::string g_launch_detail;

// A stream's queued work, each item numbered in issue order across all streams.
struct Cmd {
  uint64_t seq;
  std::function<void()> run;
};
struct Stream {
  unsigned flags = cudaStreamDefault;
  bool legacy = false, live = true;
  std::deque<Cmd> q;
};
// An event is the point of its last record in its stream's queue; it fires when that point runs.
struct Event {
  Stream* s = nullptr;
  uint64_t seq = 0;
  bool fired = true;
  bool recorded = false;
  std::chrono::steady_clock::time_point t;
};
// Streams and events stay allocated until exit: a queued wait or record may name one that the
// program has destroyed (CUDA lets pending work complete after destroy).
std::recursive_mutex g_sched;
uint64_t g_seq = 0;
Stream g_legacy_stream = [] {
  Stream s;
  s.legacy = true;
  return s;
}();
std::vector<std::unique_ptr<Stream>> g_stream_store;
std::vector<std::unique_ptr<Event>> g_event_store;

Stream* stream_of(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &g_legacy_stream;
  return reinterpret_cast<Stream*>(s);
}

void run_until(Stream* s, uint64_t limit);
// The legacy default stream's implicit order: its work waits for the earlier work of every
// blocking stream, and a blocking stream's work waits for the legacy stream's earlier work.
// Streams made with cudaStreamNonBlocking take no part.
void implicit_order(const Stream* s, uint64_t seq) {
  if (s->legacy) {
    for (auto& o : g_stream_store)
      if (o->live && o->flags == cudaStreamDefault) run_until(o.get(), seq - 1);
  } else if (s->flags == cudaStreamDefault) {
    run_until(&g_legacy_stream, seq - 1);
  }
}
// Runs the stream's queued work numbered up to `limit`, in order.
void run_until(Stream* s, uint64_t limit) {
  if (s->q.empty() || s->q.front().seq > limit) return;
  DeviceAccess device_work;
  while (!s->q.empty() && s->q.front().seq <= limit) {
    Cmd c = std::move(s->q.front());
    s->q.pop_front();
    implicit_order(s, c.seq);
    c.run();
  }
}
// QLORA_CUDA_EMU_EAGER=1: every stream runs its work at the call, in issue order (a diagnostic:
// a test that passes only this way depends on an order the program does not ask for).
bool eager() {
  static const bool e = [] {
    const char* v = std::getenv("QLORA_CUDA_EMU_EAGER");
    return v && *v == '1';
  }();
  return e;
}
uint64_t enqueue_locked(Stream* s, std::function<void()> work) {
  s->q.push_back(Cmd{++g_seq, std::move(work)});
  if (eager()) run_until(s, g_seq);
  return g_seq;
}

bool range_in(const std::map<uintptr_t, size_t>& m, const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second && n <= it->second;
}
bool device_range_locked(const void* p, size_t n) { return range_in(g_device, p, n); }

size_t total_bytes() { return arch() >= 100 ? size_t(180) << 30 : size_t(80) << 30; }

// Host access to device memory. Outside sanitizer builds (which keep exact-size allocations for
// AddressSanitizer) each cudaMalloc is its own page-aligned mapping, PROT_NONE while no device
// work runs, so host code that dereferences a device pointer faults here as on a device, and the
// SIGSEGV handler names it. QLORA_CUDA_EMU_HOST_ACCESS=allow turns this off.
bool guard_device_memory() {
  static const bool g = [] {
    const char* v = std::getenv("QLORA_CUDA_EMU_HOST_ACCESS");
    return !kSanitizerBuild && !(v && std::string(v) == "allow");
  }();
  return g;
}
size_t page_round(size_t n) {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}
// Open DeviceAccess scopes (changed under g_sched, read by the SIGSEGV handler on any thread).
std::atomic<int> g_access_depth{0};
// The allocations device work opened in the current scope, closed again when it ends: an
// allocation opens on its first touch (a fault the handler answers with mprotect), so a scope
// costs only the allocations it uses.
constexpr int kMaxOpened = 4096;
uintptr_t g_opened[kMaxOpened];
std::atomic<int> g_n_opened{0};

void close_opened() {  // caller holds g_sched, at the end of the outermost scope
  const int n = g_n_opened.exchange(0);
  if (n > kMaxOpened) {  // more than the list holds: close everything
    std::lock_guard<std::mutex> lk(g_mu);
    for (const auto& [base, bytes] : g_device) mprotect(reinterpret_cast<void*>(base), page_round(bytes), PROT_NONE);
    return;
  }
  std::lock_guard<std::mutex> lk(g_mu);
  for (int i = 0; i < n; i++) {
    auto it = g_device.find(g_opened[i]);
    if (it != g_device.end()) mprotect(reinterpret_cast<void*>(it->first), page_round(it->second), PROT_NONE);
  }
}

void on_segv(int sig, siginfo_t* info, void*) {
  const auto a = reinterpret_cast<uintptr_t>(info->si_addr);
  // Without the lock (a signal handler): device allocations change only between device work.
  auto it = g_device.upper_bound(a);
  if (it != g_device.begin() && a < std::prev(it)->first + page_round(std::prev(it)->second)) {
    --it;
    if (g_access_depth.load(std::memory_order_relaxed) > 0) {  // device work: open it and retry
      mprotect(reinterpret_cast<void*>(it->first), page_round(it->second), PROT_READ | PROT_WRITE);
      const int i = g_n_opened.fetch_add(1);
      if (i < kMaxOpened) g_opened[i] = it->first;
      return;
    }
    char msg[512];
    const int len = std::snprintf(msg, sizeof msg,
                                  "qlora CUDA harness: host code touched device memory at %p (byte %zu of a cudaMalloc "
                                  "allocation of %zu bytes) outside a copy, a kernel or a library call; on a device "
                                  "that is an invalid access (copy it with cudaMemcpy)\n",
                                  info->si_addr, size_t(a - it->first), it->second);
    if (len > 0) (void)!write(2, msg, size_t(std::min<int>(len, int(sizeof msg) - 1)));
  }
  signal(sig, SIG_DFL);  // fault again with the default action (a core, or gtest's death test)
}

void install_segv_handler() {
  static const bool done = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
    return true;
  }();
  (void)done;
}

cudaError_t ret(cudaError_t e) { return g_sticky != cudaSuccess ? g_sticky : e; }

}  // namespace

int arch() {
  const char* a = std::getenv("QLORA_CUDA_EMU_ARCH");
  if (!a || !*a) return 90;
  const int v = std::atoi(a[0] == 's' ? a + 3 : a);  // "90" or "sm_90"
  return v == 80 || v == 86 || v == 89 || v == 90 || v == 100 || v == 120 ? v : 90;
}

size_t smem_optin_bytes() { return arch() == 80 ? 166912 : arch() == 86 || arch() == 89 || arch() == 120 ? 101376 : 232448; }

bool DeviceRanges::contains(const void* p, size_t n) const { return range_in(bytes, p, n); }

std::shared_ptr<const DeviceRanges> device_ranges() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_ranges) g_ranges = std::make_shared<const DeviceRanges>(DeviceRanges{g_device});
  return g_ranges;
}

bool is_device_range(const void* p, size_t n) {
  std::lock_guard<std::mutex> lk(g_mu);
  return device_range_locked(p, n);
}

bool is_pinned_range(const void* p, size_t n) {
  std::lock_guard<std::mutex> lk(g_mu);
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = g_pinned.upper_bound(a);
  if (it == g_pinned.begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second;
}

void enqueue(cudaStream_t s, std::function<void()> work) {
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  enqueue_locked(stream_of(s), std::move(work));
}

DeviceAccess::DeviceAccess() {
  g_sched.lock();
  g_access_depth.fetch_add(1, std::memory_order_relaxed);
}

DeviceAccess::~DeviceAccess() {
  if (g_access_depth.fetch_sub(1, std::memory_order_relaxed) == 1 && guard_device_memory()) close_opened();
  g_sched.unlock();
}

void drain_stream(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  run_until(stream_of(s), g_seq);
}

// Side streams last: the later-created streams (the backend's prefetch and copy streams) run after
// the ones made before them, the legacy stream at the end.
void drain_all() {
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  const uint64_t limit = g_seq;
  for (auto& o : g_stream_store)
    if (o->live) run_until(o.get(), limit);
  run_until(&g_legacy_stream, limit);
  for (auto& o : g_stream_store) run_until(o.get(), limit);  // destroyed streams' pending work
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
  std::lock_guard<std::recursive_mutex> sched(g_sched);
  if (guard_device_memory()) {
    // Its own pages (page-aligned: more than cudaMalloc's 256 bytes), closed while no device work runs.
    m = mmap(nullptr, page_round(n), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
    std::memset(m, 0xff, n);
    mprotect(m, page_round(n), PROT_NONE);  // device work opens it at its first touch
    install_segv_handler();
  } else {
    // Exact size (AddressSanitizer sees one byte past the end), cudaMalloc's 256-byte alignment.
    if (posix_memalign(&m, 256, n) != 0 || !m) return cudaErrorMemoryAllocation;
    std::memset(m, 0xff, n);
  }
  auto release = [&] {
    if (guard_device_memory())
      munmap(m, page_round(n));
    else
      std::free(m);
  };
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_used + n > total_bytes()) {
    release();
    return cudaErrorMemoryAllocation;
  }
  g_device[reinterpret_cast<uintptr_t>(m)] = n;
  g_ranges.reset();
  g_used += n;
  g_peak = std::max(g_peak, g_used);
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return ret(cudaSuccess);
  drain_all();  // cudaFree synchronizes the device
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_device.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_device.end()) return g_sticky != cudaSuccess ? g_sticky : cudaErrorInvalidDevicePointer;
  g_used -= it->second;
  const size_t n = it->second;
  g_device.erase(it);
  g_ranges.reset();
  // Also after a fault, so leak checkers stay quiet; the error is still returned.
  if (guard_device_memory())
    munmap(p, page_round(n));
  else
    std::free(p);
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
  drain_all();  // as cudaFree: pending copies may still read or write it
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
// The argument checks of a copy, at the call (errors are returned by the call, not later); says
// which of the two pointers name device memory.
cudaError_t check_copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, bool& dst_dev, bool& src_dev) {
  if (sticky_error() != cudaSuccess) return sticky_error();
  if (n == 0) return cudaSuccess;
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
  return cudaSuccess;
}

// Queues the copy on the stream. Pageable host memory follows CUDA's rules: a copy from it reads
// the bytes at the call (they are staged), a copy into it returns only when done.
cudaError_t queue_copy(void* dst, const void* src, size_t n, bool dst_dev, bool src_dev, cudaStream_t stream,
                       bool blocking) {
  const bool src_pageable = !src_dev && !is_pinned_range(src, n);
  const bool dst_pageable = !dst_dev && !is_pinned_range(dst, n);
  std::function<void()> work;
  if (src_pageable) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                                static_cast<const unsigned char*>(src) + n);
    work = [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); };
  } else {
    work = [dst, src, n] {
      if (sticky_error() == cudaSuccess) std::memmove(dst, src, n);
    };
  }
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  Stream* s = stream_of(stream);
  const uint64_t seq = enqueue_locked(s, std::move(work));
  if (blocking || dst_pageable) run_until(s, seq);
  return ret(cudaSuccess);
}
}  // namespace

// On the legacy default stream, and synchronous with the host.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  bool d = false, s = false;
  const cudaError_t e = check_copy(dst, src, n, kind, d, s);
  if (e != cudaSuccess || n == 0) return e;
  return queue_copy(dst, src, n, d, s, nullptr, true);
}

std::atomic<long> g_async_copies[4] = {};  // indexed by cudaMemcpyKind (HostToHost .. DeviceToDevice)
long qlora::emu::async_copies(cudaMemcpyKind direction) {
  const int k = int(direction);
  return k >= 0 && k < 4 ? g_async_copies[k].load(std::memory_order_relaxed) : 0;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
  bool d = false, s = false;
  const cudaError_t e = check_copy(dst, src, n, kind, d, s);
  if (e != cudaSuccess || n == 0) return e;
  g_async_copies[s ? (d ? 3 : 2) : (d ? 1 : 0)].fetch_add(1, std::memory_order_relaxed);
  return queue_copy(dst, src, n, d, s, stream, false);
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
  if (sticky_error() != cudaSuccess) return sticky_error();
  if (n == 0) return cudaSuccess;
  if (!is_device_range(p, n)) {
    set_launch_error(cudaErrorInvalidValue, "cudaMemset outside a device allocation");
    return cudaErrorInvalidValue;
  }
  enqueue(stream, [p, value, n] {
    if (sticky_error() == cudaSuccess) std::memset(p, value, n);
  });
  return cudaSuccess;
}

// On the legacy default stream; like a kernel, it returns before it runs.
cudaError_t cudaMemset(void* p, int value, size_t n) { return cudaMemsetAsync(p, value, n, nullptr); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  g_stream_store.push_back(std::make_unique<Stream>());
  g_stream_store.back()->flags = flags & cudaStreamNonBlocking;
  *s = reinterpret_cast<cudaStream_t>(g_stream_store.back().get());
  return ret(cudaSuccess);
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
// Returns at once; the stream's pending work still runs (when the program next orders it).
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  stream_of(s)->live = false;
  return ret(cudaSuccess);
}
// Explicit synchronizations are counted (tests of how often a step waits for the device).
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
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  g_syncs.fetch_add(1, std::memory_order_relaxed);
  drain_stream(s);
  return ret(cudaSuccess);
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  return ret(stream_of(s)->q.empty() ? cudaSuccess : cudaErrorNotReady);
}
cudaError_t cudaDeviceSynchronize(void) {
  g_syncs.fetch_add(1, std::memory_order_relaxed);
  drain_all();
  return ret(cudaSuccess);
}
std::atomic<long> g_stream_waits{0};
long qlora::emu::stream_waits() { return g_stream_waits.load(std::memory_order_relaxed); }
// The wait is queued on `s`: when `s` reaches it, the event's stream runs up to the event's
// record (as the record stood when cudaStreamWaitEvent was called).
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  g_stream_waits.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  const Event* ev = reinterpret_cast<Event*>(e);
  Stream* es = ev->s;
  const uint64_t upto = ev->seq;
  enqueue_locked(stream_of(s), [es, upto] {
    if (es) run_until(es, upto);
  });
  return ret(cudaSuccess);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  g_event_store.push_back(std::make_unique<Event>());
  *e = reinterpret_cast<cudaEvent_t>(g_event_store.back().get());
  return ret(cudaSuccess);
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t) { return ret(cudaSuccess); }  // kept: a queued record may name it
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  auto* ev = reinterpret_cast<Event*>(e);
  ev->s = stream_of(s);
  ev->fired = false;
  ev->recorded = true;
  ev->seq = enqueue_locked(ev->s, [ev, seq = g_seq + 1] {
    if (ev->seq != seq) return;  // recorded again since: that later record fires it
    ev->fired = true;
    ev->t = std::chrono::steady_clock::now();
  });
  return ret(cudaSuccess);
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  const Event* ev = reinterpret_cast<Event*>(e);
  if (ev->s) run_until(ev->s, ev->seq);
  return ret(cudaSuccess);
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  return ret(reinterpret_cast<Event*>(e)->fired ? cudaSuccess : cudaErrorNotReady);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  std::lock_guard<std::recursive_mutex> lk(g_sched);
  auto *ea = reinterpret_cast<Event*>(a), *eb = reinterpret_cast<Event*>(b);
  if (!ea->recorded || !eb->recorded) return cudaErrorInvalidResourceHandle;
  if (!ea->fired || !eb->fired) return cudaErrorNotReady;
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
