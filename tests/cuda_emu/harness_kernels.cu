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
  QLORA_SHARED(double[32], red);
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

// Block 0 writes its static shared variable; every block then reads its own.
__global__ void __launch_bounds__(32) static_shared_kernel(float* out) {
  QLORA_SHARED(float, s);
  if (blockIdx.x == 0 && threadIdx.x == 0) s = 7.0f;
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Thread 0 of each block takes a ticket when the block starts and another after a barrier.
__global__ void __launch_bounds__(64) block_order_kernel(int* counter, int* starts, int* ends) {
  if (threadIdx.x == 0) starts[blockIdx.x] = atomicAdd(counter, 1);
  __syncthreads();
  if (threadIdx.x == 0) ends[blockIdx.x] = atomicAdd(counter, 1);
}

// Blocks 0 and 1 each raise a flag and wait (a bounded spin) for the other's: both see it only
// when the two blocks run at the same time.
__global__ void __launch_bounds__(32) handshake_kernel(int* flags, int* seen) {
  if (threadIdx.x != 0) return;
  const int me = int(blockIdx.x), other = 1 - me;
  atomicExch(&flags[me], 1);
  int v = 0;
  for (long i = 0; i < 20000000 && v == 0; i++) v = atomicCAS(&flags[other], 2, 2);
  seen[me] = v;
}

void static_shared(float* out, int blocks) { launch(static_shared_kernel, {unsigned(blocks), 32, 0, nullptr}, out); }
void block_order(int* counter, int* starts, int* ends, int blocks) {
  launch(block_order_kernel, {unsigned(blocks), 64, 0, nullptr}, counter, starts, ends);
}
void handshake(int* flags, int* seen) { launch(handshake_kernel, {2, 32, 0, nullptr}, flags, seen); }
void handoff(float* out, bool with_barrier) { launch(handoff_kernel, {1, 64, 32 * 4, nullptr}, out, with_barrier ? 1 : 0); }
void block_sum(double* out, int blocks) { launch(block_sum_kernel, {unsigned(blocks), 256, 0, nullptr}, out); }
void cp_async_roundtrip(const float* in, float* out, bool wait) {
  launch(cp_async_kernel, {1, 32, 32 * 16, nullptr}, in, out, wait ? 1 : 0);
}
void smem_overflow(const float* in) { launch(smem_overflow_kernel, {1, 32, 32 * 16, nullptr}, in); }
void deadlock(float* out) { launch(deadlock_kernel, {1, 32, 0, nullptr}, out); }
void early_exit_shuffle(float* out) { launch(early_exit_shuffle_kernel, {1, 32, 0, nullptr}, out); }
void empty(unsigned threads, size_t smem) { launch(empty_kernel, {1, threads, smem, nullptr}, 0); }

// out[i] = v, and out[i] = in[i] + 1, one thread per element: the stream tests' producer and consumer.
__global__ void __launch_bounds__(256) fill_kernel(float* out, int n, float v) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = v;
}
__global__ void __launch_bounds__(256) add_one_kernel(const float* in, float* out, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i] + 1.0f;
}
// ---- known answers for the PTX wrappers of attention_mma.cuh, from the PTX ISA's fragment tables
// (mma.m16n8k16 with .bf16 A/B and .f32 C/D; ldmatrix.m8n8.x4[.trans].b16). groupID = lane >> 2,
// threadID_in_group = lane & 3. Every element distinct and exact in bf16 (integers below 256).

// A (16x16, row): a[r][c] = r * 16 + c. Register j holds elements 2j (low half) and 2j + 1:
// element i sits at row groupID (+8 for i in {2,3,6,7}), column 2 * threadID_in_group + (i & 1)
// (+8 for i >= 4). B (16x8, col): b[k][n] = k * 8 + n + 1; element i at row (k)
// 2 * threadID_in_group + (i & 1) (+8 for i >= 2), column (n) groupID. C/D (16x8): element i at
// row groupID (+8 for i >= 2), column 2 * threadID_in_group + (i & 1); C starts as 1000 + r * 8 + n.
__global__ void __launch_bounds__(32) mma_known_answer_kernel(float* d_out) {
  const int lane = int(threadIdx.x), g = lane >> 2, t = lane & 3;
  uint32_t a[4], b[2];
  for (int j = 0; j < 4; j++) {
    float v[2];
    for (int h = 0; h < 2; h++) {
      const int i = 2 * j + h;
      const int row = g + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0);
      const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
      v[h] = float(row * 16 + col);
    }
    a[j] = attn::pack_bf16(v[0], v[1]);
  }
  for (int j = 0; j < 2; j++) {
    float v[2];
    for (int h = 0; h < 2; h++) {
      const int i = 2 * j + h;
      const int k = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
      v[h] = float(k * 8 + g + 1);
    }
    b[j] = attn::pack_bf16(v[0], v[1]);
  }
  float d[4];
  for (int i = 0; i < 4; i++) d[i] = float(1000 + (g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1));
  attn::mma16816(d, a, b[0], b[1]);
  for (int i = 0; i < 4; i++) d_out[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)] = d[i];
}
void mma_known_answer(float* d_out) { launch(mma_known_answer_kernel, {1, 32, 0, nullptr}, d_out); }

// Four 8x8 b16 matrices in shared memory, rows of 16 bytes: m[j][r][c] = j * 64 + r * 8 + c. Lanes
// 8j..8j+7 give the addresses of matrix j's rows 0..7. Without .trans, register j of a lane holds
// m[j][groupID][2 * threadID_in_group] (low half) and [.. + 1]; with .trans, m[j][2 *
// threadID_in_group][groupID] and m[j][2 * threadID_in_group + 1][groupID]. out[lane * 8 + 2j + h].
__global__ void __launch_bounds__(32) ldmatrix_known_answer_kernel(float* out, int trans) {
  QLORA_DYNAMIC_SMEM(raw, 16);
  __nv_bfloat16* s = reinterpret_cast<__nv_bfloat16*>(raw);
  const int lane = int(threadIdx.x);
  for (int e = lane; e < 256; e += 32) s[e] = __float2bfloat16_rn(float(e));  // e = j * 64 + r * 8 + c
  __syncthreads();
  const uint32_t addr = attn::smem_addr(s + (lane >> 3) * 64 + (lane & 7) * 8);
  uint32_t r[4];
  if (trans) attn::ldsm_x4_t(r, addr);
  else attn::ldsm_x4(r, addr);
  for (int j = 0; j < 4; j++) {
    __nv_bfloat162 v;
    memcpy(&v, &r[j], 4);
    out[lane * 8 + 2 * j] = __bfloat162float(v.x);
    out[lane * 8 + 2 * j + 1] = __bfloat162float(v.y);
  }
}
void ldmatrix_known_answer(float* out, bool trans) {
  launch(ldmatrix_known_answer_kernel, {1, 32, 512, nullptr}, out, trans ? 1 : 0);
}

void fill(float* out, int n, float v, cudaStream_t s) {
  launch(fill_kernel, {unsigned((n + 255) / 256), 256, 0, s}, out, n, v);
}
void add_one(const float* in, float* out, int n, cudaStream_t s) {
  launch(add_one_kernel, {unsigned((n + 255) / 256), 256, 0, s}, in, out, n);
}
cudaError_t allow_smem(size_t bytes) {
  return cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

}  // namespace qlora::emu_test
