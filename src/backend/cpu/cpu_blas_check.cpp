// The engine's GEMM shapes through the BLAS kernels this process runs, against the product in double.
#include "backend/cpu/cpu_blas_check.h"

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace qlora::cpu {
namespace {

void openblas_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                    int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b,
              ldb, beta, c, ldc);
}

void openblas_sgemv(bool tb, int n, int k, float alpha, const float* b, int ldb, const float* x, float beta,
                    float* y) {
  if (tb)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, alpha, b, ldb, x, 1, beta, y, 1);
  else
    cblas_sgemv(CblasRowMajor, CblasTrans, k, n, alpha, b, ldb, x, 1, beta, y, 1);
}

// One product of the engine. lda/ldb/ldc 0: the dense leading dimension. m == 1 with trans_a false
// goes through sgemv, as CpuBackend::matmul sends a one-row product.
struct Case {
  const char* what;
  int m, n, k;
  bool trans_a, trans_b;
  int lda, ldb, ldc;
  float alpha, beta;
};

constexpr int kHeads = 9, kHeadDim = 64, kRowWidth = kHeads * kHeadDim;  // a (T, heads x head_dim) buffer

constexpr Case kCases[] = {
    {"LoRA down-projection x A^T", 256, 16, 576, false, true, 0, 0, 0, 1.0f, 0.0f},
    {"LoRA up-projection into the base output (x A^T) B^T", 256, 576, 16, false, true, 0, 0, 0, 2.0f, 1.0f},
    {"LoRA B gradient dY^T (x A^T)", 576, 16, 256, true, false, 0, 0, 0, 1.0f, 1.0f},
    {"LoRA A gradient over a long sequence (dY B)^T x", 16, 256, 1024, true, false, 0, 0, 0, 1.0f, 0.0f},
    {"attention scores Q K^T on strided heads", 64, 256, kHeadDim, false, true, kRowWidth, kRowWidth, 0, 0.125f, 0.0f},
    {"attention output P V on strided heads", 64, kHeadDim, 256, false, false, 0, kRowWidth, kRowWidth, 1.0f, 1.0f},
    {"attention key gradient over a long sequence dS^T Q", 64, kHeadDim, 1024, true, false, 0, kRowWidth, 0, 0.125f,
     1.0f},
    {"odd sizes at the kernels' edges", 37, 29, 1031, false, false, 1034, 32, 31, -1.5f, 0.5f},
    {"one decoded row through a projection W x", 1, 576, 1536, false, true, 0, 0, 0, 1.0f, 0.0f},
    {"one decoded row through a transposed product B^T x", 1, 576, 1536, false, false, 0, 0, 0, 1.0f, 1.0f},
};

// Seeded values in [-1, -1/16] U [1/16, 1]: none zero, none tiny, so every product term is a signal.
struct Values {
  uint64_t s;
  float next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const float u = float(s >> 40) / float(1 << 24);  // [0, 1)
    const float mag = 0.0625f + 0.9375f * u;
    return (s & 1) ? -mag : mag;
  }
  std::vector<float> fill(size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = next();
    return v;
  }
};

