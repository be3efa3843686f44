// The MPI Comm: started only under a launcher; every collective is non-blocking and waited on with
// a deadline, so a dead or hung rank turns into an error instead of a hang.
//
// Determinism: MPI_Allreduce may sum in an order that depends on the algorithm Open MPI picks (by
// message size and world size) and need not give every rank the same bits. Training needs both:
// ranks that disagree by one ulp drift apart, and a rerun must repeat. So the sum is built from
// MPI_Alltoallv + MPI_Allgatherv, which only move bytes: rank r receives every rank's copy of its
// share slice_of(n, r, w), adds them in rank order 0..w-1 in double, rounds once, and sends the
// share to all. The wire volume is that of a ring all-reduce, 2 (w-1)/w x n elements per rank.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <ctime>

#include "core/error.h"
#include "dist/comm.h"

namespace qlora {

namespace {

class MpiComm final : public Comm {
 public:
  MpiComm(double timeout_s, std::string launcher) : timeout_s_(timeout_s), launcher_(std::move(launcher)) {
    int provided = 0;
    // FUNNELED: only the main thread calls MPI (OpenMP workers never do).
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      fail(ErrorKind::Io, "MPI_Init", "the MPI runtime did not start under " + launcher_,
           "under srun, pass --mpi=pmix (or the plugin your Open MPI was built with)");
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm node;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
    double leaders = local_rank_ == 0 ? 1.0 : 0.0;
    allreduce_sum(&leaders, 1);
    nodes_ = int(leaders);
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(ver, &len);
    library_.assign(ver, size_t(len));
    if (auto cut = library_.find_first_of(",\n"); cut != std::string::npos) library_.resize(cut);
  }
  ~MpiComm() override {
    MPI_Comm_free(&comm_);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  void set_timeout(double seconds) override { timeout_s_ = seconds; }
  std::string describe() const override {
    return "MPI (" + library_ + ", via " + launcher_ + "), " + std::to_string(size_) + " ranks on " +
           std::to_string(nodes_) + (nodes_ == 1 ? " node" : " nodes");
  }

  void allreduce_sum(float* data, size_t n) override {
    reduce_scatter(data, even_blocks(n), MPI_FLOAT);
    allgather(data, even_blocks(n), MPI_FLOAT);
  }
  void allreduce_sum(double* data, size_t n) override {
    reduce_scatter(data, even_blocks(n), MPI_DOUBLE);
    allgather(data, even_blocks(n), MPI_DOUBLE);
  }
  void reduce_scatter_sum(float* data, size_t n) override { reduce_scatter(data, even_blocks(n), MPI_FLOAT); }
  void allgather_slices(float* data, size_t n) override { allgather(data, even_blocks(n), MPI_FLOAT); }
  void allgather_slices(uint8_t* data, size_t n) override { allgather(data, even_blocks(n), MPI_BYTE); }
  void reduce_scatter_blocks(float* data, const std::vector<size_t>& counts) override {
    reduce_scatter(data, blocks(counts), MPI_FLOAT);
  }
  void allgather_blocks(float* data, const std::vector<size_t>& counts) override {
    allgather(data, blocks(counts), MPI_FLOAT);
  }

  void allgather_shards(const uint8_t* shard, uint8_t* full, size_t n) override {
    const std::vector<Slice> blk = even_blocks(n);
    std::vector<int> count(size_), displ(size_);
    for (int q = 0; q < size_; q++) {
      count[size_t(q)] = count_int(blk[size_t(q)].count);
      displ[size_t(q)] = count_int(blk[size_t(q)].begin);
    }
    MPI_Request req;
    check(MPI_Iallgatherv(shard, count[size_t(rank_)], MPI_BYTE, full, count.data(), displ.data(), MPI_BYTE, comm_, &req),
          "all-gather");
    wait(req, "all-gather");
  }

  void broadcast(void* data, size_t bytes, int root) override {
    MPI_Request req;
    check(MPI_Ibcast(data, count_int(bytes), MPI_BYTE, root, comm_, &req), "broadcast");
    wait(req, "broadcast");
  }
  void barrier() override {
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "barrier");
    wait(req, "barrier");
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  std::vector<Slice> even_blocks(size_t n) const {
    std::vector<Slice> b(static_cast<size_t>(size_));
    for (int q = 0; q < size_; q++) b[size_t(q)] = slice_of(n, q, size_);
    return b;
  }
  std::vector<Slice> blocks(const std::vector<size_t>& counts) const {
    if (counts.size() != size_t(size_))
      fail(ErrorKind::Internal, "MPI collective", std::to_string(counts.size()) + " block sizes for " + std::to_string(size_) + " ranks");
    std::vector<Slice> b(static_cast<size_t>(size_));
    size_t at = 0;
    for (int q = 0; q < size_; q++) {
      b[size_t(q)] = {at, counts[size_t(q)]};
      at += counts[size_t(q)];
    }
    return b;
  }

  template <typename T>
  void reduce_scatter(T* data, const std::vector<Slice>& blk, MPI_Datatype type) {
    const int w = size_;
    const Slice mine = blk[size_t(rank_)];
    std::vector<int> scount(w), sdispl(w), rcount(w), rdispl(w);
    for (int q = 0; q < w; q++) {
      scount[size_t(q)] = count_int(blk[size_t(q)].count);
      sdispl[size_t(q)] = count_int(blk[size_t(q)].begin);
      rcount[size_t(q)] = count_int(mine.count);
      rdispl[size_t(q)] = count_int(size_t(q) * mine.count);
    }
    std::vector<T> recv(size_t(w) * mine.count);  // (w, share): every rank's copy of my share
    MPI_Request req;
    check(MPI_Ialltoallv(data, scount.data(), sdispl.data(), type, recv.data(), rcount.data(), rdispl.data(), type,
                         comm_, &req),
          "all-reduce");
    wait(req, "all-reduce");
    for (size_t i = 0; i < mine.count; i++) {
      double s = 0;
      for (int q = 0; q < w; q++) s += double(recv[size_t(q) * mine.count + i]);  // rank order, always
      data[mine.begin + i] = T(s);
    }
  }

  template <typename T>
  void allgather(T* data, const std::vector<Slice>& blk, MPI_Datatype type) {
    std::vector<int> count(size_), displ(size_);
    for (int q = 0; q < size_; q++) {
      count[size_t(q)] = count_int(blk[size_t(q)].count);
      displ[size_t(q)] = count_int(blk[size_t(q)].begin);
    }
    MPI_Request req;
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, type, data, count.data(), displ.data(), type, comm_, &req), "all-gather");
    wait(req, "all-gather");
  }

