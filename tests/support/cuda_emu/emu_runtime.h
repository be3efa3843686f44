// The host harness's view of the emulated device: allocations, the emulated architecture and the
// sticky error state. Used by the runtime, block executor and vendor-library implementations.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace qlora::emu {

// Whether this harness build runs under ThreadSanitizer or AddressSanitizer: CUDA threads are OS
// threads there, and device memory stays exact-size host allocations.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif
#else
inline constexpr bool kSanitizerBuild = false;
#endif

// Compute capability of the emulated device times 10 (80, 90, 100); QLORA_CUDA_EMU_ARCH chooses.
int arch();
// Largest dynamic + static shared memory one block may opt in to on the emulated architecture.
size_t smem_optin_bytes();

// True when bytes [p, p + n) lie inside one live cudaMalloc allocation.
bool is_device_range(const void* p, size_t n);
// The live device allocations at one moment (base -> bytes), immutable once made: a launch holds
// one while its blocks run, so device code checks addresses without the runtime's lock (a lock
// taken by every CUDA thread would order them all for ThreadSanitizer and hide their races).
struct DeviceRanges {
  std::map<uintptr_t, size_t> bytes;
  bool contains(const void* p, size_t n) const;
};
std::shared_ptr<const DeviceRanges> device_ranges();
// True when bytes [p, p + n) lie inside one live cudaMallocHost allocation (pinned host memory).
bool is_pinned_range(const void* p, size_t n);

// Whether CUDA threads run as OS threads (sanitizer mode: blocks of a grid run concurrently) or
// as fibers (fast mode: blocks in a varying order); for the harness's own tests, which can switch
// (1 threads, 0 fibers, -1 back to the build's default) between launches.
bool os_threads_mode();
void set_os_threads_for_tests(int mode);

// Streams are queues. Device work (kernels, async copies and memsets, event records, stream waits)
// is appended to its stream and runs only when something orders it: a synchronize, a blocking
// copy, cudaFree, a stream waiting on an event of another stream, the legacy default stream's
// implicit order with blocking streams (none with cudaStreamNonBlocking ones), or a vendor call on
// the stream (cuBLAS, cuDNN and NCCL run their work at the call, after the stream's earlier work).
// So work on a side stream runs as late as the program allows, and a missing wait reads what the
// memory held before.
void enqueue(cudaStream_t s, std::function<void()> work);
// Device memory is closed to host code (outside sanitizer builds: a dereference faults, and the
// harness names the allocation) except inside a DeviceAccess scope: queued device work, copies
// and the vendor libraries' calls run in one. Scopes nest; one holds the scheduler's lock.
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};
// Runs everything issued to `s` so far, and what that work waits on.
void drain_stream(cudaStream_t s);
// Runs everything issued to every stream so far.
void drain_all();

// A fault found while running device code or a vendor call (out-of-bounds shared address,
// deadlock, missing lanes): printed at once, then every later runtime call returns `e` with
// `detail` (sticky, as after a device-side fault) until the process ends.
void fault(cudaError_t e, const std::string& detail);
// The last launch's configuration error (cleared by cudaGetLastError), not sticky.
void set_launch_error(cudaError_t e, const std::string& detail);
// The sticky error, cudaSuccess while none has happened.
cudaError_t sticky_error();
// Forgets the sticky and last-launch errors: for the harness's own tests, which fault on purpose.
void clear_errors_for_tests();
// The dynamic shared memory limit a kernel opted in to with cudaFuncSetAttribute (0 if none).
int max_dynamic_smem(const void* fn);
// Counters of calls whose number matters for speed on a device (tests of the backend's behaviour):
// stream/device synchronizations and cuBLASLt matmul descriptors created so far.
long synchronizations();
long stream_waits();  // cudaStreamWaitEvent calls
long lt_descriptors_created();
// cudaMemcpyAsync calls that have run, by the direction their pointers give (cudaMemcpyHostToDevice,
// cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice; host to host counts as cudaMemcpyHostToHost):
// the activation offload tests count the copies of each layer input.
long async_copies(cudaMemcpyKind direction);
// Device bytes in live cudaMalloc allocations (each counted at the size requested), the most
// there have been since the last reset_device_peak() (or the start), and pinned host bytes in
// live cudaMallocHost allocations: what the memory-plan tests compare with the plan.
size_t device_bytes_in_use();
size_t device_bytes_peak();
void reset_device_peak();
size_t pinned_bytes_in_use();

}  // namespace qlora::emu
