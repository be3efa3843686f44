// CPU matmul (OpenBLAS sgemm) and the simple vector ops: add, bias_add, scale, sumsq.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_process.h"
#include "core/error.h"

namespace qlora {

static bool overlaps(const void* p, int64_t p_bytes, const void* q, int64_t q_bytes) {
  auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  return p_bytes > 0 && q_bytes > 0 && a < b + uintptr_t(q_bytes) && b < a + uintptr_t(p_bytes);
}

void CpuBackend::matmul(const MatmulArgs& a) {
  const char* op = "matmul";
  cpu::check_dim(op, "m", a.m);
  cpu::check_dim(op, "n", a.n);
  cpu::check_dim(op, "k", a.k);
  cpu::check_f32(op, "c", a.c, a.m * a.n);
  cpu::check_f32(op, "a", a.a, a.m * a.k);
  cpu::check_f32(op, "b", a.b, a.k * a.n);
  if (std::max({a.m, a.n, a.k}) > INT32_MAX)
    fail(ErrorKind::Unsupported, "cpu op matmul", "a dimension exceeds the 32-bit BLAS interface",
         "split the matmul into chunks");
  if (a.m == 0 || a.n == 0) return;
  float* c = a.c.f32();  // (m,n)
  const int64_t mn = a.m * a.n;
  if (overlaps(c, mn * 4, a.a.data, a.m * a.k * 4) || overlaps(c, mn * 4, a.b.data, a.k * a.n * 4))
    fail(ErrorKind::Internal, "cpu op matmul, tensor 'c'", "output overlaps an input",
         "matmul writes C while reading A and B; use a separate output buffer");
  // beta == 0 promises "=": clear C first so NaN/Inf garbage cannot survive as 0*NaN in any BLAS.
  if (a.beta == 0.0f) std::memset(c, 0, size_t(mn) * sizeof(float));
  if (a.k == 0) {
    if (a.beta != 0.0f && a.beta != 1.0f)
      for (int64_t i = 0; i < mn; i++) c[i] *= a.beta;
    return;
  }
  if (a.m == 1) {
    // One row (a decoded token): a matrix-vector product. sgemm would pack all of B for it, which
    // for a weight matrix is a full extra pass over memory.
    if (a.trans_b)  // c (n) = alpha B (n,k) a + beta c
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(a.n), int(a.k), a.alpha, a.b.f32(), int(a.k), a.a.f32(), 1, a.beta, c, 1);
    else  // c (n) = alpha B^T a + beta c, B (k,n)
      cblas_sgemv(CblasRowMajor, CblasTrans, int(a.k), int(a.n), a.alpha, a.b.f32(), int(a.n), a.a.f32(), 1, a.beta, c, 1);
    return;
  }
  const int lda = int(a.trans_a ? a.m : a.k);
  const int ldb = int(a.trans_b ? a.k : a.n);
  cblas_sgemm(CblasRowMajor, a.trans_a ? CblasTrans : CblasNoTrans, a.trans_b ? CblasTrans : CblasNoTrans,
              int(a.m), int(a.n), int(a.k), a.alpha, a.a.f32(), lda, a.b.f32(), ldb, a.beta, c, int(a.n));
}

std::string cpu::blas_info() {
  const int par = openblas_get_parallel();  // 0 sequential, 1 pthreads, 2 OpenMP
  std::string cfg = openblas_get_config();
  while (!cfg.empty() && cfg.back() == ' ') cfg.pop_back();
  const std::string replaced = cpu::blas_core_replaced();
  return cfg + " (" + (par == 2 ? "openmp" : par == 1 ? "pthreads" : "sequential") + " threads, core " +
         openblas_get_corename() +
         (replaced.empty() ? "" : ", chosen from the CPU's features in place of OpenBLAS's " + replaced) + ")";
}

void CpuBackend::add(const AddArgs& a) {
  cpu::check_dim("add", "n", a.n);
  cpu::check_f32("add", "y", a.y, a.n);
  cpu::check_f32("add", "x", a.x, a.n);
  float* y = a.y.f32();
  const float* x = a.x.f32();
#pragma omp parallel for schedule(static) if (a.n > cpu::kParallelMin)
  for (int64_t i = 0; i < a.n; i++) y[i] += x[i];
}

void CpuBackend::bias_add(const BiasAddArgs& a) {
  cpu::check_dim("bias_add", "n", a.n);
  cpu::check_dim("bias_add", "m", a.m);
  cpu::check_f32("bias_add", "y", a.y, a.n * a.m);
  cpu::check_f32("bias_add", "bias", a.bias, a.m);
  float* y = a.y.f32();  // (N,M)
  const float* bias = a.bias.f32();  // (M)
#pragma omp parallel for schedule(static) if (a.n * a.m > cpu::kParallelMin)
  for (int64_t i = 0; i < a.n; i++)
    for (int64_t j = 0; j < a.m; j++) y[i * a.m + j] += bias[j];
}

void CpuBackend::scale(const ScaleArgs& a) {
  cpu::check_dim("scale", "n", a.n);
  cpu::check_f32("scale", "x", a.x, a.n);
  float* x = a.x.f32();
#pragma omp parallel for schedule(static) if (a.n > cpu::kParallelMin)
  for (int64_t i = 0; i < a.n; i++) x[i] *= a.s;
}

void CpuBackend::sumsq(const SumsqArgs& a) {
  cpu::check_ptr("sumsq", "out", a.out);
  for (const Tensor& t : a.xs) cpu::check_f32("sumsq", "x", t, t.numel());
  double total = 0.0;
  for (const Tensor& t : a.xs) {  // tensor by tensor, each summed in a fixed order
    const float* x = t.f32();
    const int64_t n = t.numel();
    double s = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : s) if (n > cpu::kParallelMin)
    for (int64_t i = 0; i < n; i++) s += double(x[i]) * double(x[i]);
    total += s;
  }
  *a.out += total;
}

}  // namespace qlora
