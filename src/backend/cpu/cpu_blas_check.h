// A check of the BLAS kernels this process runs: OpenBLAS picks its sgemm per CPU at load time (or
// takes OPENBLAS_CORETYPE), and a kernel that computes wrong results on a CPU it misjudges must stop
// a run before it trains, not after.
#pragma once
#include <string>

namespace qlora::cpu {

// Row-major C (m,n) = alpha op(A) op(B) + beta C, as cblas_sgemm, and y = alpha op(B) x + beta y, as
// cblas_sgemv (trans_b: B is (n,k) and y = B x; else B is (k,n) and y = B^T x). The engine's calls.
struct BlasKernels {
  void (*sgemm)(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                const float* b, int ldb, float beta, float* c, int ldc);
  void (*sgemv)(bool trans_b, int n, int k, float alpha, const float* b, int ldb, const float* x, float beta,
                float* y);
};
BlasKernels openblas_kernels();

// What check_blas_kernels found. ratio is an element's error against the double-precision product
// over its rounding bound (k + 2) u (|alpha| sum_l |a_il b_lj| + |beta c_ij|), u = 2^-24, which any
// summation order and any use of FMA stays inside; a kernel within it has ratio <= 1.
struct BlasCheck {
  int cases = 0;
  double worst_ratio = 0;   // over all elements of all cases
  std::string worst_case;   // the case where it was found, e.g. "LoRA down-projection x A^T (512x16, k 960)"
  bool ok() const { return worst_ratio <= 1.0; }
};

// Runs the engine's GEMM shapes on seeded data (none zero) through kernels and compares each with
// the product in double: the LoRA GEMMs (rank 16, forward, into an accumulated output, and their
// gradients), a projection, the attention tiles on strided views (leading dimension heads x
// head_dim) with long K for the key/value gradients, odd sizes that reach the kernels' edge code,
// and the one-row products (sgemv) of decoding. About 17 million multiply-adds in double.
BlasCheck check_blas_kernels(const BlasKernels& kernels);

// check_blas_kernels(openblas_kernels()), once per process: the note `qlora train` prints on the
// CPU ("sgemm (OpenBLAS ... core Cooperlake) checked on 10 engine shapes: worst error 0.02 of the
// rounding bound"); a kernel outside the bound is Error(Unsupported) naming the case and the core,
// with the remedy (another OPENBLAS_CORETYPE).
std::string verify_blas_kernels();

}  // namespace qlora::cpu
