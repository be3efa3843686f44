// The host harness's prelude: force-included (-include) before every CUDA source of the backend
// when that source is compiled by the host C++ compiler for the harness build. It keeps the real
// CUDA headers (types, enums, bf16 conversions) and maps the device-only parts of CUDA C++ onto
// the harness: thread and block indices, barriers, warp collectives, atomics, the PTX the kernels
// use (cp.async, ldmatrix, mma) and kernel launches. The kernels' own source stays CUDA: the only
// harness hooks in it are launch(), QLORA_SHARED and QLORA_DYNAMIC_SMEM in cuda_common.cuh and the
// #if in the PTX wrappers of attention_mma.cuh.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <type_traits>

#define QLORA_CUDA_EMU 1

// Kernels and device functions are plain host functions. Static shared variables are declared with
// QLORA_SHARED (cuda_common.cuh), which gives each block its own poisoned copy; a bare __shared__
// does not compile here (blocks run concurrently, so one static variable would be shared by them).
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ __shared__declarations_need_QLORA_SHARED_in_the_host_harness
#define __launch_bounds__(...)

namespace qlora::emu {

// Compute capability of the emulated device times 10 (QLORA_CUDA_EMU_ARCH, default 90).
int arch();

// --- the executing thread --------------------------------------------------------------------
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();

void syncthreads();
void syncwarp(unsigned mask);
// Exchanges one 64-bit value per lane across the calling warp: `src_lane` is the lane whose value
// this lane receives (out-of-range → own value, as shfl does).
uint64_t warp_exchange(unsigned mask, uint64_t mine, int src_lane);
int lane_id();

// Dynamic shared memory of the running block (exact size of the launch's request).
unsigned char* dynamic_smem();
// Static shared memory: a process-wide number for each QLORA_SHARED declaration, and the running
// block's copy of that variable (`bytes` long, NaN bits until written; one per block and site).
int static_smem_site();
void* static_smem(int site, size_t bytes);
// Generic → shared-window address and back; out-of-window addresses are faults.
uint32_t cvta_shared(const void* p);

// PTX the attention kernels use, with PTX ISA semantics.
void cp_async16(uint32_t dst, const void* src, int src_bytes);
void cp_async_commit();
void cp_async_wait(int n);
void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans);
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

// Runs `body` once per thread of every block. `fn` identifies the kernel (its attributes) and
// `where` the launch site for messages. Configuration errors go to cudaGetLastError.
// A kernel argument that is a pointer must name device memory (cudaMalloc) or pinned host memory
// (cudaMallocHost, reachable through unified addressing), or be null; anything else (a host
// stack, heap or static address) faults as the device would on its first access, naming the
// launch and the argument. Pointers inside argument structs are not seen.
void check_pointer_arg(const void* p, int index, const std::source_location& where);
template <class T>
void check_arg(const T& v, int index, const std::source_location& where) {
  if constexpr (std::is_pointer_v<T> && std::is_object_v<std::remove_pointer_t<T>>)
    check_pointer_arg(static_cast<const void*>(v), index, where);
}

void launch(const void* fn, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, std::function<void()> body,
            const std::source_location& where);

template <class T>
T shfl(unsigned mask, T v, int src_lane) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t u = 0;
  std::memcpy(&u, static_cast<const void*>(&v), sizeof(T));
  u = warp_exchange(mask, u, src_lane);
  T r;
  std::memcpy(static_cast<void*>(&r), &u, sizeof(T));
  return r;
}

// Device atomics on host memory: GCC builtins (sequentially consistent), which ThreadSanitizer understands.
template <class T>
T atomic_add_float(T* p, T v) {
  using U = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
  U* up = reinterpret_cast<U*>(p);
  U old = __atomic_load_n(up, __ATOMIC_SEQ_CST);
  for (;;) {
    T ov, nv;
    std::memcpy(static_cast<void*>(&ov), &old, sizeof(T));
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      nv = __float2bfloat16_rn(__bfloat162float(ov) + __bfloat162float(v));
    else
      nv = ov + v;
    U nu;
    std::memcpy(&nu, static_cast<const void*>(&nv), sizeof(T));
    if (__atomic_compare_exchange_n(up, &old, nu, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return ov;
  }
}

}  // namespace qlora::emu

#define threadIdx (::qlora::emu::thread_idx())
#define blockIdx (::qlora::emu::block_idx())
#define blockDim (::qlora::emu::block_dim())
#define gridDim (::qlora::emu::grid_dim())
#define warpSize 32

inline void __syncthreads() { ::qlora::emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::qlora::emu::syncwarp(mask); }
// The harness's atomics are sequentially consistent (stronger than the device's relaxed ones), so
// they already order the plain accesses around them; a fence adds nothing (and ThreadSanitizer
// does not model fences).
inline void __threadfence() {}

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = ::qlora::emu::lane_id();
  return ::qlora::emu::shfl(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::qlora::emu::lane_id();
  const int src = lane ^ lane_mask;
  return ::qlora::emu::shfl(mask, v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::qlora::emu::lane_id();
  const int src = lane + int(delta);
  return ::qlora::emu::shfl(mask, v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::qlora::emu::lane_id();
  const int src = lane - int(delta);
  return ::qlora::emu::shfl(mask, v, src >= (lane & ~(width - 1)) ? src : lane);
}

inline float atomicAdd(float* p, float v) { return ::qlora::emu::atomic_add_float(p, v); }
inline double atomicAdd(double* p, double v) { return ::qlora::emu::atomic_add_float(p, v); }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) { return ::qlora::emu::atomic_add_float(p, v); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicCAS(int* p, int compare, int val) {
  __atomic_compare_exchange_n(p, &compare, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;
}
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }

// cuda_runtime.h declares this overload for nvcc only.
template <class T>
cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(func), attr, value);
}

inline size_t __cvta_generic_to_shared(const void* p) { return ::qlora::emu::cvta_shared(p); }

// Math intrinsics the kernels use that the host library lacks (the device's fast versions are
// approximations; the harness uses the correctly rounded ones, so it proves the algorithm, not the
// ulps). Add one here when a kernel starts using it.
inline void __sincosf(float x, float* s, float* c) { ::sincosf(x, s, c); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
// Round-to-nearest operations that the device never contracts into an FMA.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
