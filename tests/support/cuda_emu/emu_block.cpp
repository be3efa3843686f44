// The host harness's block executor: runs a kernel launch block by block, each CUDA thread as a
// fiber (fast mode) or an OS thread (sanitizer mode), with __syncthreads and warp collectives as
// barriers, and the PTX the attention kernels use (cp.async, ldmatrix, mma.m16n8k16) emulated from
// the PTX ISA's definitions.
//
// Fiber mode runs a block's threads on one OS thread, switching at every barrier; it is fast and
// deterministic. Sanitizer mode gives every CUDA thread its own OS thread and synchronizes them
// with a mutex and condition variables, so ThreadSanitizer sees exactly the happens-before edges
// the kernel's barriers create (a race between warps is a report) and AddressSanitizer sees every
// shared and global access against exact-size allocations. Builds with a sanitizer use sanitizer
// mode; QLORA_CUDA_EMU_MODE=threads|fibers overrides.
#include <boost/context/fiber.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu/cuda_emu.h"
#include "cuda_emu/emu_runtime.h"

namespace qlora::emu {
namespace {

namespace ctx = boost::context;

// GCC's ThreadSanitizer instrumentation skips 16-byte accesses (a vector memcpy/memset of 16
// bytes is invisible to it), so the harness reports its own shared-memory traffic explicitly.
#if defined(__SANITIZE_THREAD__)
void tsan_write(const void* p, size_t n) { __tsan_write_range(const_cast<void*>(p), long(n)); }
void tsan_read(const void* p, size_t n) { __tsan_read_range(const_cast<void*>(p), long(n)); }
#else
void tsan_write(const void*, size_t) {}
void tsan_read(const void*, size_t) {}
#endif

std::atomic<int> g_mode_override{-1};  // set_os_threads_for_tests: -1 none, 0 fibers, 1 threads

bool use_os_threads() {
  static const bool v = [] {
    const char* m = std::getenv("QLORA_CUDA_EMU_MODE");
    // Sanitizers need each CUDA thread on its own stack and OS thread (no fiber switching).
    return kSanitizerBuild || (m && std::string(m) == "threads");
  }();
  const int o = g_mode_override.load(std::memory_order_relaxed);
  return o < 0 ? v : o == 1;
}

// A harness-detected error inside device code; unwinds the CUDA thread that found it.
struct Fault {
  cudaError_t code;
  std::string what;
};
// Unwinds the other threads of a block once one of them faulted.
struct Abort {};

struct Copy {
  unsigned char* dst;
  const unsigned char* src;
  int bytes;
};

constexpr int kWords = 12;  // per-lane payload words of a warp collective

struct Block;
struct Thread {
  Block* b = nullptr;
  uint3 tid{};
  int linear = 0, lane = 0, warp = 0;
  bool done = false;
  bool waiting = false;
  int phase = 0;                  // parity of this lane's warp collectives
  std::vector<Copy> pending;      // issued cp.async copies, oldest first
  std::vector<size_t> group_end;  // committed groups: end index into `pending`
  ctx::fiber fib;                 // fiber mode: the thread's context
  ctx::fiber sink;                // fiber mode: the scheduler's context while the thread runs
};

// Sanitizer mode locks: each warp's collectives use the warp's own mutex and __syncthreads the
// block's, so the only happens-before edges between warps are the kernel's own barriers (one
// block-wide mutex for everything would order every access and hide every race from TSan).
// Counters read across those locks (live, waiting, aborted) are relaxed atomics: no edges.
struct Warp {
  unsigned live_mask = 0;  // lanes that exist and have not exited
  int arrived = 0;
  unsigned gen = 0;
  unsigned mask[2]{};  // the mask each phase was called with (all lanes must agree)
  uint32_t in[2][32][kWords]{};
  uint32_t out[2][32][kWords]{};
  void (*leader[2])(Warp&, int) = {nullptr, nullptr};
  const struct Block* block = nullptr;
  int os_waiters = 0;  // sanitizer mode: lanes blocked in this warp's collective
  std::mutex mu;
  std::condition_variable cv;
};

struct Block {
  dim3 dim, grid;
  uint3 idx{};
  int n = 0, arrived = 0, n_warps = 0;
  std::atomic<int> live{0}, waiting{0};
  int os_waiters = 0;  // sanitizer mode: threads blocked at __syncthreads
  unsigned gen = 0;
  unsigned char* smem = nullptr;
  size_t smem_bytes = 0;
  std::vector<Thread> threads;
  std::unique_ptr<Warp[]> warps;
  std::atomic<bool> aborted{false};
  std::mutex fault_mu;
  Fault first{};
  const char* kernel = "";
  std::mutex mu;  // sanitizer mode: __syncthreads
  std::condition_variable cv;
  // Static __shared__ variables (QLORA_SHARED): one exact-size allocation per site and block,
  // made on the first thread's declaration and poisoned with NaN bits, as shared memory starts
  // undefined on the device. The lock is taken only at declarations (kernel tops), so the
  // happens-before edges it makes order nothing a thread did before.
  std::mutex statics_mu;
  std::vector<std::pair<int, std::unique_ptr<unsigned char, void (*)(void*)>>> statics;
  // The device allocations as the launch saw them (immutable while the grid runs, so device code
  // checks addresses without the runtime's lock, which would order the threads for TSan).
  const DeviceRanges* ranges = nullptr;
  std::unique_ptr<unsigned char, void (*)(void*)> smem_owner{nullptr, std::free};
};

constexpr auto kRelaxed = std::memory_order_relaxed;

thread_local Thread* t_cur = nullptr;

Thread& cur() {
  if (!t_cur) {
    std::fprintf(stderr, "qlora CUDA harness: device code called outside a kernel launch\n");
    std::abort();
  }
  return *t_cur;
}

[[noreturn]] void raise(cudaError_t code, const std::string& what) {
  const Thread& t = cur();
  throw Fault{code, what + " (block " + std::to_string(t.b->idx.x) + "," + std::to_string(t.b->idx.y) + "," +
                        std::to_string(t.b->idx.z) + ", thread " + std::to_string(t.tid.x) + "," +
                        std::to_string(t.tid.y) + "," + std::to_string(t.tid.z) + ")"};
}

// Records the block's first fault and wakes every waiting thread so that it unwinds. Called with
// no harness lock held.
void abort_block(Block& b, const Fault& f) {
  {
    std::lock_guard<std::mutex> lk(b.fault_mu);
    if (b.aborted.load(kRelaxed)) return;
    b.first = f;
    b.aborted.store(true, kRelaxed);
  }
  if (!use_os_threads()) return;
  for (int i = 0; i < b.n_warps; i++) {
    std::lock_guard<std::mutex> lk(b.warps[i].mu);
    b.warps[i].cv.notify_all();
  }
  std::lock_guard<std::mutex> lk(b.mu);
  b.cv.notify_all();
}

Fault deadlock_fault(const Block& b) {
  return Fault{cudaErrorLaunchFailure, std::string("deadlock in ") + b.kernel +
                                           ": every thread waits, at different barriers (a __syncthreads or warp "
                                           "collective not reached by all threads)"};
}

// Fiber mode: back to the scheduler until released.
void suspend(Thread& t) {
  t.waiting = true;
  t.b->waiting.fetch_add(1, kRelaxed);
  t.sink = std::move(t.sink).resume();
  if (t.b->aborted.load(kRelaxed)) throw Abort{};
}

// Caller holds the barrier's lock (sanitizer mode). Waiters are uncounted here, before they wake,
// so the deadlock check never sees a released thread as waiting.
void release_block(Block& b) {
  b.arrived = 0;
  b.gen++;
  b.waiting.fetch_sub(b.os_waiters, kRelaxed);
  b.os_waiters = 0;
  if (!use_os_threads())
    for (auto& t : b.threads)
      if (t.waiting && !t.done) {
        t.waiting = false;
        b.waiting.fetch_sub(1, kRelaxed);
      }
}

void release_warp(Block& b, Warp& w, int warp) {
  w.arrived = 0;
  w.gen++;
  b.waiting.fetch_sub(w.os_waiters, kRelaxed);
  w.os_waiters = 0;
  if (!use_os_threads())
    for (int l = 0; l < 32; l++) {
      const int i = warp * 32 + l;
      if (i < b.n && b.threads[size_t(i)].waiting && !b.threads[size_t(i)].done) {
        b.threads[size_t(i)].waiting = false;
        b.waiting.fetch_sub(1, kRelaxed);
      }
    }
}

// Sanitizer mode: wait on `cv` (its lock held in `lk`) until `gen` moves past `seen`. Every
// 50 ms a waiter checks whether every live thread of the block waits: a deadlock.
void os_wait(Block& b, std::unique_lock<std::mutex>& lk, std::condition_variable& cv, const unsigned& gen,
             unsigned seen, int& waiters) {
  b.waiting.fetch_add(1, kRelaxed);
  waiters++;
  while (gen == seen && !b.aborted.load(kRelaxed)) {
    if (cv.wait_for(lk, std::chrono::milliseconds(50)) == std::cv_status::timeout && gen == seen &&
        b.waiting.load(kRelaxed) >= b.live.load(kRelaxed)) {
      lk.unlock();
      abort_block(b, deadlock_fault(b));
      lk.lock();
    }
  }
  if (gen == seen) throw Abort{};
}

unsigned lane_bit(int lane) { return 1u << lane; }

// One warp collective: deposit `in`, wait for every lane of the warp, the last lane to arrive runs
// `leader`, then each lane takes its `out`.
const uint32_t* collective(unsigned mask, const uint32_t* in, int nin, void (*leader)(Warp&, int)) {
  Thread& t = cur();
  Block& b = *t.b;
  Warp& w = b.warps[t.warp];
  const int ph = t.phase;
  t.phase ^= 1;
  auto body = [&]() -> bool {  // true when this lane completed the collective
    if (!(mask & lane_bit(t.lane))) raise(cudaErrorLaunchFailure, "warp collective called by a lane its mask leaves out");
    if ((mask & w.live_mask) != mask) {
      const unsigned missing = mask & ~w.live_mask;
      raise(cudaErrorLaunchFailure, "warp collective's mask names lane " + std::to_string(__builtin_ctz(missing)) +
                                        ", which does not exist or has exited (undefined on the device)");
    }
    if (w.arrived == 0) {
      w.mask[ph] = mask;
      w.leader[ph] = leader;
    } else if (w.mask[ph] != mask || w.leader[ph] != leader) {
      raise(cudaErrorLaunchFailure, "lanes of one warp are in different collectives (divergent warp)");
    }
    std::memcpy(w.in[ph][t.lane], in, sizeof(uint32_t) * size_t(nin));
    if (++w.arrived == __builtin_popcount(mask)) {
      if (leader) leader(w, ph);
      release_warp(b, w, t.warp);
      return true;
    }
    return false;
  };
  if (use_os_threads()) {
    std::unique_lock<std::mutex> lk(w.mu);
    if (b.aborted.load(kRelaxed)) throw Abort{};
    const unsigned seen = w.gen;
    if (body())
      w.cv.notify_all();
    else
      os_wait(b, lk, w.cv, w.gen, seen, w.os_waiters);
  } else {
    if (!body()) suspend(t);
  }
  return w.out[ph][t.lane];
}

void leader_shfl(Warp& w, int ph) {
  for (int l = 0; l < 32; l++) {
    if (!(w.mask[ph] & lane_bit(l))) continue;
    const int src = int(w.in[ph][l][2]);
    if (src < 0 || src >= 32 || !(w.mask[ph] & lane_bit(src))) {
      // Reading a lane outside the mask is undefined on the device; the harness returns NaN bits.
      w.out[ph][l][0] = w.out[ph][l][1] = 0xffffffffu;
    } else {
      w.out[ph][l][0] = w.in[ph][src][0];
      w.out[ph][l][1] = w.in[ph][src][1];
    }
  }
}

float bf_lo(uint32_t r) { return std::bit_cast<float>(r << 16); }
float bf_hi(uint32_t r) { return std::bit_cast<float>(r & 0xffff0000u); }

// mma.m16n8k16.row.col.f32.bf16.bf16.f32, fragments as the PTX ISA lays them out (lane = 4g + q):
// A: a0 = A[g][2q,2q+1], a1 = A[g+8][2q,2q+1], a2 = A[g][2q+8,2q+9], a3 = A[g+8][2q+8,2q+9]
// B: b0 = B[2q,2q+1][g], b1 = B[2q+8,2q+9][g];  C/D: c0,c1 = C[g][2q,2q+1], c2,c3 = C[g+8][2q,2q+1]
// Payload per lane: a0..a3, b0, b1, c0..c3 (floats as bits).
void leader_mma(Warp& w, int ph) {
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; l++) {
    const int g = l >> 2, q = l & 3;
    const uint32_t* in = w.in[ph][l];
    A[g][2 * q] = bf_lo(in[0]), A[g][2 * q + 1] = bf_hi(in[0]);
    A[g + 8][2 * q] = bf_lo(in[1]), A[g + 8][2 * q + 1] = bf_hi(in[1]);
    A[g][2 * q + 8] = bf_lo(in[2]), A[g][2 * q + 9] = bf_hi(in[2]);
    A[g + 8][2 * q + 8] = bf_lo(in[3]), A[g + 8][2 * q + 9] = bf_hi(in[3]);
    B[2 * q][g] = bf_lo(in[4]), B[2 * q + 1][g] = bf_hi(in[4]);
    B[2 * q + 8][g] = bf_lo(in[5]), B[2 * q + 9][g] = bf_hi(in[5]);
    C[g][2 * q] = std::bit_cast<float>(in[6]), C[g][2 * q + 1] = std::bit_cast<float>(in[7]);
    C[g + 8][2 * q] = std::bit_cast<float>(in[8]), C[g + 8][2 * q + 1] = std::bit_cast<float>(in[9]);
  }
  for (int l = 0; l < 32; l++) {
    const int g = l >> 2, q = l & 3;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * q, 2 * q + 1, 2 * q, 2 * q + 1};
    for (int e = 0; e < 4; e++) {
      float acc = 0.f;  // products of bf16 are exact in f32; the sum is accumulated in k order
      for (int k = 0; k < 16; k++) acc += A[rows[e]][k] * B[k][cols[e]];
      w.out[ph][l][e] = std::bit_cast<uint32_t>(acc + C[rows[e]][cols[e]]);
    }
  }
}

