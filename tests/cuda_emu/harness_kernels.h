// Launchers of the harness self-test kernels (harness_kernels.cu). Pointers are device memory.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace qlora::emu_test {

void handoff(float* out, bool with_barrier);                        // out[32]
void block_sum(double* out, int blocks);                            // out[blocks]
void cp_async_roundtrip(const float* in, float* out, bool wait);    // in[128], out[128]
void smem_overflow(const float* in);                                // in[4]
void deadlock(float* out);                                          // out[32]
void early_exit_shuffle(float* out);                                // out[32]
void empty(unsigned threads, size_t smem);
cudaError_t allow_smem(size_t bytes);  // cudaFuncSetAttribute(MaxDynamicSharedMemorySize) of empty's kernel

}  // namespace qlora::emu_test
