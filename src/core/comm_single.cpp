// The single-process Comm (no launcher, no MPI runtime) and the slice arithmetic.
#include <cstdlib>
#include <cstring>

#include "core/comm.h"

namespace qlora {

Slice slice_of(size_t n, int rank, int world) {
  // 128-bit products: n * world must not wrap for the largest buffers (n ~ 1e11 bytes).
  const auto at = [&](int r) { return size_t((unsigned __int128)n * unsigned(r) / unsigned(world)); };
  Slice s;
  s.begin = at(rank);
  s.count = at(rank + 1) - s.begin;
  return s;
}

namespace {

class SingleComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string describe() const override { return "single process"; }
  void allreduce_sum(float*, size_t) override {}
  void allreduce_sum(double*, size_t) override {}
  void reduce_scatter_sum(float*, size_t) override {}
  void allgather_slices(float*, size_t) override {}
  void allgather_slices(uint8_t*, size_t) override {}
  void reduce_scatter_blocks(float*, const std::vector<size_t>&) override {}
  void allgather_blocks(float*, const std::vector<size_t>&) override {}
  void allgather_shards(const uint8_t* shard, uint8_t* full, size_t n) override {
    if (n) std::memcpy(full, shard, n);
  }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

}  // namespace

std::unique_ptr<Comm> make_single_comm() { return std::make_unique<SingleComm>(); }

}  // namespace qlora