// Shared-window offsets to pointers: the window is the block's dynamic shared memory.
unsigned char* smem_at(const Block& b, uint32_t addr, size_t bytes, const char* what, size_t align) {
  if (size_t(addr) + bytes > b.smem_bytes)
    throw Fault{cudaErrorIllegalAddress, std::string(what) + " at shared offset " + std::to_string(addr) + " (+" +
                                             std::to_string(bytes) + " bytes) is outside the block's " +
                                             std::to_string(b.smem_bytes) + " bytes of dynamic shared memory in " +
                                             b.kernel};
  if (addr % align)
    throw Fault{cudaErrorMisalignedAddress,
                std::string(what) + " at shared offset " + std::to_string(addr) + " is not " + std::to_string(align) +
                    "-byte aligned in " + b.kernel};
  return b.smem + addr;
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8j..8j+7 give the row addresses of
// matrix j; lane l receives in register j the pair (row l/4, columns 2(l%4), 2(l%4)+1) of matrix j,
// or with .trans the pair (rows 2(l%4), 2(l%4)+1, column l/4). Payload: address, trans flag;
// the leader reads the rows (it runs on behalf of the whole warp).
void leader_ldmatrix(Warp& w, int ph) {
  uint16_t m[4][8][8];
  const Block& b = *w.block;
  for (int j = 0; j < 4; j++)
    for (int i = 0; i < 8; i++) {
      const unsigned char* row = smem_at(b, w.in[ph][8 * j + i][0], 16, "ldmatrix row", 16);
      tsan_read(row, 16);
      std::memcpy(m[j][i], row, 16);
    }
  for (int l = 0; l < 32; l++) {
    const bool trans = w.in[ph][l][1] != 0;
    for (int j = 0; j < 4; j++) {
      const int r = l >> 2, c = 2 * (l & 3);
      const uint16_t lo = trans ? m[j][c][r] : m[j][r][c];
      const uint16_t hi = trans ? m[j][c + 1][r] : m[j][r][c + 1];
      w.out[ph][l][j] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  }
}

void complete_copies(Thread& t, size_t upto) {
  for (size_t i = 0; i < upto; i++) {
    const Copy& c = t.pending[i];
    tsan_write(c.dst, 16);
    if (c.bytes > 0) tsan_read(c.src, size_t(c.bytes));
    if (c.bytes > 0) std::memcpy(c.dst, c.src, size_t(c.bytes));
    if (c.bytes < 16) std::memset(c.dst + c.bytes, 0, size_t(16 - c.bytes));
  }
  t.pending.erase(t.pending.begin(), t.pending.begin() + std::ptrdiff_t(upto));
}

void thread_exit(Thread& t) {
  Block& b = *t.b;
  Warp& w = b.warps[t.warp];
  t.done = true;
  bool orphaned;  // a lane exits while its warp waits for it in a collective
  {
    std::unique_lock<std::mutex> lk(w.mu, std::defer_lock);
    if (use_os_threads()) lk.lock();
    w.live_mask &= ~lane_bit(t.lane);
    orphaned = w.arrived > 0;
  }
  if (orphaned)
    abort_block(b, Fault{cudaErrorLaunchFailure, std::string("thread ") + std::to_string(t.linear) + " of " +
                                                     b.kernel + " exited while its warp waits in a collective"});
  std::unique_lock<std::mutex> lk(b.mu, std::defer_lock);
  if (use_os_threads()) lk.lock();
  b.live.fetch_sub(1, kRelaxed);
  // Exited threads count as arrived at __syncthreads, as on the device.
  if (b.arrived > 0 && b.arrived == b.live.load(kRelaxed)) {
    release_block(b);
    b.cv.notify_all();
  }
}

void run_thread(Thread& t, const std::function<void()>& body) {
  t_cur = &t;
  try {
    body();
    if (!t.pending.empty())
      raise(cudaErrorLaunchFailure, std::to_string(t.pending.size()) +
                                        " cp.async copies issued but never waited for (cp.async.wait_group)");
  } catch (const Fault& f) {
    abort_block(*t.b, f);
  } catch (const Abort&) {
  } catch (const ctx::detail::forced_unwind&) {
    throw;  // fiber mode: the scheduler unwinds a fiber it destroys
  } catch (const std::exception& e) {
    abort_block(*t.b, Fault{cudaErrorLaunchFailure, std::string("exception in device code: ") + e.what()});
  }
  thread_exit(t);
  t_cur = nullptr;
}

ctx::pooled_fixedsize_stack& stacks() {
  static ctx::pooled_fixedsize_stack s(256 * 1024);
  return s;
}

void start_fibers(Block& b, const std::function<void()>& body) {
  for (auto& t : b.threads) {
    Thread* tp = &t;
    t.fib = ctx::fiber(std::allocator_arg, stacks(), [tp, &body](ctx::fiber&& sink) {
      tp->sink = std::move(sink);
      run_thread(*tp, body);
      return std::move(tp->sink);
    });
  }
}

// One scheduling round of a block in fiber mode: each warp runs as far as it can (until every lane
// waits at __syncthreads or has exited) before the next warp starts, in warp order on even blocks
// and in reverse on odd ones. That is a legal schedule with the most skew between warps, so a
// missing barrier shows up: a warp that runs ahead overwrites (cp.async poisons with NaN) or reads
// shared data the others have not finished with or written yet. False once every thread exited.
bool step_fibers(Block& b) {
  const int n_warps = b.n_warps;
  const bool reverse = ((b.idx.x + b.idx.y + b.idx.z) & 1) != 0;
  bool ran = false, alive = false;
  for (int wi = 0; wi < n_warps; wi++) {
    const int w = reverse ? n_warps - 1 - wi : wi;
    for (bool progress = true; progress;) {
      progress = false;
      for (int l = 0; l < 32; l++) {
        const int i = w * 32 + l;
        if (i >= b.n) break;
        Thread& t = b.threads[size_t(i)];
        if (t.done) continue;
        alive = true;
        if (t.waiting && !b.aborted.load(kRelaxed)) continue;
        if (t.waiting) {  // aborted: wake it so it unwinds
          t.waiting = false;
          b.waiting.fetch_sub(1, kRelaxed);
        }
        ran = progress = true;
        t_cur = &t;
        t.fib = std::move(t.fib).resume();
        t_cur = nullptr;
      }
    }
  }
  if (alive && !ran) abort_block(b, deadlock_fault(b));
  return alive;
}

// Sanitizer mode: every CUDA thread of the blocks in flight runs on its own pool thread. The pool
// persists across launches (creating OS threads per block would dominate the run time). Each
// worker has its own lock, taken only by it and the launching thread, so the pool makes
// happens-before edges between the launcher and each worker and none between two workers: the
// threads of concurrent blocks are ordered only by what the kernel itself does (its atomics), and
// ThreadSanitizer reports two blocks that touch one address without them.
class ThreadPool {
 public:
  ~ThreadPool() {
    for (auto& w : workers_) {
      {
        std::lock_guard<std::mutex> lk(w->mu);
        w->stop = true;
      }
      w->cv.notify_all();
      w->th.join();
    }
  }
  // Runs every thread of `blocks` at once and returns when all have exited.
  void run(const std::vector<Block*>& blocks, const std::function<void()>& body) {
    size_t k = 0;
    for (Block* b : blocks)
      for (auto& t : b->threads) {
        if (k == workers_.size()) {
          workers_.push_back(std::make_unique<Worker>());
          Worker* w = workers_.back().get();
          w->th = std::thread([w] { work(*w); });
        }
        Worker& w = *workers_[k++];
        {
          std::lock_guard<std::mutex> lk(w.mu);
          w.job = &t;
          w.body = &body;
          w.done = false;
        }
        w.cv.notify_all();
      }
    for (size_t i = 0; i < k; i++) {
      Worker& w = *workers_[i];
      std::unique_lock<std::mutex> lk(w.mu);
      w.cv.wait(lk, [&] { return w.done; });
    }
  }

 private:
  struct Worker {
    std::thread th;
    std::mutex mu;
    std::condition_variable cv;
    Thread* job = nullptr;
    const std::function<void()>* body = nullptr;
    bool done = false, stop = false;
  };
  static void work(Worker& w) {
    std::unique_lock<std::mutex> lk(w.mu);
    for (;;) {
      w.cv.wait(lk, [&] { return w.stop || w.job; });
      if (w.stop) return;
      Thread* t = w.job;
      const std::function<void()>* body = w.body;
      lk.unlock();
      run_thread(*t, *body);
      lk.lock();
      w.job = nullptr;
      w.done = true;
      w.cv.notify_all();
    }
  }
  std::vector<std::unique_ptr<Worker>> workers_;
};

ThreadPool& pool() {
  static ThreadPool p;
  return p;
}

}  // namespace

bool os_threads_mode() { return use_os_threads(); }
void set_os_threads_for_tests(int mode) { g_mode_override.store(mode, std::memory_order_relaxed); }

const uint3& thread_idx() { return cur().tid; }
const uint3& block_idx() { return cur().b->idx; }
const dim3& block_dim() { return cur().b->dim; }
const dim3& grid_dim() { return cur().b->grid; }
int lane_id() { return cur().lane; }
unsigned char* dynamic_smem() { return cur().b->smem; }

int static_smem_site() {
  static std::atomic<int> n{0};
  return n.fetch_add(1);
}

void* static_smem(int site, size_t bytes) {
  Block& b = *cur().b;
  std::lock_guard<std::mutex> lk(b.statics_mu);
  for (auto& [s, p] : b.statics)
    if (s == site) return p.get();
  auto* m = static_cast<unsigned char*>(std::malloc(bytes ? bytes : 1));
  if (!m) raise(cudaErrorMemoryAllocation, "no host memory for a block's static shared variable");
  std::memset(m, 0xff, bytes);  // undefined until written: NaN bits, as dynamic shared memory
  b.statics.emplace_back(site, std::unique_ptr<unsigned char, void (*)(void*)>(m, std::free));
  return m;
}

void syncthreads() {
  Thread& t = cur();
  Block& b = *t.b;
  if (use_os_threads()) {
    std::unique_lock<std::mutex> lk(b.mu);
    if (b.aborted.load(kRelaxed)) throw Abort{};
    const unsigned seen = b.gen;
    if (++b.arrived == b.live.load(kRelaxed)) {
      release_block(b);
      b.cv.notify_all();
    } else {
      os_wait(b, lk, b.cv, b.gen, seen, b.os_waiters);
    }
  } else {
    if (++b.arrived == b.live.load(kRelaxed))
      release_block(b);
    else
      suspend(t);
  }
}

void syncwarp(unsigned mask) { collective(mask, nullptr, 0, nullptr); }

uint64_t warp_exchange(unsigned mask, uint64_t mine, int src_lane) {
  const uint32_t in[3] = {uint32_t(mine), uint32_t(mine >> 32), uint32_t(src_lane)};
  const uint32_t* out = collective(mask, in, 3, leader_shfl);
  return uint64_t(out[0]) | (uint64_t(out[1]) << 32);
}

uint32_t cvta_shared(const void* p) {
  const Block& b = *cur().b;
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < b.smem || c > b.smem + b.smem_bytes)
    raise(cudaErrorIllegalAddress, "__cvta_generic_to_shared of a pointer outside the block's dynamic shared memory");
  return uint32_t(c - b.smem);
}

