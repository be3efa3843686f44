// The activation offload ops on the GPU: device -> pinned host -> device returns the same bytes,
// and offload_wait orders the ops issued after it behind the copies of its range (a source
// overwritten after the wait leaves the host copy as it was; a destination read after it holds the
// copied bytes). On a device the copies run on their own stream; the harness runs them in order.
#include "cuda_test_util.h"
#include "core/error.h"

namespace qlora::test {
namespace {

constexpr DType BF = DType::BF16;

CUDA_OP_TEST(offload_copy, round_trip_through_pinned_host) {
  QLORA_REQUIRE_CUDA(cu);
  for (int64_t n : {int64_t(1), int64_t(4097), int64_t(64) * 4096}) {  // odd sizes and a layer input's
    SCOPED_TRACE(n);
    const Vec x = round_bf16(randn(901 + uint64_t(n), size_t(n)));
    const int64_t bytes = n * 2;
    DBuf a(*cu, BF, x), b(*cu, BF, n);
    b.poison();
    void* h = cu->alloc_host(size_t(bytes));
    ASSERT_NE(h, nullptr);
    cu->offload_copy({h, a.t().data, bytes, true});
    cu->offload_wait({a.t().data, bytes});
    cu->scale({a.t(), n, 2.0f});  // overwrites the source: ordered after the copy by the wait
    cu->offload_copy({b.t().data, h, bytes, false});
    cu->offload_wait({b.t().data, bytes});
    expect_equal("device -> host -> device", b.download(), x);
    Vec twice = x;
    for (float& v : twice) v *= 2.0f;
    expect_equal("the source after the wait", a.download(), twice);
    cu->free_host(h);
  }
  EXPECT_NO_THROW(cu->offload_copy({nullptr, nullptr, 0, true}));
  EXPECT_THROW(cu->offload_copy({nullptr, nullptr, 16, true}), Error);
}

// Several copies in flight over disjoint ranges of one buffer, waited for one range at a time,
// as the model's two activation slots are; a wait on a range with nothing pending is a no-op.
CUDA_OP_TEST(offload_wait, waits_per_range) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = 3 * 1000;
  const Vec x = round_bf16(randn(907, size_t(n)));
  DBuf src(*cu, BF, x), dst(*cu, BF, n);
  dst.poison();
  auto* h = static_cast<char*>(cu->alloc_host(size_t(n) * 2));
  auto* s = static_cast<char*>(src.t().data);
  auto* d = static_cast<char*>(dst.t().data);
  const int64_t part = 1000 * 2;
  cu->offload_wait({d, n * 2});  // nothing pending
  for (int i = 0; i < 3; i++) cu->offload_copy({h + i * part, s + i * part, part, true});
  for (int i = 0; i < 3; i++) cu->offload_wait({s + i * part, part});
  for (int i = 0; i < 3; i++) cu->offload_copy({d + i * part, h + i * part, part, false});
  for (int i = 2; i >= 0; i--) cu->offload_wait({d + i * part, part});
  expect_equal("three ranges", dst.download(), x);
  cu->free_host(h);
  EXPECT_THROW(cu->offload_wait({nullptr, 16}), Error);
}

}  // namespace
}  // namespace qlora::test
