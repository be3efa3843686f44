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
void mma_known_answer(float* d_out);                   // d_out[16 * 8]: one mma16816 from the ISA's tables
void ldmatrix_known_answer(float* out, bool trans);    // out[32 * 8]: each lane's 4 registers of ldsm_x4(_t)
void static_shared(float* out, int blocks);                   // out[blocks]: block 0 wrote 7, the rest read theirs
void block_order(int* counter, int* starts, int* ends, int blocks);  // tickets at each block's start and after a barrier
void handshake(int* flags, int* seen);                        // flags[2] = 0 before; seen[2]: the other block's flag
void fill(float* out, int n, float v, cudaStream_t s);                  // out[n] = v
void add_one(const float* in, float* out, int n, cudaStream_t s);       // out[n] = in[n] + 1

}  // namespace qlora::emu_test
