// CPU matmul_fp8 against a scalar statement of its semantics (ops.h MatmulFp8Args): the activation
// quantized per tensor to e4m3 with current scaling, the weight's stored e4m3 codes and scale.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "quant/minifloat.h"
#include "quant/quant_layout.h"
#include "quant/quantize.h"

namespace qlora {
namespace {

std::vector<uint8_t> pack_fp8(const std::vector<float>& w, int64_t rows, int64_t cols, QuantizedTensor& q) {
  QuantParams p;
  p.format = QuantFormat::FP8_E4M3;
  q = quantize_ref(w.data(), rows, cols, p);
  std::vector<uint8_t> blob(size_t(quant_layout(p, rows, cols).total));
  pack_quantized(q, blob.data());
  return blob;
}

TEST(CpuOps, matmul_fp8_QuantizesTheActivationPerTensor) {
  auto cpu = make_cpu_backend();
  const int64_t m = 9, out = 24, in = 48;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(m * in)), w(size_t(out * in));
  for (float& v : x) v = 5.0f * nd(rng);
  for (float& v : w) v = 0.02f * nd(rng);
  QuantizedTensor q;
  const auto blob = pack_fp8(w, out, in, q);
  // FP8 codes come first in the packed layout, 16-byte aligned for cuBLASLt's FP8 kernels.
  EXPECT_EQ(quant_layout(q.params, out, in).data.offset, 0);
  std::vector<float> y(size_t(m * out), NAN), amax(1, NAN);
  cpu->matmul_fp8({Tensor(y.data(), DType::F32, {m, out}), Tensor(x.data(), DType::F32, {m, in}), blob.data(), m, out,
                   in, Tensor(amax.data(), DType::F32, {1})});
  float want_amax = 0;
  for (float v : x) want_amax = std::max(want_amax, std::fabs(v));
  EXPECT_EQ(amax[0], want_amax);
  const float s = 448.0f / want_amax;
  double err = 0, ref2 = 0, deq_err = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < out; j++) {
      double acc = 0, exact = 0;
      for (int64_t k = 0; k < in; k++) {
        const double xq = e4m3_to_f32(f32_to_e4m3(x[size_t(i * in + k)] * s, true));
        const double wq = e4m3_to_f32(q.data[size_t(j * in + k)]);
        acc += xq * wq;
        exact += double(x[size_t(i * in + k)]) * wq * q.scales_f32[0];
      }
      const double ref = acc * (1.0 / s) * q.scales_f32[0];
      err = std::max(err, std::fabs(y[size_t(i * out + j)] - ref));
      ref2 = std::max(ref2, std::fabs(ref));
      deq_err = std::max(deq_err, std::fabs(y[size_t(i * out + j)] - exact));
    }
  EXPECT_LE(err, 1e-5 * ref2);       // f32 summation of exact code products
  EXPECT_GT(deq_err, 1e-3 * ref2);   // not the unquantized activation
  EXPECT_LT(deq_err, 0.125 * ref2);  // within e4m3's rounding
}

TEST(CpuOps, matmul_fp8_ZeroActivationAndSaturation) {
  auto cpu = make_cpu_backend();
  const int64_t m = 2, out = 8, in = 16;
  std::vector<float> w(size_t(out * in), 0.5f), x(size_t(m * in), 0.0f), y(size_t(m * out), NAN);
  QuantizedTensor q;
  const auto blob = pack_fp8(w, out, in, q);
  cpu->matmul_fp8({Tensor(y.data(), DType::F32, {m, out}), Tensor(x.data(), DType::F32, {m, in}), blob.data(), m, out,
                   in, Tensor()});
  for (float v : y) EXPECT_EQ(v, 0.0f);  // amax 0: scale 1, no NaN from 448 / 0
  x.assign(x.size(), 1e30f);             // a huge activation: scale 448 / 1e30, codes 448, finite
  cpu->matmul_fp8({Tensor(y.data(), DType::F32, {m, out}), Tensor(x.data(), DType::F32, {m, in}), blob.data(), m, out,
                   in, Tensor()});
  for (float v : y) EXPECT_NEAR(v, 16 * 0.5e30f, 1e-5 * 16 * 0.5e30f);
}

}  // namespace
}  // namespace qlora