void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  Thread& t = cur();
  if (src_bytes < 0 || src_bytes > 16) raise(cudaErrorLaunchFailure, "cp.async src-size outside [0, 16]");
  unsigned char* d;
  try {
    d = smem_at(*t.b, dst, 16, "cp.async destination", 16);
  } catch (Fault& f) {
    raise(f.code, f.what);
  }
  if (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % 16)
    raise(cudaErrorMisalignedAddress, "cp.async 16-byte source not 16-byte aligned");
  if (src_bytes > 0 && !t.b->ranges->contains(src, size_t(src_bytes)))
    raise(cudaErrorIllegalAddress, "cp.async source outside device memory");
  // Until its group is waited for, the destination holds NaN: a read that misses the wait sees it.
  tsan_write(d, 16);
  std::memset(d, 0xff, 16);
  t.pending.push_back({d, static_cast<const unsigned char*>(src), src_bytes});
}

void cp_async_commit() {
  Thread& t = cur();
  t.group_end.push_back(t.pending.size());
}

void cp_async_wait(int n) {
  Thread& t = cur();
  const size_t groups = t.group_end.size();
  if (groups <= size_t(n)) return;
  const size_t done_groups = groups - size_t(n);
  const size_t upto = t.group_end[done_groups - 1];
  complete_copies(t, upto);
  t.group_end.erase(t.group_end.begin(), t.group_end.begin() + std::ptrdiff_t(done_groups));
  for (auto& e : t.group_end) e -= upto;
}