  static int count_int(size_t n) {
    if (n > size_t(INT_MAX))
      fail(ErrorKind::Unsupported, "MPI collective", std::to_string(n) + " elements exceed MPI's int count",
           "use more ranks or smaller layers");
    return int(n);
  }

  void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fail(ErrorKind::Io, std::string("MPI ") + what, "failed: " + std::string(msg, size_t(len)),
         "another rank has probably died; see its output");
  }

  // Polls instead of blocking so the wait has a deadline; short sleeps between polls leave the CPU
  // to ranks that share it (oversubscribed runs, rank 0 writing a checkpoint).
  void wait(MPI_Request& req, const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    int done = 0;
    for (int polls = 0;; polls++) {
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (polls < 200) continue;
      const timespec nap{0, 20000};  // 20 us
      nanosleep(&nap, nullptr);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (timeout_s_ > 0 && waited > timeout_s_)
        fail(ErrorKind::Io, std::string("MPI ") + what,
             "no answer from the other ranks in " + std::to_string(int(timeout_s_)) + " s: a rank has died or hangs",
             "the job stops here; see the other ranks' output (ddp_timeout sets the wait)");
    }
  }

  double timeout_s_;
  std::string launcher_, library_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, nodes_ = 1;
};

}  // namespace

std::unique_ptr<Comm> make_comm(double timeout_s) {
  const std::string launcher = detect_launcher();
  if (launcher.empty()) return make_single_comm();
  return std::make_unique<MpiComm>(timeout_s, launcher);
}

}  // namespace qlora
