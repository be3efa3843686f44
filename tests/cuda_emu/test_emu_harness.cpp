// The host harness itself: kernels with one known bug each (harness_kernels.cu) must be caught,
// and their correct versions must pass. These run in fast (fiber) mode; under a sanitizer build
// the same bugs are reports of the sanitizer instead (tools/cuda_emu_mutations.sh shows both).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_emu/emu_runtime.h"
#include "harness_kernels.h"

namespace qlora::emu_test {
namespace {

template <class T>
struct Dev {
  explicit Dev(size_t n) : n(n) { EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), cudaSuccess); }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void put(const std::vector<T>& h) { EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess); }
  size_t n;
  T* p = nullptr;
};

// The message of a sticky fault, which the fixture then clears. A fault inside a kernel shows at
// the first call after the kernel ran: the synchronize runs it.
std::string fault_text() {
  cudaDeviceSynchronize();
  const cudaError_t e = cudaGetLastError();
  const std::string s = e == cudaSuccess ? std::string() : cudaGetErrorString(e);
  emu::clear_errors_for_tests();
  return s;
}

class Harness : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "the harness's fast-mode checks; sanitizer builds run only the op filter";
#endif
    emu::clear_errors_for_tests();
  }
  void TearDown() override { emu::clear_errors_for_tests(); }
};

TEST_F(Harness, BarrierOrdersSharedMemoryBetweenWarps) {
  Dev<float> out(32);
  handoff(out.p, true);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto h = out.get();
  for (int i = 0; i < 32; i++) EXPECT_EQ(h[size_t(i)], float(32 + i));
}

TEST_F(Harness, MissingBarrierReadsUnwrittenSharedMemory) {
  // Warp 0 runs as far as it can before warp 1 starts, so without the barrier it reads shared
  // memory nobody wrote yet: the harness fills it with NaN.
  Dev<float> out(32);
  handoff(out.p, false);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : out.get()) EXPECT_TRUE(std::isnan(v)) << v;
}

TEST_F(Harness, BlockSumOfShufflesAndSharedMemory) {
  Dev<double> out(3);
  block_sum(out.p, 3);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (double v : out.get()) EXPECT_EQ(v, 256.0 * 257.0 / 2.0);
}

TEST_F(Harness, CpAsyncDataArrivesAtItsWait) {
  std::vector<float> in(128);
  for (size_t i = 0; i < in.size(); i++) in[i] = float(i) * 0.5f + 1.0f;
  Dev<float> din(128), out(128);
  din.put(in);
  cp_async_roundtrip(din.p, out.p, true);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto h = out.get();
  for (int t = 0; t < 32; t++)
    for (int i = 0; i < 4; i++) EXPECT_EQ(h[size_t(t * 4 + i)], in[size_t(((t + 1) % 32) * 4 + i)]);
}

TEST_F(Harness, CpAsyncReadBeforeItsWaitIsNaN) {
  std::vector<float> in(128, 2.0f);
  Dev<float> din(128), out(128);
  din.put(in);
  cp_async_roundtrip(din.p, out.p, false);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : out.get()) EXPECT_TRUE(std::isnan(v)) << v;
}