void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans) {
  const uint32_t in[2] = {addr, trans ? 1u : 0u};
  const uint32_t* out;
  try {
    out = collective(0xffffffffu, in, 2, leader_ldmatrix);
  } catch (Fault& f) {
    raise(f.code, f.what);
  }
  std::memcpy(r, out, 16);
}

void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  uint32_t in[10] = {a[0], a[1], a[2], a[3], b0, b1};
  std::memcpy(in + 6, d, 16);
  const uint32_t* out = collective(0xffffffffu, in, 10, leader_mma);
  std::memcpy(d, out, 16);
}

void check_pointer_arg(const void* p, int index, const std::source_location& where) {
  if (!p || is_device_range(p, 0) || is_pinned_range(p, 0)) return;
  char addr[32];
  std::snprintf(addr, sizeof addr, "%p", p);
  fault(cudaErrorIllegalAddress, "kernel launched at " + std::string(where.file_name()) + ":" +
                                     std::to_string(where.line()) + ": argument " + std::to_string(index) + " is " + addr +
                                     ", which is neither device memory (cudaMalloc) nor pinned host memory: the "
                                     "device cannot read a host address");
}

namespace {

// The order in which a launch's blocks run. The device promises none, so a kernel must not depend
// on one; the harness varies it. Fiber mode: per launch site and grid, forward, reverse, or
// interleaved (four blocks in flight, each run to its next barrier in turn);
// QLORA_CUDA_EMU_BLOCK_ORDER=forward|reverse|interleaved fixes one. The choice is a function of
// the launch, so a rerun repeats every bit. Sanitizer mode: windows of blocks in flight at once
// (blocks_in_flight), forward.
enum class BlockOrder { Forward, Reverse, Interleaved };

BlockOrder block_order(const std::string& site, dim3 grid) {
  static const int forced = [] {
    const char* v = std::getenv("QLORA_CUDA_EMU_BLOCK_ORDER");
    if (!v || !*v) return -1;
    const std::string m(v);
    if (m == "forward") return int(BlockOrder::Forward);
    if (m == "reverse") return int(BlockOrder::Reverse);
    if (m == "interleaved") return int(BlockOrder::Interleaved);
    std::fprintf(stderr, "qlora CUDA harness: QLORA_CUDA_EMU_BLOCK_ORDER=%s is not forward, reverse or interleaved\n", v);
    std::abort();
  }();
  if (forced >= 0) return BlockOrder(forced);
  const size_t h = std::hash<std::string>{}(site) ^ (size_t(grid.x) * 0x9e3779b1u + size_t(grid.y) * 131u + grid.z);
  return BlockOrder(h % 3);
}

constexpr size_t kInterleavedBlocks = 4;

// Sanitizer mode: how many blocks run at once. At least two (so a race between blocks has two
// sides), at most four, and about 1024 OS threads in all.
size_t blocks_in_flight(unsigned long long threads_per_block) {
  return std::clamp<size_t>(size_t(1024 / threads_per_block), 2, 4);
}

std::unique_ptr<Block> make_block(dim3 grid, dim3 block, size_t smem, unsigned long long linear, const std::string& site,
                                  const DeviceRanges* ranges) {
  auto b = std::make_unique<Block>();
  b->dim = block;
  b->grid = grid;
  b->idx = uint3{unsigned(linear % grid.x), unsigned((linear / grid.x) % grid.y), unsigned(linear / (1ull * grid.x * grid.y))};
  b->kernel = site.c_str();
  b->ranges = ranges;
  b->n = int(1ull * block.x * block.y * block.z);
  b->live.store(b->n, kRelaxed);
  b->smem_bytes = smem;
  b->smem_owner.reset(static_cast<unsigned char*>(std::malloc(smem ? smem : 1)));
  b->smem = b->smem_owner.get();
  std::memset(b->smem, 0xff, smem);  // shared memory starts as NaN, not zeros
  b->threads.resize(size_t(b->n));
  b->n_warps = (b->n + 31) / 32;
  b->warps = std::make_unique<Warp[]>(size_t(b->n_warps));
  for (int i = 0; i < b->n_warps; i++) b->warps[i].block = b.get();
  for (int i = 0; i < b->n; i++) {
    Thread& t = b->threads[size_t(i)];
    t.b = b.get();
    t.linear = i;
    t.tid = uint3{unsigned(i) % block.x, (unsigned(i) / block.x) % block.y, unsigned(i) / (block.x * block.y)};
    t.lane = i & 31;
    t.warp = i >> 5;
    b->warps[t.warp].live_mask |= lane_bit(t.lane);
  }
  return b;
}

// Runs a launch's blocks (each block's threads as fibers or OS threads) in the order above. The
// first block to fault (in that order) makes the sticky error; the blocks in flight with it are
// unwound, and no later block runs.
void run_grid(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body, const std::string& site) {
  if (sticky_error() != cudaSuccess) return;  // after a fault nothing more runs on the device
  const unsigned long long n_blocks = 1ull * grid.x * grid.y * grid.z;
  const std::shared_ptr<const DeviceRanges> ranges = device_ranges();
  const bool threads = use_os_threads();
  const BlockOrder order = threads ? BlockOrder::Forward : block_order(site, grid);
  const size_t window = std::min<unsigned long long>(
      n_blocks, threads ? blocks_in_flight(1ull * block.x * block.y * block.z)
                        : order == BlockOrder::Interleaved ? kInterleavedBlocks : 1);
  auto linear_of = [&](unsigned long long k) { return order == BlockOrder::Reverse ? n_blocks - 1 - k : k; };
  auto report = [&](const Block& b) { fault(b.first.code, "kernel launched at " + site + ": " + b.first.what); };
  std::vector<std::unique_ptr<Block>> live;
  unsigned long long next = 0;
  if (threads) {
    while (next < n_blocks) {
      live.clear();
      std::vector<Block*> run;
      while (live.size() < window && next < n_blocks) {
        live.push_back(make_block(grid, block, smem, linear_of(next++), site, ranges.get()));
        run.push_back(live.back().get());
      }
      pool().run(run, body);
      for (const auto& b : live)
        if (b->aborted.load(kRelaxed)) return report(*b);
    }
    return;
  }
  const Block* failed = nullptr;
  while (!live.empty() || (next < n_blocks && !failed)) {
    while (!failed && live.size() < window && next < n_blocks) {
      live.push_back(make_block(grid, block, smem, linear_of(next++), site, ranges.get()));
      start_fibers(*live.back(), body);
    }
    for (size_t i = 0; i < live.size();) {
      Block& b = *live[i];
      if (step_fibers(b)) {
        i++;
        continue;
      }
      if (b.aborted.load(kRelaxed) && !failed) {
        report(b);
        failed = &b;
        for (auto& other : live)  // unwind the other blocks in flight
          if (other.get() != &b) abort_block(*other, Fault{b.first.code, "another block of the launch faulted"});
      }
      if (&b == failed) {
        i++;  // kept until the others have unwound (the message above refers to it)
        continue;
      }
      live.erase(live.begin() + std::ptrdiff_t(i));
    }
    if (failed && live.size() == 1) break;
  }
}
}  // namespace

