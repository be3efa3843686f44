// CpuBackend basics (identity, memory, argument validation) and the every-op-has-a-test check.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <set>

#include "backend_test_util.h"
#include "core/error.h"

namespace qlora::test {
namespace {

// Ops with a CpuOps.<op>_* test. Adding an op to QLORA_BACKEND_OPS without a test (and an entry
// here) fails EveryOpHasATest.
const std::vector<std::string> kTestedOps = {
    "matmul",    "matmul_fp8",    "matmul_fp4",    "embedding_fwd", "embedding_bwd", "rmsnorm_fwd", "rmsnorm_bwd",
    "rope_fwd",  "rope_bwd",      "attention_fwd", "attention_bwd", "swiglu_fwd",
    "swiglu_bwd", "add",          "bias_add",      "scale",        "dropout_fwd",
    "dropout_bwd", "cross_entropy_fwd_bwd", "adamw", "sumsq", "dequantize",
    "offload_copy", "offload_wait", "moe_route_fwd", "moe_route_bwd", "moe_router_stats", "gather_rows", "combine_rows",
    "row_dots",
};

TEST(CpuBackendCoverage, EveryOpHasATest) {
  const auto& ops = backend_op_names();
  const std::set<std::string> listed(kTestedOps.begin(), kTestedOps.end());
  for (const auto& op : ops) EXPECT_TRUE(listed.count(op)) << "backend op '" << op << "' has no CPU test";
  for (const auto& op : kTestedOps)
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << "'" << op << "' is not a backend op";

  // The list is backed by real tests: CpuOps.<op>_<what> must be registered for each op.
  std::set<std::string> tests;
  const auto* unit = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit->total_test_suite_count(); i++) {
    const auto* suite = unit->GetTestSuite(i);
    if (std::string(suite->name()) != "CpuOps") continue;
    for (int j = 0; j < suite->total_test_count(); j++) tests.insert(suite->GetTestInfo(j)->name());
  }
  for (const auto& op : ops) {
    const bool found = std::any_of(tests.begin(), tests.end(), [&](const std::string& t) {
      return t.rfind(op + "_", 0) == 0 && t.size() > op.size() + 1 && std::isupper(t[op.size() + 1]);
    });
    EXPECT_TRUE(found) << "no test named CpuOps." << op << "_<What>";
  }
}

TEST(CpuBackend, IdentityAndMemory) {
  auto be = cpu();
  EXPECT_EQ(be->name(), "cpu");
  EXPECT_EQ(be->device(), DeviceKind::Cpu);
  EXPECT_EQ(be->compute_dtype(), DType::F32);
  for (size_t bytes : {size_t(0), size_t(1), size_t(300), size_t(1) << 20}) {
    auto* p = static_cast<unsigned char*>(be->alloc(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    EXPECT_TRUE(std::all_of(p, p + bytes, [](unsigned char c) { return c == 0; })) << bytes;
    be->free(p);
  }
  Vec host = {1.5f, -2.0f, 3.25f}, back(3);
  void* dev = be->alloc(12);
  be->copy_to_device(dev, host.data(), 12);
  be->copy_to_host(back.data(), dev, 12);
  EXPECT_EQ(back, host);
  be->memset0(dev, 12);
  be->copy_to_host(back.data(), dev, 12);
  EXPECT_EQ(back, Vec(3, 0.0f));
  be->free(dev);
}

TEST(CpuBackend, WrongDtypeIsAnInternalErrorNamingOpAndTensor) {
  auto be = cpu();
  std::vector<uint16_t> half(12);
  Vec y(12, 1.0f);
  try {
    be->add({view(y, {12}), Tensor(half.data(), DType::BF16, {12}), 12});
    FAIL() << "bf16 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    EXPECT_NE(e.where().find("add"), std::string::npos) << e.what();
    EXPECT_NE(e.where().find("'x'"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("bf16"), std::string::npos) << e.what();
  }
  Vec out(12), rstd(2), w(6);
  try {
    be->rmsnorm_fwd({view(out, {2, 6}), view(rstd, {2}), view(y, {2, 6}),
                     Tensor(half.data(), DType::F16, {6}), 2, 6, 1e-5f});
    FAIL() << "f16 weight accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    EXPECT_NE(e.where().find("rmsnorm_fwd"), std::string::npos) << e.what();
    EXPECT_NE(e.where().find("'w'"), std::string::npos) << e.what();
  }
}

TEST(CpuBackend, ShapeMismatchAndNullBuffersAreErrors) {
  auto be = cpu();
  Vec a(6, 1.0f), b(6, 1.0f), c(4);
  MatmulArgs mm;
  mm.c = view(c, {2, 2});
  mm.a = view(a, {2, 3});
  mm.b = view(b, {3, 2});
  mm.m = 2, mm.n = 2, mm.k = 4;  // disagrees with the views
  try {
    be->matmul(mm);
    FAIL() << "k mismatch accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Shape);
    EXPECT_NE(e.where().find("matmul"), std::string::npos) << e.what();
  }
  mm.k = 3;
  be->matmul(mm);
  EXPECT_EQ(c, Vec(4, 3.0f));

  EXPECT_THROW(be->scale({Tensor(), 5, 2.0f}), Error);           // null buffer
  EXPECT_THROW(be->scale({view(a, {6}), -1, 2.0f}), Error);      // negative size
  double out = 0;
  EXPECT_THROW(be->sumsq({{view(a, {6})}, nullptr}), Error);    // no result slot
  be->sumsq({{view(a, {6})}, &out});
  EXPECT_EQ(out, 6.0);
}

}  // namespace
}  // namespace qlora::test
