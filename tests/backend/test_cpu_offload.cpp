// The activation offload ops on the CPU: a copy between device memory and host memory from
// alloc_host is a memcpy made at once; the argument checks name what is wrong.
#include <cstring>

#include "backend_test_util.h"
#include "core/error.h"

namespace qlora::test {
namespace {

TEST(CpuOps, offload_copy_RoundTripsThroughHostMemory) {
  auto be = cpu();
  const int64_t bytes = 1001;  // not a multiple of any vector width
  auto* dev = static_cast<unsigned char*>(be->alloc(size_t(bytes)));
  auto* back = static_cast<unsigned char*>(be->alloc(size_t(bytes)));
  auto* host = static_cast<unsigned char*>(be->alloc_host(size_t(bytes)));
  for (int64_t i = 0; i < bytes; i++) EXPECT_EQ(host[i], 0) << "alloc_host memory is zeroed";
  for (int64_t i = 0; i < bytes; i++) dev[i] = static_cast<unsigned char>(i * 37 + 11);
  be->offload_copy({host, dev, bytes, true});
  be->offload_wait({dev, bytes});
  std::memset(dev, 0, size_t(bytes));  // the source may be overwritten once waited for
  be->offload_copy({back, host, bytes, false});
  be->offload_wait({back, bytes});
  for (int64_t i = 0; i < bytes; i++) ASSERT_EQ(back[i], static_cast<unsigned char>(i * 37 + 11)) << i;
  EXPECT_NO_THROW(be->offload_copy({nullptr, nullptr, 0, true}));  // nothing to copy
  be->free(dev);
  be->free(back);
  be->free_host(host);
}

TEST(CpuOps, offload_copy_ArgumentErrors) {
  auto be = cpu();
  std::vector<unsigned char> a(64), b(64);
  try {
    be->offload_copy({a.data(), nullptr, 64, true});
    ADD_FAILURE() << "a null source was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    EXPECT_NE(e.where().find("src"), std::string::npos) << e.where();
  }
  try {
    be->offload_copy({a.data(), b.data(), -1, false});
    ADD_FAILURE() << "a negative size was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Shape);
    EXPECT_NE(e.where().find("bytes"), std::string::npos) << e.where();
  }
  try {
    be->offload_copy({a.data() + 8, a.data(), 32, true});
    ADD_FAILURE() << "overlapping source and destination were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    EXPECT_NE(e.message().find("overlap"), std::string::npos) << e.message();
  }
}

TEST(CpuOps, offload_wait_ChecksItsRange) {
  auto be = cpu();
  EXPECT_NO_THROW(be->offload_wait({nullptr, 0}));
  std::vector<unsigned char> a(16);
  EXPECT_NO_THROW(be->offload_wait({a.data(), 16}));  // nothing pending on the CPU
  EXPECT_THROW(be->offload_wait({nullptr, 16}), Error);
  try {
    be->offload_wait({a.data(), -16});
    ADD_FAILURE() << "a negative size was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Shape);
  }
}

}  // namespace
}  // namespace qlora::test
