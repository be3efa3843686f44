// Activation offload on the GPU: pinned host memory for the plan's host buffers, and copies
// between it and the device on a copy stream of their own, ordered by events. A copy starts after
// the work issued before it (an event on the main stream) and is pending until an offload_wait
// covering its device range makes the main stream wait for it, so the DMA overlaps the layers
// computed in between and the host never blocks.
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "backend/cuda/cuda_backend_impl.cuh"

namespace qlora::cuda {

void* CudaBackend::alloc_host(size_t bytes) {
  void* p = nullptr;
  const size_t n = bytes ? bytes : 256;  // every alloc gets a real block so free_host always matches
  const cudaError_t e = cudaMallocHost(&p, n);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    fail(ErrorKind::Config, "cuda backend alloc_host",
         "out of pinned host memory allocating " + std::to_string(bytes) + " bytes for offloaded activations",
         "lower per_device_train_batch_size or max_length, or use gradient_checkpointing: full");
  }
  QLORA_CUDA_CHECK(e);
  std::memset(p, 0, n);
  return p;
}

// Copies that may still read or write the block finish first; errors surface elsewhere (as free).
void CudaBackend::free_host(void* p) noexcept {
  if (!p) return;
  if (copies_.s) cudaStreamSynchronize(copies_.s);
  cudaFreeHost(p);
}

void CudaBackend::offload_copy(const OffloadCopyArgs& a) {
  const char* op = "offload_copy";
  check_dim(op, "bytes", a.bytes);
  if (a.bytes == 0) return;
  check_ptr(op, "dst", a.dst);
  check_ptr(op, "src", a.src);
  // After everything issued so far on the main stream: the producer of src, the readers of dst.
  QLORA_CUDA_CHECK(cudaMemcpyAsync(a.dst, a.src, size_t(a.bytes),
                                   a.to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, side_begin(copies_)));
  side_end(copies_, a.to_host ? a.src : a.dst, a.bytes);
}

void CudaBackend::offload_wait(const OffloadWaitArgs& a) {
  check_dim("offload_wait", "bytes", a.bytes);
  if (a.bytes == 0) return;
  check_ptr("offload_wait", "p", a.p);
  side_wait(copies_, a.p, a.bytes);
}

}  // namespace qlora::cuda
