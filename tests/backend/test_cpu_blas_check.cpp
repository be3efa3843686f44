// The BLAS kernel check (backend/cpu/cpu_blas_check.h): the kernels OpenBLAS runs on this CPU pass it
// with a real, non-zero rounding error; kernels that lose precision, drop an edge or ignore beta fail
// it, naming the shape; a kernel that rounds only once sits far inside the bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_blas_check.h"

namespace qlora::cpu {
namespace {

enum class Fault { None, Bf16Inputs, LastColumnOfOddN, IgnoresBetaInSgemv, Double };
Fault g_fault = Fault::None;

float bf16(float x) {  // round to nearest even on the top 16 bits
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// A plain row-major sgemm (f32 sums, or double rounded once for Fault::Double) with the fault in force.
void plain_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
                 float beta, float* c, int ldc) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      if (g_fault == Fault::LastColumnOfOddN && n % 2 == 1 && j == n - 1) continue;
      double sd = 0;
      float sf = 0;
      for (int l = 0; l < k; l++) {
        float x = ta ? a[l * lda + i] : a[i * lda + l], y = tb ? b[j * ldb + l] : b[l * ldb + j];
        if (g_fault == Fault::Bf16Inputs) x = bf16(x), y = bf16(y);
        sd += double(x) * y;
        sf += x * y;
      }
      float& out = c[i * ldc + j];
      out = g_fault == Fault::Double ? float(double(alpha) * sd + double(beta) * out) : alpha * sf + beta * out;
    }
}

void plain_sgemv(bool tb, int n, int k, float alpha, const float* b, int ldb, const float* x, float beta, float* y) {
  const float keep = g_fault == Fault::IgnoresBetaInSgemv ? 0.0f : beta;
  // y (1,n) = x (1,k) op(B): the same as a one-row sgemm.
  plain_sgemm(false, tb, 1, n, k, alpha, x, k, b, ldb, keep, y, n);
}

BlasCheck check_with(Fault f) {
  g_fault = f;
  const BlasCheck r = check_blas_kernels({plain_sgemm, plain_sgemv});
  g_fault = Fault::None;
  return r;
}

TEST(CpuBlasCheck, OpenBlasOnThisCpuRoundsInsideTheBound) {
  const BlasCheck r = check_blas_kernels(openblas_kernels());
  EXPECT_EQ(r.cases, 10);
  EXPECT_TRUE(r.ok()) << r.worst_case << ": " << r.worst_ratio;
  // The kernels round: the check measures a real error, not a comparison of equal numbers.
  EXPECT_GT(r.worst_ratio, 1e-6) << r.worst_case;
}

TEST(CpuBlasCheck, PlainF32SumsRoundInsideTheBound) {
  const BlasCheck r = check_with(Fault::None);
  EXPECT_TRUE(r.ok()) << r.worst_case << ": " << r.worst_ratio;
  EXPECT_GT(r.worst_ratio, 1e-6);
}

TEST(CpuBlasCheck, OneRoundingOfTheExactProductIsFarInsideTheBound) {
  // A single rounding is at most u |c| <= u sum |terms|, 1/(k + 4) of the bound; k >= 16 here.
  const BlasCheck r = check_with(Fault::Double);
  EXPECT_LE(r.worst_ratio, 1.0 / 20) << r.worst_case;
  EXPECT_GT(r.worst_ratio, 0.0);
}

TEST(CpuBlasCheck, KernelsThatLosePrecisionFail) {
  const BlasCheck r = check_with(Fault::Bf16Inputs);
  EXPECT_FALSE(r.ok());
  EXPECT_GT(r.worst_ratio, 10.0);
}

TEST(CpuBlasCheck, AKernelWrongAtAnEdgeFailsNamingTheShape) {
  const BlasCheck r = check_with(Fault::LastColumnOfOddN);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.worst_case.find("odd sizes"), std::string::npos) << r.worst_case;
  EXPECT_NE(r.worst_case.find("37x29, k 1031"), std::string::npos) << r.worst_case;
}

TEST(CpuBlasCheck, ASgemvThatDropsTheAccumulatedOutputFails) {
  const BlasCheck r = check_with(Fault::IgnoresBetaInSgemv);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.worst_case.find("one decoded row"), std::string::npos) << r.worst_case;
}

TEST(CpuBlasCheck, TheStartUpNoteNamesTheKernelCore) {
  const std::string note = verify_blas_kernels();
  EXPECT_NE(note.find("core "), std::string::npos) << note;
  EXPECT_NE(note.find("checked on 10 engine shapes"), std::string::npos) << note;
}

}  // namespace
}  // namespace qlora::cpu
