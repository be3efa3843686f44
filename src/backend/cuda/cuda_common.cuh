// Shared CUDA helpers: error checks, F32/BF16 element access, 16-byte vector loads, block reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "core/tensor.h"

namespace qlora::cuda {

// Every CUDA runtime call goes through this: a failure names the call site and becomes an Error.
[[noreturn]] void fail_cuda(cudaError_t e, const char* expr, const char* file, int line);
#define QLORA_CUDA_CHECK(expr)                                                        \
  do {                                                                                \
    cudaError_t qlora_e_ = (expr);                                                    \
    if (qlora_e_ != cudaSuccess) ::qlora::cuda::fail_cuda(qlora_e_, #expr, __FILE__, __LINE__); \
  } while (0)
// After each launch: catches bad launch configurations at the op that caused them.
#define QLORA_CUDA_LAUNCH_CHECK() QLORA_CUDA_CHECK(cudaGetLastError())

// A kernel launch's configuration; `where` is the launch site, for the host harness's messages.
struct Launch {
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
  std::source_location where = std::source_location::current();
};

// kernel<<<grid, block, smem, stream>>>(args...). Under the host harness (tests/support/cuda_emu)
// the same kernel function runs on the CPU, once per emulated CUDA thread.
template <class... P, class... A>
void launch(void (*kernel)(P...), const Launch& cfg, A&&... args) {
#ifdef QLORA_CUDA_EMU
  // The arguments are copied, as a device launch copies them: the blocks run when the stream
  // reaches the launch, after the caller's locals are gone.
  std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
  std::apply([&](const auto&... a) {
    int i = 0;
    (::qlora::emu::check_arg(a, i++, cfg.where), ...);
  }, params);
  ::qlora::emu::launch(reinterpret_cast<const void*>(kernel), cfg.grid, cfg.block, cfg.smem, cfg.stream,
                       [kernel, params = std::move(params)] { std::apply(kernel, params); }, cfg.where);
#else
  kernel<<<cfg.grid, cfg.block, cfg.smem, cfg.stream>>>(std::forward<A>(args)...);
#endif
}

// Opts a kernel into `bytes` of dynamic shared memory (above the default 48 KiB).
template <class... P>
void allow_dynamic_smem(void (*kernel)(P...), size_t bytes) {
  QLORA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// A static shared variable of type T (an array type too: QLORA_SHARED(float[32], red)), one per
// block. The host harness gives each block its own copy, poisoned until written.
#ifdef QLORA_CUDA_EMU
#define QLORA_SHARED(T, name)                                                          \
  static const int name##_site_ = ::qlora::emu::static_smem_site();                     \
  std::type_identity_t<T>& name = *static_cast<std::type_identity_t<T>*>(::qlora::emu::static_smem(name##_site_, sizeof(T)))
#else
#define QLORA_SHARED(T, name) __shared__ std::type_identity_t<T> name
#endif

// The block's dynamic shared memory as `unsigned char* name`, aligned to `align` bytes.
#ifdef QLORA_CUDA_EMU
#define QLORA_DYNAMIC_SMEM(name, align) unsigned char* name = ::qlora::emu::dynamic_smem()
#else
#define QLORA_DYNAMIC_SMEM(name, align) extern __shared__ __align__(align) unsigned char name[]
#endif

inline int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Argument checks shared by the CUDA op files (same policy as the CPU backend: wrong dtype or a
// null buffer is an Internal error of the caller, a size mismatch is a Shape error).
void check_tensor(const char* op, const char* name, const Tensor& t, int64_t numel, bool allow_bf16, bool allow_f32);
void check_dim(const char* op, const char* dim, int64_t value);
void check_ptr(const char* op, const char* what, const void* p);
[[noreturn]] void unsupported(const char* op, const std::string& what, const std::string& hint = "");
// Logit soft-capping (Gemma 2): 0 (none) or a positive, finite cap, else Error(Internal).
void check_softcap(const char* op, float softcap);

// A float tensor as a kernel sees it: pointer plus whether its elements are BF16 (else F32).
// The flag is uniform across a launch, so the branch in ldf/stf costs one predicate, and one
// kernel serves every F32/BF16 combination instead of a template instantiation per combination.
struct FPtr {
  void* p;
  int bf16;
};
inline FPtr fptr(const Tensor& t) { return {t.data, t.dtype == DType::BF16 ? 1 : 0}; }

__device__ __forceinline__ float ldf(FPtr a, int64_t i) {
  return a.bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(a.p)[i]) : static_cast<const float*>(a.p)[i];
}
__device__ __forceinline__ void stf(FPtr a, int64_t i, float v) {
  if (a.bf16)
    static_cast<__nv_bfloat16*>(a.p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(a.p)[i] = v;
}

// Eight consecutive elements starting at i (a multiple of 8): one 16-byte load for BF16, two for
// F32. Callers only take this path when every pointer of the launch is 16-byte aligned.
__device__ __forceinline__ void ld8(FPtr a, int64_t i, float (&v)[8]) {
  if (a.bf16) {
    const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.p) + i);
    __nv_bfloat162 h[4];
    memcpy(static_cast<void*>(h), &u, 16);  // a defined type pun (a register move on the device)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const float2 f = __bfloat1622float2(h[j]);
      v[2 * j] = f.x;
      v[2 * j + 1] = f.y;
    }
  } else {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(a.p) + i);
    const float4 x = p[0], y = p[1];
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
  }
}
__device__ __forceinline__ void st8(FPtr a, int64_t i, const float (&v)[8]) {
  if (a.bf16) {
    __nv_bfloat162 h[4];
#pragma unroll
    for (int j = 0; j < 4; j++) h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    uint4 u;
    memcpy(&u, h, 16);
    *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(a.p) + i) = u;
  } else {
    float4* p = reinterpret_cast<float4*>(static_cast<float*>(a.p) + i);
    p[0] = make_float4(v[0], v[1], v[2], v[3]);
    p[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `red` is a __shared__ array of 32 elements; the trailing barrier lets callers reuse it at once.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warp = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  T r = lane < n_warp ? red[lane] : T(0);
  r = warp_sum(r);
  __syncthreads();
  return r;
}

// Device-side data errors (a token id or label outside the vocabulary). A kernel records the
// first one here; the backend turns it into an Error(Data) at the next synchronize/copy_to_host,
// since checking on the host would need the ids on the host before every launch.
struct DeviceErrorRecord {
  int code;      // 0 = none, else DeviceError
  int value;     // the offending id
  long long index;  // its row
};
// kErrAttnDocs: a packed attention call had more documents (index) than its cuDNN entries (value).
enum DeviceError : int { kErrNone = 0, kErrTokenRange = 1, kErrLabelRange = 2, kErrAttnDocs = 3 };

__device__ __forceinline__ void record_device_error(DeviceErrorRecord* rec, int code, long long index, int value) {
  if (atomicCAS(&rec->code, 0, -1) == 0) {  // -1 = being written; only the first writer fills in
    rec->value = value;
    rec->index = index;
    __threadfence();
    atomicExch(&rec->code, code);
  }
}

}  // namespace qlora::cuda
