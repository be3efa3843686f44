// Comm: the collectives training needs across ranks, as an interface (src/dist/ implements it over
// MPI and NCCL), and the one-process Comm. The model and the trainer see only this.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace qlora {

// A contiguous share of n elements: rank r of w holds [n*r/w, n*(r+1)/w). Shares differ by at most
// one element, so an uneven split (n = 10, w = 3 -> 3, 3, 4) never leaves a rank idle.
struct Slice {
  size_t begin = 0, count = 0;
  size_t end() const { return begin + count; }
};
Slice slice_of(size_t n, int rank, int world);

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // rank among the processes of this node (selects the GPU)
  virtual int local_size() const = 0;
  virtual std::string describe() const = 0;  // "single process", "MPI (Open MPI v4.1.4), 2 ranks on 1 node"
  // The longest a collective waits for the other ranks before it fails; <= 0 waits forever.
  virtual void set_timeout(double seconds) {}

  // Sums over ranks, in place; every rank gets the same bits, and the same run to run (see
  // comm_mpi.cpp: each element is summed in rank order, in double, by one owner rank).
  virtual void allreduce_sum(float* data, size_t n) = 0;
  virtual void allreduce_sum(double* data, size_t n) = 0;
  // The first half of allreduce_sum: afterwards data[slice_of(n, rank, size)] holds the sums of
  // this rank's share (other elements are left as they were).
  virtual void reduce_scatter_sum(float* data, size_t n) = 0;
  // Every rank's share slice_of(n, r, size) of `data` is sent to all: afterwards all of data is
  // whole on every rank.
  virtual void allgather_slices(float* data, size_t n) = 0;
  virtual void allgather_slices(uint8_t* data, size_t n) = 0;
  // The same with blocks of any size: `data` holds one block per rank, back to back, counts[q]
  // elements for rank q. reduce_scatter_blocks leaves the sums over ranks in this rank's block;
  // allgather_blocks gives every rank every block.
  virtual void reduce_scatter_blocks(float* data, const std::vector<size_t>& counts) = 0;
  virtual void allgather_blocks(float* data, const std::vector<size_t>& counts) = 0;
  // FSDP's gather of a sharded blob of n bytes: this rank holds `shard`, its share slice_of(n, rank,
  // size); afterwards `full` (n bytes, not overlapping shard) holds every rank's share in place.
  // One process alone: a copy.
  virtual void allgather_shards(const uint8_t* shard, uint8_t* full, size_t n) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job now (after an error on one rank that the others cannot see).
  [[noreturn]] virtual void abort(int code) = 0;
};

// Collectives on buffers in device memory over the ranks of a Comm (NCCL on GPUs). Each blocks
// until done; fails (never hangs) when a rank stops answering.
class DeviceReducer {
 public:
  virtual ~DeviceReducer() = default;
  // Sums over ranks, in place; every rank gets the same bits.
  virtual void allreduce_sum(const std::vector<std::pair<float*, size_t>>& device_buffers) = 0;
  // Comm::allgather_shards with device pointers: `shard` (this rank's share slice_of(n, rank,
  // size)) is sent to every rank, `full` (n bytes, not overlapping shard) receives every share in place.
  virtual void allgather_shards(const uint8_t* shard, uint8_t* full, size_t n) = 0;
};

// The Comm of one process alone: every collective is the identity (a gather is a copy).
std::unique_ptr<Comm> make_single_comm();

}  // namespace qlora
