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
  if (copy_) cudaStreamSynchronize(copy_);
  cudaFreeHost(p);
}

cudaEvent_t CudaBackend::take_event() {
  cudaEvent_t e = nullptr;
  if (!free_events_.empty()) {
    e = free_events_.back();
    free_events_.pop_back();
  } else {
    QLORA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  return e;
}

void CudaBackend::offload_copy(const OffloadCopyArgs& a) {
  const char* op = "offload_copy";
  check_dim(op, "bytes", a.bytes);
  if (a.bytes == 0) return;
  check_ptr(op, "dst", a.dst);
  check_ptr(op, "src", a.src);
  if (!copy_) QLORA_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  // After everything issued so far on the main stream: the producer of src, the readers of dst.
  cudaEvent_t go = take_event();
  QLORA_CUDA_CHECK(cudaEventRecord(go, stream_));
  QLORA_CUDA_CHECK(cudaStreamWaitEvent(copy_, go, 0));
  free_events_.push_back(go);  // a wait binds to the record made before it: reusable at once
  QLORA_CUDA_CHECK(cudaMemcpyAsync(a.dst, a.src, size_t(a.bytes),
                                   a.to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, copy_));
  const char* b = static_cast<const char*>(a.to_host ? a.src : a.dst);
  const char* e = b + a.bytes;
  // A pending copy of an overlapping range is ordered before this one on copy_: waiting for this
  // one waits for both.
  for (size_t i = 0; i < copies_.size();)
    if (copies_[i].begin < e && b < copies_[i].end) {
      free_events_.push_back(copies_[i].ready);
      copies_.erase(copies_.begin() + long(i));
    } else {
      i++;
    }
  cudaEvent_t ready = take_event();
  QLORA_CUDA_CHECK(cudaEventRecord(ready, copy_));
  copies_.push_back({b, e, ready});
}

void CudaBackend::offload_wait(const OffloadWaitArgs& a) {
  check_dim("offload_wait", "bytes", a.bytes);
  if (a.bytes == 0) return;
  check_ptr("offload_wait", "p", a.p);
  const char* b = static_cast<const char*>(a.p);
  const char* e = b + a.bytes;
  for (size_t i = 0; i < copies_.size();)
    if (copies_[i].begin < e && b < copies_[i].end) {
      QLORA_CUDA_CHECK(cudaStreamWaitEvent(stream_, copies_[i].ready, 0));
      free_events_.push_back(copies_[i].ready);
      copies_.erase(copies_.begin() + long(i));
    } else {
      i++;
    }
}

}  // namespace qlora::cuda
