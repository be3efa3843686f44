// matmul_fp4 on the GPU (cuBLASLt's block-scaled NVFP4 GEMM with the activation quantized on the
// device) against the CPU backend's f32 statement of the same function, for NVFP4 and MXFP4 weights.
#include "cuda_test_util.h"
#include "core/error.h"
#include "quant/fp4_gemm.h"
#include "quant/quant_layout.h"
#include "quant/quantize.h"

namespace qlora::test {
namespace {

struct Fp4Blob {
  std::vector<uint8_t> blob, scales;
};

Fp4Blob packed_fp4(const Vec& w, int64_t rows, int64_t cols, QuantFormat f) {
  QuantParams p;
  p.format = f;
  const QuantizedTensor q = quantize_ref(w.data(), rows, cols, p);
  Fp4Blob b;
  b.blob.resize(size_t(quant_layout(p, rows, cols).total));
  pack_quantized(q, b.blob.data());
  b.scales = fp4_gemm_scales(q);
  return b;
}

// Tolerance: the activation's e2m1 codes and e4m3 scales are the same on both backends (the same
// recipe in the same f32 operation order on the same bf16 inputs: CudaEmuFp4 checks them bit for
// bit), products of decoded codes and scales are exact in f32, so the f32 summation order and y's
// bf16 rounding (u = 2^-8) are what differ.
CUDA_OP_TEST(matmul_fp4, equals_cpu_semantics) {
  QLORA_REQUIRE_CUDA(cu);
  if (!cu->has_fp4_gemm()) GTEST_SKIP() << "no block-scaled FP4 tensor cores on this GPU (matmul_fp4.refused_below_sm100 runs)";
  struct Shape { int64_t m, out, in; };
  uint64_t seed = 901;
  for (QuantFormat f : {QuantFormat::NVFP4, QuantFormat::MXFP4})
    for (const Shape s : {Shape{37, 96, 128}, Shape{1, 64, 32}, Shape{130, 8, 64}}) {
      SCOPED_TRACE(std::string(quant_format_name(f)) + " " + std::to_string(s.m) + "x" + std::to_string(s.out) + "x" +
                   std::to_string(s.in));
      const Vec x = round_bf16(randn(seed++, size_t(s.m * s.in), 3.0f));
      const Vec w = randn(seed++, size_t(s.out * s.in), 0.05f);
      const Fp4Blob b = packed_fp4(w, s.out, s.in, f);
      Vec want(size_t(s.m * s.out));
      auto cpu = make_cpu_backend();
      cpu->matmul_fp4({f32_view(want.data(), {s.m, s.out}), f32_view(const_cast<float*>(x.data()), {s.m, s.in}),
                       b.blob.data(), b.scales.data(), s.m, s.out, s.in});
      void* dblob = cu->alloc(b.blob.size());
      void* dsf = cu->alloc(b.scales.size());
      cu->copy_to_device(dblob, b.blob.data(), b.blob.size());
      cu->copy_to_device(dsf, b.scales.data(), b.scales.size());
      DBuf dx(*cu, DType::BF16, x), dy(*cu, DType::BF16, s.m * s.out);
      dy.poison();
      cu->matmul_fp4({dy.t({s.m, s.out}), dx.t({s.m, s.in}), dblob, dsf, s.m, s.out, s.in});
      const double acc = double(s.in) / 16777216.0;
      expect_close("matmul_fp4 vs cpu", dy.download(), want, {kBf16U, 1e-5 + 2 * acc, kBf16U + acc});
      cu->free(dblob);
      cu->free(dsf);
    }
}

// Below compute capability 10.x (and for shapes the FP4 kernels cannot take) the op refuses by
// name instead of computing something else.
CUDA_OP_TEST(matmul_fp4, refused_below_sm100_or_for_a_bad_shape) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t m = 4, out = 8, in = cu->has_fp4_gemm() ? 48 : 64;  // sm_100: in % 32 != 0
  const Fp4Blob b = packed_fp4(randn(5, size_t(out * in)), out, in, QuantFormat::NVFP4);
  void* dblob = cu->alloc(b.blob.size());
  void* dsf = cu->alloc(b.scales.size());
  cu->copy_to_device(dblob, b.blob.data(), b.blob.size());
  cu->copy_to_device(dsf, b.scales.data(), b.scales.size());
  DBuf dx(*cu, DType::BF16, randn(6, size_t(m * in))), dy(*cu, DType::BF16, m * out);
  try {
    cu->matmul_fp4({dy.t({m, out}), dx.t({m, in}), dblob, dsf, m, out, in});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    const std::string want = cu->has_fp4_gemm() ? "in % 32" : "needs 10.x";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  cu->free(dblob);
  cu->free(dsf);
}

}  // namespace
}  // namespace qlora::test
