// Small kernels, each correct or broken in one known way, that test_emu_harness.cpp runs to show
// what the host harness detects. Compiled only for the harness (cmake/cuda_emu.cmake).
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "harness_kernels.h"

namespace qlora::emu_test {

using cuda::launch;
namespace attn = cuda::attn;

// Warp 1 writes a row of shared memory that warp 0 then reads: with or without the barrier.
__global__ void __launch_bounds__(64) handoff_kernel(float* out, int with_barrier) {
  QLORA_DYNAMIC_SMEM(raw, 16);
  float* s = reinterpret_cast<float*>(raw);
  if (threadIdx.x >= 32) s[threadIdx.x - 32] = float(threadIdx.x);
  if (with_barrier) __syncthreads();
  if (threadIdx.x < 32) out[threadIdx.x] = s[threadIdx.x];
}

// Every thread adds its index with block_sum (warp shuffles + shared memory + barriers).
__global__ void __launch_bounds__(256) block_sum_kernel(double* out) {
  __shared__ double red[32];
  const double v = cuda::block_sum(double(threadIdx.x + 1), red);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

// 16 bytes per thread through cp.async into shared memory, then read back; `wait` 0 skips the
// cp.async.wait_group (the copies are still waited for at the end, after the read).
__global__ void __launch_bounds__(32) cp_async_kernel(const float* in, float* out, int wait) {
  QLORA_DYNAMIC_SMEM(raw, 16);
  const uint32_t base = attn::smem_addr(raw);
  attn::cp_async16(base + threadIdx.x * 16, in + threadIdx.x * 4, 16);
  attn::cp_async_commit();
  if (wait) attn::cp_async_wait<0>();
  __syncthreads();
  const float* s = reinterpret_cast<const float*>(raw);
  for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = s[((threadIdx.x + 1) % 32) * 4 + i];
  if (!wait) {  // everyone has read; only then are the copies waited for
    __syncthreads();
    attn::cp_async_wait<0>();
  }
}

// One cp.async 16 bytes past the end of the block's dynamic shared memory.
__global__ void __launch_bounds__(32) smem_overflow_kernel(const float* in) {
  QLORA_DYNAMIC_SMEM(raw, 16);
  if (threadIdx.x == 0) attn::cp_async16(attn::smem_addr(raw) + 32 * 16, in, 16);
  attn::cp_async_commit();
  attn::cp_async_wait<0>();
}

// Half of warp 0 waits at __syncthreads while the other half waits in a full-warp shuffle.
__global__ void __launch_bounds__(32) deadlock_kernel(float* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  }
}

// Lanes 16..31 return before the warp's full-mask reduction.
__global__ void __launch_bounds__(32) early_exit_shuffle_kernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = cuda::warp_sum(1.0f);
}

__global__ void __launch_bounds__(1024) empty_kernel(int) {}

void handoff(float* out, bool with_barrier) { launch(handoff_kernel, {1, 64, 32 * 4, nullptr}, out, with_barrier ? 1 : 0); }
void block_sum(double* out, int blocks) { launch(block_sum_kernel, {unsigned(blocks), 256, 0, nullptr}, out); }
void cp_async_roundtrip(const float* in, float* out, bool wait) {
  launch(cp_async_kernel, {1, 32, 32 * 16, nullptr}, in, out, wait ? 1 : 0);
}
void smem_overflow(const float* in) { launch(smem_overflow_kernel, {1, 32, 32 * 16, nullptr}, in); }
void deadlock(float* out) { launch(deadlock_kernel, {1, 32, 0, nullptr}, out); }
void early_exit_shuffle(float* out) { launch(early_exit_shuffle_kernel, {1, 32, 0, nullptr}, out); }
void empty(unsigned threads, size_t smem) { launch(empty_kernel, {1, threads, smem, nullptr}, 0); }
cudaError_t allow_smem(size_t bytes) {
  return cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

}  // namespace qlora::emu_test