// The launch's configuration is checked at the call (errors returned by cudaGetLastError as on a
// device); the blocks run when the stream reaches the launch (emu_runtime.h: streams are queues).
void launch(const void* fn, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, std::function<void()> body,
            const std::source_location& where) {
  const std::string site = std::string(where.file_name()) + ":" + std::to_string(where.line());
  auto bad = [&](cudaError_t e, const std::string& why) { set_launch_error(e, "launch at " + site + ": " + why); };
  const unsigned long long nthreads = 1ull * block.x * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0)
    return bad(cudaErrorInvalidConfiguration, "a grid or block dimension is 0");
  if (block.x > 1024 || block.y > 1024 || block.z > 64 || nthreads > 1024)
    return bad(cudaErrorInvalidConfiguration, "block of " + std::to_string(nthreads) + " threads (" +
                                                  std::to_string(block.x) + "x" + std::to_string(block.y) + "x" +
                                                  std::to_string(block.z) + ") exceeds the device limits");
  if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return bad(cudaErrorInvalidConfiguration, "grid dimension above the device limits");
  const size_t allowed = std::max<size_t>(48 * 1024, size_t(max_dynamic_smem(fn)));
  if (smem > allowed)
    return bad(cudaErrorInvalidValue, std::to_string(smem) + " bytes of dynamic shared memory requested, " +
                                          std::to_string(allowed) +
                                          " allowed (above 48 KiB needs cudaFuncSetAttribute "
                                          "MaxDynamicSharedMemorySize)");
  if (sticky_error() != cudaSuccess) return;
  enqueue(stream, [grid, block, smem, body = std::move(body), site] { run_grid(grid, block, smem, body, site); });
}

}  // namespace qlora::emu
