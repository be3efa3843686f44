// Work beside the main stream (prefetched dequantization, activation offload copies): a side
// stream of its own, ordered after everything issued before on the main stream, whose device
// ranges stay pending until the main stream waits for them. Events come from one pool.
#include "backend/cuda/cuda_backend_impl.cuh"

namespace qlora::cuda {

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

cudaStream_t CudaBackend::side_begin(SideStream& side) {
  if (!side.s) QLORA_CUDA_CHECK(cudaStreamCreateWithFlags(&side.s, cudaStreamNonBlocking));
  cudaEvent_t go = take_event();
  QLORA_CUDA_CHECK(cudaEventRecord(go, stream_));
  QLORA_CUDA_CHECK(cudaStreamWaitEvent(side.s, go, 0));
  free_events_.push_back(go);  // a wait binds to the record made before it: reusable at once
  return side.s;
}

void CudaBackend::side_end(SideStream& side, const void* p, int64_t bytes) {
  const char* b = static_cast<const char*>(p);
  const char* e = b + bytes;
  // A pending range this one overlaps is ordered before it on the same stream: waiting for this
  // one waits for both.
  for (size_t i = 0; i < side.pending.size();)
    if (side.pending[i].begin < e && b < side.pending[i].end) {
      free_events_.push_back(side.pending[i].ready);
      side.pending.erase(side.pending.begin() + long(i));
    } else {
      i++;
    }
  cudaEvent_t ready = take_event();
  QLORA_CUDA_CHECK(cudaEventRecord(ready, side.s));
  side.pending.push_back({b, e, ready});
}

void CudaBackend::side_wait(SideStream& side, const void* p, int64_t bytes) {
  const char* b = static_cast<const char*>(p);
  const char* e = b + bytes;
  for (size_t i = 0; i < side.pending.size();)
    if (side.pending[i].begin < e && b < side.pending[i].end) {
      QLORA_CUDA_CHECK(cudaStreamWaitEvent(stream_, side.pending[i].ready, 0));
      free_events_.push_back(side.pending[i].ready);
      side.pending.erase(side.pending.begin() + long(i));
    } else {
      i++;
    }
}

// Work the main stream has waited for is done when the main stream is; only pending work needs
// its side stream synchronized.
void CudaBackend::side_sync(SideStream& side) {
  if (side.pending.empty()) return;
  QLORA_CUDA_CHECK(cudaStreamSynchronize(side.s));
  for (const SideStream::Pending& p : side.pending) free_events_.push_back(p.ready);
  side.pending.clear();
}

void CudaBackend::side_release(SideStream& side) noexcept {
  if (side.s) cudaStreamSynchronize(side.s);
  for (const SideStream::Pending& p : side.pending) cudaEventDestroy(p.ready);
  side.pending.clear();
  if (side.s) cudaStreamDestroy(side.s);
  side.s = nullptr;
}

void CudaBackend::wait_prefetched(const void* p) { side_wait(prefetch_, p, 1); }

}  // namespace qlora::cuda
