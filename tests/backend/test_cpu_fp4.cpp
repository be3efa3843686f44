// CPU matmul_fp4 against a scalar statement of its semantics (ops.h MatmulFp4Args): the activation
// quantized to NVFP4 by the reference quantizer, the weight's stored e2m1 codes with the GEMM scales
// made at load (quant/fp4_gemm.h), for NVFP4 weights and MXFP4 weights repacked to NVFP4 scales.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "quant/fp4_gemm.h"
#include "quant/quant_layout.h"
#include "quant/quantize.h"

namespace qlora {
namespace {

struct Fp4Weight {
  QuantizedTensor q;
  std::vector<uint8_t> blob, scales;
};

Fp4Weight fp4_weight(const std::vector<float>& w, int64_t rows, int64_t cols, QuantFormat f) {
  Fp4Weight r;
  QuantParams p;
  p.format = f;
  r.q = quantize_ref(w.data(), rows, cols, p);
  r.blob.resize(size_t(quant_layout(p, rows, cols).total));
  pack_quantized(r.q, r.blob.data());
  r.scales = fp4_gemm_scales(r.q);
  return r;
}

std::vector<float> randn(uint32_t seed, size_t n, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// y = dequant(q(x)) dequant(w)^T in double, q the NVFP4 reference quantizer: the op's function.
std::vector<double> reference(const std::vector<float>& x, int64_t m, int64_t in, const QuantizedTensor& w) {
  QuantParams p;
  p.format = QuantFormat::NVFP4;
  const QuantizedTensor qx = quantize_ref(x.data(), m, in, p);
  std::vector<float> dx(x.size()), dw(size_t(w.rows * in));
  dequantize_ref(qx, dx.data());
  dequantize_ref(w, dw.data());
  std::vector<double> y(size_t(m * w.rows));
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < w.rows; j++) {
      double acc = 0;
      for (int64_t k = 0; k < in; k++) acc += double(dx[size_t(i * in + k)]) * dw[size_t(j * in + k)];
      y[size_t(i * w.rows + j)] = acc;
    }
  return y;
}

void check_format(QuantFormat f) {
  auto cpu = make_cpu_backend();
  const int64_t m = 11, out = 24, in = 96;
  std::vector<float> x = randn(3, size_t(m * in), 2.0f), w = randn(4, size_t(out * in), 0.03f);
  for (size_t i = 0; i < x.size(); i += 37) x[i] *= 20.0f;  // uneven block scales
  const Fp4Weight fw = fp4_weight(w, out, in, f);
  // e2m1 codes come first in the packed layout, where the GEMM reads them (16-byte aligned).
  EXPECT_EQ(quant_layout(fw.q.params, out, in).data.offset, 0);
  EXPECT_EQ(int64_t(fw.scales.size()), fp4_gemm_scales_bytes(out, in));
  std::vector<float> y(size_t(m * out), NAN);
  cpu->matmul_fp4({Tensor(y.data(), DType::F32, {m, out}), Tensor(x.data(), DType::F32, {m, in}), fw.blob.data(),
                   fw.scales.data(), m, out, in});
  const std::vector<double> ref = reference(x, m, in, fw.q);
  double err = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    err = std::max(err, std::fabs(y[i] - ref[i]));
    mag = std::max(mag, std::fabs(ref[i]));
  }
  ASSERT_GT(mag, 0.0);
  // Same codes and scales; only the f32 summation (in * 2^-24 of the partial sums) differs.
  EXPECT_LE(err, mag * (1e-6 + double(in) / 16777216.0));
  // The activation really is quantized: against x (unquantized) times the same weight the
  // e2m1 rounding shows (a few percent), and stays bounded.
  std::vector<float> dw(size_t(out * in));
  dequantize_ref(fw.q, dw.data());
  double e2 = 0, r2 = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < out; j++) {
      double acc = 0;
      for (int64_t k = 0; k < in; k++) acc += double(x[size_t(i * in + k)]) * dw[size_t(j * in + k)];
      e2 += (y[size_t(i * out + j)] - acc) * (y[size_t(i * out + j)] - acc);
      r2 += acc * acc;
    }
  EXPECT_GT(std::sqrt(e2 / r2), 0.01) << "x was not quantized to e2m1";
  EXPECT_LT(std::sqrt(e2 / r2), 0.25) << "beyond NVFP4's rounding of x";
}

TEST(CpuOps, matmul_fp4_NvFp4WeightEqualsItsSemantics) { check_format(QuantFormat::NVFP4); }
// MXFP4's e8m0 scales become e4m3 scales relative to a power-of-two decode scale: exactly the same
// weight values, so the reference (which dequantizes the MXFP4 tensor itself) holds as tightly.
TEST(CpuOps, matmul_fp4_MxFp4WeightRepackedExactly) { check_format(QuantFormat::MXFP4); }

// MXFP4 blocks more than 17 octaves below the tensor's largest block scale have no e4m3 scale
// relative to it: they are flushed to zero and counted; every other block keeps its value exactly.
TEST(CpuOps, matmul_fp4_MxFp4FarBlocksFlushed) {
  const int64_t out = 8, in = 64;
  std::vector<float> w = randn(9, size_t(out * in), 1.0f);
  for (int64_t c = 32; c < 64; c++) w[size_t(c)] *= std::ldexp(1.0f, -30);  // row 0, second block: tiny
  const Fp4Weight fw = fp4_weight(w, out, in, QuantFormat::MXFP4);
  int64_t flushed = -1;
  fp4_gemm_scales(fw.q, &flushed);
  EXPECT_EQ(flushed, 1);
  auto cpu = make_cpu_backend();
  std::vector<float> x(size_t(in), 0.0f), y(size_t(out), NAN);
  x[0] = 1.0f;  // y = w[:,0] through the GEMM: column 0 of each row, a normal block
  cpu->matmul_fp4({Tensor(y.data(), DType::F32, {1, out}), Tensor(x.data(), DType::F32, {1, in}), fw.blob.data(),
                   fw.scales.data(), 1, out, in});
  std::vector<float> dw(size_t(out * in));
  dequantize_ref(fw.q, dw.data());
  // x = e_0 quantizes exactly (code 6 times scale 448 times 1/2688); the decode scales' f32 products
  // leave a few ulps.
  for (int64_t j = 0; j < out; j++) EXPECT_NEAR(y[size_t(j)], dw[size_t(j * in)], 4e-7 * std::fabs(dw[size_t(j * in)])) << "row " << j;
}

TEST(CpuOps, matmul_fp4_RefusesInNotAMultipleOf16) {
  auto cpu = make_cpu_backend();
  std::vector<float> x(8 * 40, 1.0f), y(8 * 8);
  std::vector<uint8_t> blob(4096), scales(4096);
  try {
    cpu->matmul_fp4({Tensor(y.data(), DType::F32, {8, 8}), Tensor(x.data(), DType::F32, {8, 40}), blob.data(),
                     scales.data(), 8, 8, 40});
    ADD_FAILURE() << "in = 40 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(e.what()).find("multiple of 16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qlora