// The worst element of one case: |c - exact| over (k + 4) u (|alpha| sum |a b| + |beta c0|). The
// dot product's rounding is bounded by k u times the sum of |terms| for any order of summation (FMA
// only lowers it); alpha, beta and the final addition add a rounding each.
double case_ratio(const Case& c, const BlasKernels& kernels, uint64_t seed) {
  const int lda = c.lda ? c.lda : (c.trans_a ? c.m : c.k);
  const int ldb = c.ldb ? c.ldb : (c.trans_b ? c.k : c.n);
  const int ldc = c.ldc ? c.ldc : c.n;
  const int a_rows = c.trans_a ? c.k : c.m, b_rows = c.trans_b ? c.n : c.k;
  Values v{seed};
  const std::vector<float> a = v.fill(size_t(a_rows) * size_t(lda)), b = v.fill(size_t(b_rows) * size_t(ldb));
  const std::vector<float> c0 = v.fill(size_t(c.m) * size_t(ldc));
  std::vector<float> out = c0;
  if (c.m == 1 && !c.trans_a)
    kernels.sgemv(c.trans_b, c.n, c.k, c.alpha, b.data(), ldb, a.data(), c.beta, out.data());
  else
    kernels.sgemm(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta, out.data(), ldc);
  // op(B) as a dense (k, n) matrix in double, then row i of op(A) times it.
  std::vector<double> opb(size_t(c.k) * size_t(c.n));
  for (int l = 0; l < c.k; l++)
    for (int j = 0; j < c.n; j++) opb[size_t(l) * c.n + j] = c.trans_b ? b[size_t(j) * ldb + l] : b[size_t(l) * ldb + j];
  const double u = std::ldexp(1.0, -24), gamma = (c.k + 4) * u;
  double worst = 0;
  std::vector<double> sum(size_t(c.n)), mag(size_t(c.n));
  for (int i = 0; i < c.m; i++) {
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(mag.begin(), mag.end(), 0.0);
    for (int l = 0; l < c.k; l++) {
      const double ail = c.trans_a ? a[size_t(l) * lda + i] : a[size_t(i) * lda + l];
      const double* row = &opb[size_t(l) * c.n];
      for (int j = 0; j < c.n; j++) {
        sum[size_t(j)] += ail * row[j];
        mag[size_t(j)] += std::fabs(ail * row[j]);
      }
    }
    for (int j = 0; j < c.n; j++) {
      const size_t at = size_t(i) * ldc + j;
      const double exact = double(c.alpha) * sum[size_t(j)] + double(c.beta) * c0[at];
      const double bound = gamma * (std::fabs(c.alpha) * mag[size_t(j)] + std::fabs(c.beta) * std::fabs(c0[at]));
      const double err = std::fabs(double(out[at]) - exact);
      const double ratio = std::isfinite(out[at]) ? err / bound : INFINITY;
      if (!(ratio <= worst)) worst = ratio;  // NaN counts as the worst
    }
  }
  return worst;
}

std::string describe(const Case& c) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s (%dx%d, k %d%s%s)", c.what, c.m, c.n, c.k, c.trans_a ? ", A transposed" : "",
                c.trans_b ? ", B transposed" : "");
  return buf;
}

}  // namespace

BlasKernels openblas_kernels() { return {openblas_sgemm, openblas_sgemv}; }

BlasCheck check_blas_kernels(const BlasKernels& kernels) {
  BlasCheck r;
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (const Case& c : kCases) {
    const double ratio = case_ratio(c, kernels, seed += 0x632BE59BD9B4E5ull);
    r.cases++;
    if (r.worst_case.empty() || !(ratio <= r.worst_ratio)) {
      r.worst_ratio = std::isnan(ratio) ? INFINITY : ratio;
      r.worst_case = describe(c);
    }
  }
  return r;
}

std::string verify_blas_kernels() {
  static std::once_flag once;
  static BlasCheck checked;
  std::call_once(once, [] { checked = check_blas_kernels(openblas_kernels()); });
  const std::string blas = blas_info();
  if (!checked.ok())
    fail(ErrorKind::Unsupported, "BLAS kernels: " + blas,
         "sgemm computes wrong results on this CPU: " + checked.worst_case + " is off by " +
             std::to_string(checked.worst_ratio) + " times its rounding bound",
         "run with another OpenBLAS kernel core, e.g. OPENBLAS_CORETYPE=Haswell (AVX2) or Prescott (SSE3), or "
         "unset OPENBLAS_CORETYPE (docs/cpu_backend.md)");
  char buf[96];
  std::snprintf(buf, sizeof buf, " checked on %d engine shapes: worst error %.2g of the rounding bound", checked.cases,
                checked.worst_ratio);
  return "sgemm (" + blas + ")" + buf;
}

}  // namespace qlora::cpu
