// CUDA backend basics: the factory's answer, memory and copies, the device copy of the dropout
// hash, and the coverage check that every backend op has a CUDA-vs-CPU case.
#include "backend/cuda/hash_uniform.h"
#include "cuda_test_util.h"

namespace qlora::test {
namespace {

// Runs with or without a GPU: the registry is filled by CUDA_OP_TEST at static initialisation.
TEST(CudaCoverage, every_backend_op_has_a_cuda_case) {
  const auto& covered = op_cases();
  for (const auto& op : backend_op_names())
    EXPECT_TRUE(covered.count(op)) << "op '" << op << "' has no CUDA_OP_TEST case in tests/cuda/";
  for (const auto& name : covered)
    EXPECT_NE(std::find(backend_op_names().begin(), backend_op_names().end(), name), backend_op_names().end())
        << "CUDA_OP_TEST names '" << name << "', which is not a backend op";
}

// The device copy of hash_uniform, compiled here by the host compiler, must be core/rng.h's
// function bit for bit (the kernel side is checked by the dropout cases of test_backend_ops).
TEST(CudaHash, host_build_of_device_hash_equals_core_hash) {
  Rng rng(77);
  int mismatches = 0;
  for (int i = 0; i < 200000; i++) {
    const uint64_t seed = rng.next_u64(), a = i % 3 ? rng.below(1000) : rng.next_u64(), b = rng.next_u64() >> (i % 40);
    const float want = hash_uniform(seed, a, b), got = cuda::hash_uniform_hd(seed, a, b);
    if (std::memcmp(&want, &got, 4) != 0 && mismatches++ < 5)
      ADD_FAILURE() << "seed " << seed << " a " << a << " b " << b << ": " << got << " vs " << want;
    ASSERT_TRUE(got >= 0.0f && got < 1.0f);
  }
  EXPECT_EQ(mismatches, 0);
}

// Either a working backend or a reason: the factory never returns null silently.
TEST(CudaFactory, backend_or_reason) {
  std::string why;
  auto be = make_cuda_backend(&why);
  const CudaDeviceInfo info = cuda_device_info();
  if (info.count == 0) {
    EXPECT_EQ(be, nullptr);
    EXPECT_EQ(why, "no CUDA device found");
    return;
  }
  if (!be) {
    EXPECT_FALSE(why.empty());
    GTEST_SKIP() << "no CUDA device: " << why;
  }
  EXPECT_EQ(be->name(), "cuda");
  EXPECT_EQ(be->device(), DeviceKind::Cuda);
  EXPECT_EQ(be->compute_dtype(), DType::BF16);
  EXPECT_NE(why.find(info.name), std::string::npos) << why;
  EXPECT_FALSE(cuda_built_archs().empty());
}

TEST(CudaBackend, alloc_is_zeroed_and_copies_round_trip) {
  QLORA_REQUIRE_CUDA(cu);
  const size_t n = (size_t(1) << 20) + 7;
  void* p = cu->alloc(n * 4);
  Vec back(n, 1.0f);
  cu->copy_to_host(back.data(), p, n * 4);
  for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(back[i], 0.0f) << i;
  EXPECT_EQ(back[n - 1], 0.0f);
  const Vec data = randn(3, n);
  cu->copy_to_device(p, data.data(), n * 4);
  cu->copy_to_host(back.data(), p, n * 4);
  expect_equal("round trip", back, data);
  cu->memset0(static_cast<float*>(p) + 1, 4 * 4);
  cu->copy_to_host(back.data(), p, 8 * 4);
  EXPECT_EQ(back[0], data[0]);
  for (int i = 1; i <= 4; i++) EXPECT_EQ(back[size_t(i)], 0.0f);
  EXPECT_EQ(back[5], data[5]);
  cu->free(p);
  void* z = cu->alloc(0);  // zero bytes still gives a block that free accepts
  EXPECT_NE(z, nullptr);
  cu->free(z);
  cu->synchronize();
}

// Uploads larger than the staging buffers, with the host buffer overwritten right after each
// copy returns (the staged upload must not read it later), land whole and in order.
TEST(CudaBackend, staged_uploads_are_whole_and_free_the_host_buffer_at_once) {
  QLORA_REQUIRE_CUDA(cu);
  const size_t n = small_shapes() ? (size_t(9) << 20) + 5 : (size_t(37) << 20) / 4 * 4 + 5;  // > 2 staging buffers
  float* a = static_cast<float*>(cu->alloc(n * 4));
  float* b = static_cast<float*>(cu->alloc(n * 4));
  Vec src = randn(11, n);
  const Vec first = src;
  cu->copy_to_device(a, src.data(), n * 4);
  for (float& v : src) v = -v + 1.0f;  // reused at once
  const Vec second = src;
  cu->copy_to_device(b, src.data(), n * 4);
  std::fill(src.begin(), src.end(), 0.0f);
  Vec back(n);
  cu->copy_to_host(back.data(), a, n * 4);
  expect_equal("first upload", back, first);
  cu->copy_to_host(back.data(), b, n * 4);
  expect_equal("second upload", back, second);
  cu->free(a);
  cu->free(b);
}

TEST(CudaBackend, huge_alloc_is_a_config_error) {
  QLORA_REQUIRE_CUDA(cu);
  try {
    cu->alloc(size_t(1) << 50);
    ADD_FAILURE() << "1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(e.hint().find("batch"), std::string::npos) << e.hint();
  }
}

}  // namespace
}  // namespace qlora::test
