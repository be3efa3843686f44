// CPU matmul against triple loops (all transposes, alpha/beta) and the vector ops against direct loops.
#include <limits>

#include "backend_test_util.h"

namespace qlora::test {
namespace {

// C = alpha*op(A)op(B) + beta*C in double, reading A/B in their stored layouts.
std::vector<double> matmul_ref(const Vec& a, const Vec& b, const Vec& c0, int64_t m, int64_t n, int64_t k,
                               bool ta, bool tb, double alpha, double beta) {
  std::vector<double> c(size_t(m * n));
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; p++) {
        const double av = ta ? a[size_t(p * m + i)] : a[size_t(i * k + p)];
        const double bv = tb ? b[size_t(j * k + p)] : b[size_t(p * n + j)];
        acc += av * bv;
      }
      c[size_t(i * n + j)] = alpha * acc + (beta == 0.0 ? 0.0 : beta * c0[size_t(i * n + j)]);
    }
  return c;
}

void check_matmul(int64_t m, int64_t n, int64_t k) {
  auto be = cpu();
  Rng rng(uint64_t(m * 1000 + n * 10 + k));
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (float beta : {0.0f, 1.0f, 0.5f})
        for (float alpha : {1.0f, -0.75f}) {
          Vec a = randn(rng, size_t(m * k)), b = randn(rng, size_t(k * n)), c = randn(rng, size_t(m * n));
          // beta=0 promises "=": garbage (NaN) in C must not leak into the result.
          if (beta == 0.0f) std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
          auto want = matmul_ref(a, b, c, m, n, k, ta, tb, alpha, beta);
          MatmulArgs args;
          args.c = view(c, {m, n});
          args.a = ta ? view(a, {k, m}) : view(a, {m, k});
          args.b = tb ? view(b, {n, k}) : view(b, {k, n});
          args.m = m, args.n = n, args.k = k, args.trans_a = ta, args.trans_b = tb;
          args.alpha = alpha, args.beta = beta;
          be->matmul(args);
          // f32 GEMM vs double: error grows like sqrt(k) * eps * |terms|; terms are O(1).
          const double tol = 4e-7 * double(k) + 1e-6;
          expect_close(c, want, tol, 1e-5,
                       "matmul m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                           " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                           " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta));
        }
}

TEST(CpuOps, matmul_AllTransposesAlphaBeta) {
  check_matmul(7, 5, 9);
  check_matmul(1, 13, 3);
  check_matmul(1, 300, 257);  // one row: the gemv path
  check_matmul(66, 47, 129);
}

TEST(CpuOps, matmul_EmptyInnerDimScalesC) {
  auto be = cpu();
  Vec a(1), b(1), c = {1.0f, -2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  MatmulArgs args;
  args.c = view(c, {2, 3});
  args.a = Tensor(a.data(), DType::F32, {2, 0});
  args.b = Tensor(b.data(), DType::F32, {0, 3});
  args.m = 2, args.n = 3, args.k = 0, args.beta = 0.5f;
  be->matmul(args);
  EXPECT_EQ(c, (Vec{0.5f, -1.0f, 1.5f, 2.0f, 2.5f, 3.0f}));
}

TEST(CpuOps, matmul_RejectsOutputAliasingInput) {
  auto be = cpu();
  Vec a(16, 1.0f);
  MatmulArgs args;
  args.c = view(a, {4, 4});
  args.a = view(a, {4, 4});
  args.b = view(a, {4, 4});
  args.m = args.n = args.k = 4;
  EXPECT_THROW(be->matmul(args), Error);
}

TEST(CpuOps, add_AccumulatesIntoY) {
  auto be = cpu();
  Rng rng(1);
  for (int64_t n : {int64_t(37), int64_t(100003)}) {  // below and above the OpenMP threshold
    Vec y = randn(rng, size_t(n)), x = randn(rng, size_t(n));
    std::vector<double> want(static_cast<size_t>(n));
    for (size_t i = 0; i < want.size(); i++) want[i] = double(y[i]) + double(x[i]);
    be->add({view(y, {n}), view(x, {n}), n});
    expect_close(y, want, 0.0, 6e-8, "add n=" + std::to_string(n));
  }
}

TEST(CpuOps, bias_add_BroadcastsOverRows) {
  auto be = cpu();
  Rng rng(2);
  const int64_t n = 301, m = 67;
  Vec y = randn(rng, size_t(n * m)), bias = randn(rng, size_t(m));
  std::vector<double> want(y.size());
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < m; j++) want[size_t(i * m + j)] = double(y[size_t(i * m + j)]) + double(bias[size_t(j)]);
  be->bias_add({view(y, {n, m}), view(bias, {m}), n, m});
  expect_close(y, want, 0.0, 6e-8, "bias_add");
}

TEST(CpuOps, scale_MultipliesInPlace) {
  auto be = cpu();
  Rng rng(3);
  for (int64_t n : {int64_t(5), int64_t(70001)}) {
    Vec x = randn(rng, size_t(n));
    std::vector<double> want(x.begin(), x.end());
    for (auto& w : want) w *= -0.375;
    be->scale({view(x, {n}), n, -0.375f});
    expect_close(x, want, 0.0, 6e-8, "scale");
  }
}

TEST(CpuOps, sumsq_AccumulatesInDouble) {
  auto be = cpu();
  Rng rng(4);
  const int64_t n = 200001;
  Vec x = randn(rng, size_t(n), 3.0f);
  long double want = 1.25L;  // "+=" into a prior value
  for (float v : x) want += (long double)v * (long double)v;
  double out = 1.25;
  be->sumsq({{f32_view(x.data(), {n / 2}), f32_view(x.data() + n / 2, {n - n / 2})}, &out});  // two tensors, one sum
  // An f32 accumulator would be off by ~1e-5 relative at this n.
  EXPECT_NEAR(out, double(want), 1e-12 * double(want));
}

}  // namespace
}  // namespace qlora::test
