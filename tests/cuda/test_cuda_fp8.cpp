// matmul_fp8 on the GPU (cuBLASLt FP8 with the activation quantized on the device) against the CPU
// backend's f32 statement of the same function, and against the bf16 GEMM on the dequantized weight.
#include "cuda_test_util.h"
#include "core/error.h"
#include "quant/quant_layout.h"
#include "quant/quantize.h"

namespace qlora::test {
namespace {

std::vector<uint8_t> packed_fp8(const Vec& w, int64_t rows, int64_t cols) {
  QuantParams p;
  p.format = QuantFormat::FP8_E4M3;
  p.fp8_scaling = Fp8Scaling::PerTensor;
  const QuantizedTensor q = quantize_ref(w.data(), rows, cols, p);
  std::vector<uint8_t> blob(size_t(quant_layout(p, rows, cols).total));
  pack_quantized(q, blob.data());
  return blob;
}

// Tolerance: the e4m3 codes of x and w are the same on both backends (same f32 scale, same
// round-to-nearest-even saturating conversion), and a product of two e4m3 values (4 significant
// bits each) is exact in f32, so only the f32 summation order (k 2^-24 of the partial sums, as for
// the bf16 GEMMs in test_backend_ops.cpp) and y's bf16 rounding (u = 2^-8) differ.
CUDA_OP_TEST(matmul_fp8, equals_cpu_semantics_and_approximates_bf16) {
  QLORA_REQUIRE_CUDA(cu);
  if (!cu->has_fp8_gemm()) GTEST_SKIP() << "no FP8 tensor cores on this GPU";
  struct Shape { int64_t m, out, in; };
  uint64_t seed = 801;
  for (const Shape s : {Shape{37, 96, 128}, Shape{1, 64, 48}, Shape{130, 8, 16}}) {
    SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.out) + "x" + std::to_string(s.in));
    const Vec x = round_bf16(randn(seed++, size_t(s.m * s.in), 3.0f));
    const Vec w = randn(seed++, size_t(s.out * s.in), 0.05f);
    const std::vector<uint8_t> blob = packed_fp8(w, s.out, s.in);
    Vec want(size_t(s.m * s.out)), want_amax(1);
    auto cpu = make_cpu_backend();
    cpu->matmul_fp8({f32_view(want.data(), {s.m, s.out}), f32_view(const_cast<float*>(x.data()), {s.m, s.in}),
                     blob.data(), s.m, s.out, s.in, f32_view(want_amax.data(), {1})});
    void* dblob = cu->alloc(blob.size());
    cu->copy_to_device(dblob, blob.data(), blob.size());
    DBuf dx(*cu, DType::BF16, x), dy(*cu, DType::BF16, s.m * s.out), damax(*cu, DType::F32, 1);
    dy.poison();
    cu->matmul_fp8({dy.t({s.m, s.out}), dx.t({s.m, s.in}), dblob, s.m, s.out, s.in, damax.t({1})});
    const Vec got = dy.download();
    const double acc = double(s.in) / 16777216.0;
    expect_close("matmul_fp8 vs cpu", got, want, {kBf16U, 1e-5 + 2 * acc, kBf16U + acc});
    expect_equal("amax", damax.download(), want_amax);
    // The function really is the FP8 one: against x W_deq^T in f32 the activation's e4m3 rounding
    // (relative <= 2^-4 per element, ~2^-4/sqrt(3) rms for random data) shows, and stays bounded.
    Vec wdeq(w.size()), ref(want.size());
    QuantParams p;
    p.format = QuantFormat::FP8_E4M3;
    cpu->dequantize({f32_view(wdeq.data(), {s.out, s.in}), blob.data(), p, s.out, s.in});
    cpu->matmul({f32_view(ref.data(), {s.m, s.out}), f32_view(const_cast<float*>(x.data()), {s.m, s.in}),
                 f32_view(wdeq.data(), {s.out, s.in}), s.m, s.out, s.in, false, true, 1.0f, 0.0f});
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < ref.size(); i++) e2 += double(got[i] - ref[i]) * (got[i] - ref[i]), r2 += double(ref[i]) * ref[i];
    const double rel = std::sqrt(e2 / r2);
    EXPECT_GT(rel, 1e-3) << "x was not quantized to e4m3";
    EXPECT_LT(rel, 0.0625) << "beyond e4m3's rounding of x";
    cu->free(dblob);
  }
}

// Shapes cuBLASLt's FP8 kernels cannot take are refused by name, not computed wrongly.
CUDA_OP_TEST(matmul_fp8, unsupported_shape_is_an_error) {
  QLORA_REQUIRE_CUDA(cu);
  if (!cu->has_fp8_gemm()) GTEST_SKIP() << "no FP8 tensor cores on this GPU";
  const int64_t m = 4, out = 8, in = 40;  // in % 16 != 0
  const std::vector<uint8_t> blob = packed_fp8(randn(5, size_t(out * in)), out, in);
  void* dblob = cu->alloc(blob.size());
  cu->copy_to_device(dblob, blob.data(), blob.size());
  DBuf dx(*cu, DType::BF16, randn(6, size_t(m * in))), dy(*cu, DType::BF16, m * out);
  try {
    cu->matmul_fp8({dy.t({m, out}), dx.t({m, in}), dblob, m, out, in, Tensor()});
    ADD_FAILURE() << "in = 40 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(e.what()).find("in % 16"), std::string::npos) << e.what();
  }
  cu->free(dblob);
}

}  // namespace
}  // namespace qlora::test
