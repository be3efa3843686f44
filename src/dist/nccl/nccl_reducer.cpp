// The NCCL DeviceReducer: one grouped ncclAllReduce (or, for FSDP's layer gather, one grouped
// ncclBroadcast per rank) per call on a stream of its own, waited on
// with a deadline (a dead peer makes NCCL wait forever; ncclCommAbort ends that). Built only with
// CUDA and NCCL.
//
// Determinism: NCCL's ring and tree all-reduces compute each element once, on one rank, and pass
// the result on, so every rank gets the same bits; the order is fixed by the algorithm, protocol
// and channel count NCCL picks for the topology and sizes (NCCL_ALGO / NCCL_PROTO pin them).
#include "dist/nccl/nccl_reducer.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <exception>
#include <string>
#include <thread>

#include "core/error.h"

namespace qlora {

namespace {

// NCCL's message for the code, with its last error's detail (ncclGetLastError) when there is one.
void check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::string msg = ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(nullptr); last && *last) msg += std::string(": ") + last;
  const bool misuse = r == ncclInvalidUsage || r == ncclInvalidArgument;
  fail(ErrorKind::Io, std::string("NCCL ") + what, msg,
       misuse ? "every rank needs a GPU of its own (at most as many ranks per node as GPUs; CUDA_VISIBLE_DEVICES, "
                "srun --gpus-per-task) and the same collectives; see docs/distributed.md"
              : "another rank has probably died; see its output");
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(ErrorKind::Io, std::string("CUDA ") + what, cudaGetErrorString(e));
}

class NcclReducer final : public DeviceReducer {
 public:
  NcclReducer(Comm& comm, double timeout_s) : timeout_s_(timeout_s), rank_(comm.rank()), size_(comm.size()) {
    ncclUniqueId id{};
    if (comm.rank() == 0) check_nccl(ncclGetUniqueId(&id), "unique id");
    comm.broadcast(&id, sizeof id, 0);
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    check_nccl(ncclCommInitRank(&nccl_, comm.size(), id, comm.rank()), "communicator");
  }
  ~NcclReducer() override {
    // Unwinding after an error (this rank's or a collective's): the other ranks may never join a
    // flush, so abort rather than destroy (which finalizes, waiting for outstanding operations).
    if (nccl_) std::uncaught_exceptions() > 0 ? ncclCommAbort(nccl_) : ncclCommDestroy(nccl_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  void allreduce_sum(const std::vector<std::pair<float*, size_t>>& bufs) override {
    check_nccl(ncclGroupStart(), "group");
    for (const auto& [p, n] : bufs) check_nccl(ncclAllReduce(p, p, n, ncclFloat32, ncclSum, nccl_, stream_), "all-reduce");
    check_nccl(ncclGroupEnd(), "group");
    wait("all-reduce");
  }

  // One ncclBroadcast per rank, grouped: rank q's share of the shares slice_of(n, q, size) lands
  // at its offset in `full` on every rank. The shares differ by up to a byte, which ncclAllGather's
  // equal counts cannot express without a padded staging buffer of size x max share; the
  // broadcasts write the planned slot directly.
  void allgather_shards(const uint8_t* shard, uint8_t* full, size_t n) override {
    check_nccl(ncclGroupStart(), "group");
    for (int q = 0; q < size_; q++) {
      const Slice s = slice_of(n, q, size_);
      const void* send = q == rank_ ? static_cast<const void*>(shard) : full + s.begin;
      check_nccl(ncclBroadcast(send, full + s.begin, s.count, ncclUint8, q, nccl_, stream_), "all-gather of shards");
    }
    check_nccl(ncclGroupEnd(), "group");
    wait("all-gather of shards");
  }

 private:
  // Until the stream's collectives are done, or the deadline (then the communicator is aborted).
  void wait(const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, what);
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(nccl_, &async), what);
      check_nccl(async, what);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (timeout_s_ > 0 && waited > timeout_s_) {
        ncclCommAbort(nccl_);
        nccl_ = nullptr;
        fail(ErrorKind::Io, std::string("NCCL ") + what,
             "no answer from the other ranks in " + std::to_string(int(timeout_s_)) + " s: a rank has died or hangs",
             "the job stops here; see the other ranks' output (ddp_timeout sets the wait)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  double timeout_s_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  ncclComm_t nccl_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceReducer> make_nccl_reducer(Comm& comm, double timeout_s) {
  return std::make_unique<NcclReducer>(comm, timeout_s);
}

}  // namespace qlora
