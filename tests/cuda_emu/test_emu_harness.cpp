// The host harness itself: kernels with one known bug each (harness_kernels.cu) must be caught,
// and their correct versions must pass. These run in fast (fiber) mode; under a sanitizer build
// the same bugs are reports of the sanitizer instead (tools/cuda_emu_mutations.sh shows both).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/emu/emu_runtime.h"
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

// The message of a sticky fault, which the fixture then clears.
std::string fault_text() {
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

}  // namespace
}  // namespace qlora::emu_test