TEST_F(Harness, SharedMemoryOverflowIsAFaultNamingTheOffset) {
  Dev<float> in(4);
  smem_overflow(in.p);
  const std::string msg = fault_text();
  EXPECT_NE(msg.find("outside the block's 512 bytes of dynamic shared memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("harness_kernels.cu"), std::string::npos) << msg;
}

TEST_F(Harness, DeadlockIsAFaultNotAHang) {
  Dev<float> out(32);
  deadlock(out.p);
  const std::string msg = fault_text();
  EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
}

TEST_F(Harness, FullMaskShuffleAfterLanesExitedIsAFault) {
  Dev<float> out(32);
  early_exit_shuffle(out.p);
  const std::string msg = fault_text();
  // Which lane notices first depends on the schedule: a waiting lane sees the mask name exited
  // lanes, or an exiting lane sees its warp waiting for it.
  EXPECT_NE(msg.find("exited"), std::string::npos) << msg;
}

TEST_F(Harness, AFaultIsStickyUntilCleared) {
  Dev<float> out(32);
  deadlock(out.p);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the kernel has not run yet: nothing ordered it
  cudaDeviceSynchronize();
  EXPECT_NE(cudaGetLastError(), cudaSuccess);
  void* p = nullptr;
  EXPECT_NE(cudaMalloc(&p, 16), cudaSuccess);  // every later call fails, as after a device fault
  emu::clear_errors_for_tests();
  EXPECT_EQ(cudaMalloc(&p, 16), cudaSuccess);
  cudaFree(p);
}

TEST_F(Harness, LaunchLimitsOfTheArchitecture) {
  empty(1025, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // a configuration error is not sticky
  empty(1024, 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  empty(32, 64 * 1024);  // above 48 KiB needs the opt-in attribute
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(allow_smem(64 * 1024), cudaSuccess);
  empty(32, 64 * 1024);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(allow_smem(emu::smem_optin_bytes() + 1), cudaErrorInvalidValue);
  EXPECT_EQ(allow_smem(0), cudaSuccess);
}

TEST_F(Harness, CopiesAreCheckedAgainstTheirKind) {
  std::vector<float> host(4, 1.0f), back(4);
  Dev<float> d(4);
  EXPECT_EQ(cudaMemcpy(back.data(), host.data(), 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d.p, host.data(), 20, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // past the end
  EXPECT_EQ(cudaMemcpy(d.p, host.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  cudaGetLastError();
}

TEST_F(Harness, FreshDeviceMemoryIsNaN) {
  Dev<float> d(8);
  for (float v : d.get()) EXPECT_TRUE(std::isnan(v));
}

// ---- PTX known answers: every element of every fragment where the PTX ISA's tables put it ----

TEST_F(Harness, MmaM16n8k16MatchesTheIsaFragmentTables) {
  Dev<float> d(16 * 8);
  mma_known_answer(d.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto got = d.get();
  for (int r = 0; r < 16; r++)
    for (int n = 0; n < 8; n++) {
      double want = 1000 + r * 8 + n;  // C
      for (int k = 0; k < 16; k++) want += double(r * 16 + k) * double(k * 8 + n + 1);
      ASSERT_EQ(got[size_t(r * 8 + n)], float(want)) << "D[" << r << "][" << n << "]";
    }
}

TEST_F(Harness, LdmatrixX4MatchesTheIsaFragmentTables) {
  for (bool trans : {false, true}) {
    Dev<float> out(32 * 8);
    ldmatrix_known_answer(out.p, trans);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const auto got = out.get();
    for (int lane = 0; lane < 32; lane++)
      for (int j = 0; j < 4; j++)
        for (int h = 0; h < 2; h++) {
          const int g = lane >> 2, t = lane & 3;
          const int row = trans ? 2 * t + h : g, col = trans ? g : 2 * t + h;
          ASSERT_EQ(got[size_t(lane * 8 + 2 * j + h)], float(j * 64 + row * 8 + col))
              << (trans ? ".trans" : "") << " lane " << lane << " register " << j << " half " << h;
        }
  }
}

// ---- streams are queues ---------------------------------------------------------------------

struct Stream {
  explicit Stream(unsigned flags) { EXPECT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};
struct Event {
  Event() { EXPECT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess); }
  ~Event() { cudaEventDestroy(e); }
  cudaEvent_t e = nullptr;
};
constexpr int kN = 300;  // two blocks

TEST_F(Harness, NonBlockingStreamRunsOnlyWhenOrdered) {
  Dev<float> d(kN);
  Stream s(cudaStreamNonBlocking);
  fill(d.p, kN, 3.0f, s.s);
  EXPECT_EQ(cudaStreamQuery(s.s), cudaErrorNotReady);
  // cudaMemcpy runs on the legacy default stream, which does not wait for a non-blocking stream:
  // the fill has not run.
  for (float v : d.get()) ASSERT_TRUE(std::isnan(v)) << v;
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s.s), cudaSuccess);
  for (float v : d.get()) ASSERT_EQ(v, 3.0f);
}

TEST_F(Harness, BlockingStreamIsOrderedWithTheLegacyStream) {
  Dev<float> d(kN);
  Stream s(cudaStreamDefault);
  fill(d.p, kN, 5.0f, s.s);
  for (float v : d.get()) ASSERT_EQ(v, 5.0f);  // the legacy copy waits for the blocking stream's work
  // ... and a legacy memset orders the blocking stream's later work after it.
  ASSERT_EQ(cudaMemset(d.p, 0, kN * sizeof(float)), cudaSuccess);
  Dev<float> e(kN);
  add_one(d.p, e.p, kN, s.s);
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  for (float v : e.get()) ASSERT_EQ(v, 1.0f);
}

TEST_F(Harness, LegacyMemsetRacesANonBlockingStream) {
  // The bug class of a memset issued on the legacy stream for memory that work on a non-blocking
  // stream reads: nothing orders the two, and the harness runs the memset as late as allowed.
  Dev<float> d(kN), e(kN);
  Stream s(cudaStreamNonBlocking);
  ASSERT_EQ(cudaMemset(d.p, 0, kN * sizeof(float)), cudaSuccess);
  add_one(d.p, e.p, kN, s.s);
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  for (float v : e.get()) ASSERT_TRUE(std::isnan(v)) << "the memset ran before the kernel: " << v;
  // On the stream itself it is ordered.
  ASSERT_EQ(cudaMemsetAsync(d.p, 0, kN * sizeof(float), s.s), cudaSuccess);
  add_one(d.p, e.p, kN, s.s);
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  for (float v : e.get()) ASSERT_EQ(v, 1.0f);
}

TEST_F(Harness, StreamWaitEventOrdersASideStream) {
  Dev<float> d(kN), out(kN);
  Stream side(cudaStreamNonBlocking), main(cudaStreamNonBlocking);
  Event done;
  // With the wait: the consumer on `main` sees the producer's data, although only `main` is
  // synchronized.
  fill(d.p, kN, 7.0f, side.s);
  ASSERT_EQ(cudaEventRecord(done.e, side.s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done.e), cudaErrorNotReady);
  ASSERT_EQ(cudaStreamWaitEvent(main.s, done.e, 0), cudaSuccess);
  add_one(d.p, out.p, kN, main.s);
  ASSERT_EQ(cudaStreamSynchronize(main.s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done.e), cudaSuccess);
  for (float v : out.get()) ASSERT_EQ(v, 8.0f);
  // Without it: the side stream's work has not run when the consumer reads.
  fill(d.p, kN, 9.0f, side.s);
  add_one(d.p, out.p, kN, main.s);
  ASSERT_EQ(cudaStreamSynchronize(main.s), cudaSuccess);
  for (float v : out.get()) ASSERT_EQ(v, 8.0f) << "read the side stream's unfinished write";
  ASSERT_EQ(cudaEventSynchronize(done.e), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (float v : d.get()) ASSERT_EQ(v, 9.0f);
}

TEST_F(Harness, AsyncCopiesFollowTheirStreamAndPageableRules) {
  Dev<float> d(kN);
  Stream s(cudaStreamNonBlocking);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), kN * sizeof(float)), cudaSuccess);
  std::vector<float> pageable(kN, 2.0f);
  // From pageable memory the bytes are taken at the call: changing them afterwards changes nothing.
  ASSERT_EQ(cudaMemcpyAsync(d.p, pageable.data(), kN * sizeof(float), cudaMemcpyHostToDevice, s.s), cudaSuccess);
  pageable.assign(kN, -1.0f);
  // Into pinned memory the copy lands when the stream runs it, not at the call.
  for (int i = 0; i < kN; i++) pinned[i] = 0.5f;
  ASSERT_EQ(cudaMemcpyAsync(pinned, d.p, kN * sizeof(float), cudaMemcpyDeviceToHost, s.s), cudaSuccess);
  for (int i = 0; i < kN; i++) ASSERT_EQ(pinned[i], 0.5f);
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  for (int i = 0; i < kN; i++) ASSERT_EQ(pinned[i], 2.0f);
  // Into pageable memory the call returns only when the copy is done.
  fill(d.p, kN, 4.0f, s.s);
  ASSERT_EQ(cudaMemcpyAsync(pageable.data(), d.p, kN * sizeof(float), cudaMemcpyDeviceToHost, s.s), cudaSuccess);
  for (float v : pageable) ASSERT_EQ(v, 4.0f);
  cudaFreeHost(pinned);
}

TEST_F(Harness, AHostPointerPassedToAKernelIsAFaultNamingTheArgument) {
  std::vector<float> host(kN);
  fill(host.data(), kN, 1.0f, nullptr);
  const std::string msg = fault_text();
  EXPECT_NE(msg.find("argument 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("harness_kernels.cu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("neither device memory"), std::string::npos) << msg;
  for (float v : host) ASSERT_EQ(v, 0.0f);  // the kernel did not run
  // Pinned host memory is reachable from the device (unified addressing).
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), kN * sizeof(float)), cudaSuccess);
  fill(pinned, kN, 1.0f, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(pinned[kN - 1], 1.0f);
  cudaFreeHost(pinned);
}

// cudaMalloc memory is closed to host code between device work: a dereference from the host is a
// fault naming the allocation, as it is an invalid access on a device; a copy reads it.
TEST_F(Harness, HostCodeTouchingDeviceMemoryIsAFault) {
  Dev<float> d(16);
  fill(d.p, 16, 2.0f, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        volatile float x = d.p[3];
        (void)x;
      },
      "host code touched device memory at .* \\(byte 12 of a cudaMalloc allocation of 64 bytes\\)");
  EXPECT_EQ(d.get()[3], 2.0f);
}

TEST_F(Harness, StaticSharedMemoryIsPerBlockAndPoisoned) {
  // One copy per block, NaN until written: a block never sees another block's static shared data
  // (blocks run concurrently in sanitizer mode, in varying order in fast mode).
  for (int mode : {0, 1}) {
    emu::set_os_threads_for_tests(mode);
    Dev<float> out(4);
    static_shared(out.p, 4);
    const auto h = out.get();
    EXPECT_EQ(h[0], 7.0f) << "mode " << mode;
    for (size_t b = 1; b < 4; b++) EXPECT_TRUE(std::isnan(h[b])) << "block " << b << " mode " << mode << ": " << h[b];
  }
  emu::set_os_threads_for_tests(-1);
}

// Fast mode: each launch runs its blocks forward, in reverse, or interleaved (several in flight,
// each to its next barrier in turn), chosen per launch site and grid; all three occur.
TEST_F(Harness, BlocksRunForwardReversedAndInterleaved) {
  emu::set_os_threads_for_tests(0);
  int seen[3] = {0, 0, 0};  // forward, reverse, interleaved
  for (int g = 5; g <= 24; g++) {
    Dev<int> counter(1), starts{size_t(g)}, ends{size_t(g)};
    counter.put({0});
    block_order(counter.p, starts.p, ends.p, g);
    const auto s = starts.get(), e = ends.get();
    bool fwd = true, rev = true;
    for (int b = 0; b < g; b++) {
      fwd = fwd && s[size_t(b)] == 2 * b && e[size_t(b)] == 2 * b + 1;
      rev = rev && s[size_t(b)] == 2 * (g - 1 - b) && e[size_t(b)] == 2 * (g - 1 - b) + 1;
    }
    // Interleaved: block 0 starts first and blocks 1..3 start before it passes its barrier.
    const bool inter = s[0] == 0 && s[1] < e[0] && s[2] < e[0] && s[3] < e[0];
    std::string tickets;
    for (int b = 0; b < g; b++) tickets += " " + std::to_string(s[size_t(b)]) + "/" + std::to_string(e[size_t(b)]);
    ASSERT_TRUE(fwd || rev || inter) << "grid " << g << ": an order the harness does not make:" << tickets;
    seen[fwd ? 0 : rev ? 1 : 2]++;
    std::vector<int> all(s);
    all.insert(all.end(), e.begin(), e.end());
    std::sort(all.begin(), all.end());
    for (int i = 0; i < 2 * g; i++) ASSERT_EQ(all[size_t(i)], i) << "grid " << g << ": every ticket once";
  }
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
  emu::set_os_threads_for_tests(-1);
}

// Sanitizer mode: blocks of a grid run at the same time with no ordering between them but the
// kernel's own, so each of two blocks sees the flag the other raised while it waited (and
// ThreadSanitizer sees two blocks that touch one address without an atomic as a race:
// tools/cuda_emu_mutations.sh).
TEST_F(Harness, BlocksOfAGridRunConcurrentlyInSanitizerMode) {
  emu::set_os_threads_for_tests(1);
  Dev<int> flags(2), seen(2);
  flags.put({0, 0});
  seen.put({0, 0});
  handshake(flags.p, seen.p);
  const auto h = seen.get();
  EXPECT_EQ(h[0], 1);
  EXPECT_EQ(h[1], 1);
  emu::set_os_threads_for_tests(-1);
  // Fast mode runs one block at a time: the first block's wait ends unseen.
  emu::set_os_threads_for_tests(0);
  flags.put({0, 0});
  seen.put({0, 0});
  handshake(flags.p, seen.p);
  const auto f = seen.get();
  EXPECT_EQ(f[0] + f[1], 1) << f[0] << " " << f[1];
  emu::set_os_threads_for_tests(-1);
}

}  // namespace
}  // namespace qlora::emu_test
