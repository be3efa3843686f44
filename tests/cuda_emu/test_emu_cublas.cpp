// The host harness's cuBLASLt / cuBLAS (tests/support/cuda_emu/emu_cublas.cpp) against a naive
// double-precision reference: transposes, odd shapes, leading dimensions, strided batches,
// beta handling, epilogues, FP8 scaling, and the documented rejections (types, layouts,
// alignment, memory outside device allocations, FP8 architecture and "TN" rules).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "emu_arch_scope.h"
#include "quant/block_scale_layout.h"
#include "quant/quantize.h"

namespace {

// ---- Element encoding: host values are kept as the exact decoded value of what the device holds.
size_t esize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : (t == CUDA_R_16F || t == CUDA_R_16BF) ? 2 : 1; }
void put(std::vector<uint8_t>& bytes, cudaDataType_t t, size_t i, float v) {
  uint8_t* p = bytes.data() + i * esize(t);
  switch (t) {
    case CUDA_R_32F: std::memcpy(p, &v, 4); break;
    case CUDA_R_16F: {
      __half h = __float2half_rn(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case CUDA_R_16BF: {
      __nv_bfloat16 h = __float2bfloat16_rn(v);
      std::memcpy(p, &h, 2);
      break;
    }
    default: *p = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, t == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2);
  }
}
float get(const std::vector<uint8_t>& bytes, cudaDataType_t t, size_t i) {
  const uint8_t* p = bytes.data() + i * esize(t);
  switch (t) {
    case CUDA_R_32F: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case CUDA_R_16F: {
      __half h;
      std::memcpy(&h, p, 2);
      return __half2float(h);
    }
    case CUDA_R_16BF: {
      __nv_bfloat16 h;
      std::memcpy(&h, p, 2);
      return __bfloat162float(h);
    }
    default: return __half2float(__half(__nv_cvt_fp8_to_halfraw(*p, t == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2)));
  }
}

// ---- Device memory through the CUDA runtime (the harness's, or a stand-in).
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) { EXPECT_EQ(cudaMalloc(&p, n ? n : 1), cudaSuccess); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  void upload(const std::vector<uint8_t>& v) {
    ASSERT_EQ(cudaMemcpy(p, v.data(), v.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> v(bytes);
    EXPECT_EQ(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  template <class T = void>
  T* at(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(p) + byte_offset);
  }
};

using qlora::emu_test::ArchScope;

// ---- A matrix as stored: shape, order, leading dimension and batches.
struct Mat {
  cudaDataType_t type = CUDA_R_32F;
  int64_t rows = 0, cols = 0, ld = 0;
  bool row_major = false;
  int batch = 1;
  int64_t stride = 0;
  int64_t at(int64_t r, int64_t c) const { return row_major ? r * ld + c : r + c * ld; }
  int64_t span() const { return row_major ? (rows - 1) * ld + cols : (cols - 1) * ld + rows; }
  size_t elems() const { return size_t((batch - 1) * stride + span()); }
  size_t bytes() const { return elems() * esize(type); }
};
Mat make(cudaDataType_t t, int64_t rows, int64_t cols, int pad, bool row_major, int batch, int bpad) {
  Mat m{t, rows, cols, (row_major ? cols : rows) + pad, row_major, batch, 0};
  if (batch > 1) m.stride = m.span() + bpad;
  return m;
}
std::vector<uint8_t> random_bytes(const Mat& m, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint8_t> b(m.bytes());
  for (size_t i = 0; i < m.elems(); ++i) put(b, m.type, i, u(rng));
  return b;
}

struct Lt {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t l[4] = {};
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t res{};
  int count = -1;
  explicit Lt(bool ta, bool tb, const Mat* m[4], uint32_t align = 16) {
    EXPECT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    set(CUBLASLT_MATMUL_DESC_TRANSA, a);
    set(CUBLASLT_MATMUL_DESC_TRANSB, b);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(cublasLtMatrixLayoutCreate(&l[i], m[i]->type, uint64_t(m[i]->rows), uint64_t(m[i]->cols), m[i]->ld),
                CUBLAS_STATUS_SUCCESS);
      const int32_t order = m[i]->row_major ? CUBLASLT_ORDER_ROW : CUBLASLT_ORDER_COL;
      const int32_t batch = m[i]->batch;
      EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_ORDER, &order, 4), CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, 4),
                CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m[i]->stride, 8),
                CUBLAS_STATUS_SUCCESS);
    }
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    const uint64_t ws = 1 << 20;
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, 8),
              CUBLAS_STATUS_SUCCESS);
    if (align)
      set_align(align, align, align, align);
    else  // 0: each matrix's element size, the least a strided batch of odd stride guarantees
      set_align(uint32_t(esize(m[0]->type)), uint32_t(esize(m[1]->type)), uint32_t(esize(m[2]->type)),
                uint32_t(esize(m[3]->type)));
  }
  ~Lt() {
    cublasLtMatmulPreferenceDestroy(pref);
    for (auto x : l) cublasLtMatrixLayoutDestroy(x);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
  }
  template <class T>
  void set(cublasLtMatmulDescAttributes_t a, const T& v) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, a, &v, sizeof(v)), CUBLAS_STATUS_SUCCESS);
  }
  void set_align(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    const uint32_t v[4] = {a, b, c, d};
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(
          cublasLtMatmulPreferenceSetAttribute(
              pref, cublasLtMatmulPreferenceAttributes_t(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i), &v[i], 4),
          CUBLAS_STATUS_SUCCESS);
  }
  cublasStatus_t heuristic() {
    return cublasLtMatmulAlgoGetHeuristic(h, op, l[0], l[1], l[2], l[3], pref, 1, &res, &count);
  }
  cublasStatus_t matmul(float alpha, const void* A, const void* B, float beta, const void* C, void* D) {
    Dev ws(1 << 20);
    return cublasLtMatmul(h, op, &alpha, A, l[0], B, l[1], &beta, C, l[2], D, l[3], &res.algo, ws.p, ws.bytes, nullptr);
  }
};

// ---- One GEMM end to end: random operands, the emulated cuBLASLt, a double reference.
struct Spec {
  cudaDataType_t at = CUDA_R_32F, bt = CUDA_R_32F, ct = CUDA_R_32F, dt = CUDA_R_32F;
  bool ta = false, tb = false, row_major = false;
  int m = 7, n = 13, k = 33, pad = 0, d_pad = 1, batch = 1, bpad = 0;
  float alpha = 1.0f, beta = 0.0f, scale_a = 1.0f, scale_b = 1.0f, scale_d = 1.0f;  // scale_d: FP8 D only
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool nan_c = false, in_place = false;
};

// Returns max |D - ref| / max |ref| (NaN when D holds a NaN); fails the test on a bad status.
double run_case(const Spec& s) {
  std::mt19937 rng(1234 + s.m * 7 + s.n * 13 + s.k + s.ta * 2 + s.tb);
  const Mat A = make(s.at, s.ta ? s.k : s.m, s.ta ? s.m : s.k, s.pad, s.row_major, s.batch, s.bpad);
  const Mat B = make(s.bt, s.tb ? s.n : s.k, s.tb ? s.k : s.n, s.pad, s.row_major, s.batch, s.bpad);
  const Mat C = make(s.ct, s.m, s.n, s.pad, s.row_major, s.batch, s.bpad);
  const Mat D = s.in_place ? C : make(s.dt, s.m, s.n, s.pad + s.d_pad, s.row_major, s.batch, s.bpad + 3);
  const bool fp8_d = s.dt == CUDA_R_8F_E4M3 || s.dt == CUDA_R_8F_E5M2;
  const auto ha = random_bytes(A, rng), hb = random_bytes(B, rng);
  auto hc = random_bytes(C, rng);
  if (s.nan_c)
    for (size_t i = 0; i < C.elems(); ++i) put(hc, C.type, i, std::numeric_limits<float>::quiet_NaN());
  const cudaDataType_t bias_t = fp8_d ? s.ct : s.dt;  // FP8 D: the bias has C's type
  std::vector<uint8_t> hbias(size_t(s.m) * esize(bias_t));
  for (int i = 0; i < s.m; ++i) put(hbias, bias_t, size_t(i), 0.25f * float(i % 5) - 0.5f);
  Dev da(A.bytes()), db(B.bytes()), dc(C.bytes()), dd(D.bytes()), dbias(hbias.size()), dscale(16);
  da.upload(ha), db.upload(hb), dc.upload(hc), dbias.upload(hbias);
  const float scales[4] = {s.scale_a, s.scale_b, s.scale_d, -1.0f};  // A, B, D scales; amax of D
  EXPECT_EQ(cudaMemcpy(dscale.p, scales, 16, cudaMemcpyHostToDevice), cudaSuccess);
  const Mat* mats[4] = {&A, &B, &C, &D};
  Lt lt(s.ta, s.tb, mats, s.batch > 1 ? 0 : 16);
  lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, s.epilogue);
  if (s.epilogue & CUBLASLT_EPILOGUE_BIAS) lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, dbias.p);
  if (s.scale_a != 1.0f || s.scale_b != 1.0f) {
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(dscale.at<float>()));
    lt.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(dscale.at<float>(4)));
  }
  if (fp8_d) {
    lt.set(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(dscale.at<float>(8)));
    lt.set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(dscale.at<float>(12)));
  }
  EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.count, 1);
  void* dptr = s.in_place ? dc.p : dd.p;
  EXPECT_EQ(lt.matmul(s.alpha, da.p, db.p, s.beta, dc.p, dptr), CUBLAS_STATUS_SUCCESS);
  const auto out = s.in_place ? dc.download() : dd.download();
  double max_ref = 0.0, max_err = 0.0, amax = 0.0;
  for (int bi = 0; bi < s.batch; ++bi)
    for (int i = 0; i < s.m; ++i)
      for (int j = 0; j < s.n; ++j) {
        double acc = 0.0;
        for (int p = 0; p < s.k; ++p) {
          const double a = get(ha, A.type, size_t(bi * A.stride + (s.ta ? A.at(p, i) : A.at(i, p))));
          const double b = get(hb, B.type, size_t(bi * B.stride + (s.tb ? B.at(j, p) : B.at(p, j))));
          acc += a * b;
        }
        double ref = s.alpha * s.scale_a * s.scale_b * acc;
        if (s.beta != 0.0f) ref += s.beta * get(hc, C.type, size_t(bi * C.stride + C.at(i, j)));
        if (s.epilogue & CUBLASLT_EPILOGUE_BIAS) ref += get(hbias, bias_t, size_t(i));
        if (s.epilogue & CUBLASLT_EPILOGUE_RELU) ref = std::max(ref, 0.0);
        if (s.epilogue & CUBLASLT_EPILOGUE_GELU) ref = 0.5 * ref * (1.0 + std::erf(ref / std::sqrt(2.0)));
        amax = std::max(amax, std::fabs(ref));
        if (fp8_d) ref *= s.scale_d;
        const double got = get(out, D.type, size_t(bi * D.stride + D.at(i, j)));
        if (std::isnan(got)) return std::numeric_limits<double>::quiet_NaN();
        max_ref = std::max(max_ref, std::fabs(ref));
        max_err = std::max(max_err, std::fabs(got - ref));
      }
  if (fp8_d) {
    float amax_d = 0;
    EXPECT_EQ(cudaMemcpy(&amax_d, dscale.at<float>(12), 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_NEAR(amax_d, amax, 1e-5 * amax) << "amax of D before its scale";
  }
  return max_err / std::max(max_ref, 1e-30);
}

constexpr double kF32Tol = 1e-5, kBf16Tol = 1.0 / 256, kF16Tol = 1.0 / 2048;

TEST(EmuCublasLt, F32AllTransposesOddShapesPaddedLd) {
  for (int t = 0; t < 4; ++t) {
    Spec s;
    s.ta = t & 1, s.tb = t & 2, s.pad = 5;
    EXPECT_LE(run_case(s), kF32Tol) << "ta " << s.ta << " tb " << s.tb;
  }
}

TEST(EmuCublasLt, Bf16AndF16AllTransposes) {
  for (int t = 0; t < 4; ++t)
    for (cudaDataType_t out : {CUDA_R_16BF, CUDA_R_32F}) {
      Spec s;
      s.at = s.bt = CUDA_R_16BF, s.ct = s.dt = out, s.ta = t & 1, s.tb = t & 2, s.pad = t;
      EXPECT_LE(run_case(s), out == CUDA_R_32F ? kF32Tol : kBf16Tol) << "ta " << s.ta << " tb " << s.tb;
      s.at = s.bt = CUDA_R_16F, s.ct = s.dt = out == CUDA_R_32F ? CUDA_R_32F : CUDA_R_16F;
      EXPECT_LE(run_case(s), out == CUDA_R_32F ? kF32Tol : kF16Tol) << "f16 ta " << s.ta << " tb " << s.tb;
    }
}

TEST(EmuCublasLt, RowOrderLayouts) {
  Spec s;
  s.row_major = true, s.tb = true, s.pad = 3, s.at = s.bt = CUDA_R_16BF, s.ct = s.dt = CUDA_R_16BF;
  EXPECT_LE(run_case(s), kBf16Tol);
}

TEST(EmuCublasLt, StridedBatchesAccumulate) {
  Spec s;
  s.batch = 3, s.bpad = 11, s.pad = 2, s.beta = 1.0f, s.alpha = 0.5f, s.ta = true;
  EXPECT_LE(run_case(s), kF32Tol);
  s.at = s.bt = s.ct = s.dt = CUDA_R_16BF, s.in_place = true, s.beta = -2.0f;
  EXPECT_LE(run_case(s), kBf16Tol);
}

TEST(EmuCublasLt, BetaZeroDoesNotReadC) {
  Spec s;
  s.nan_c = true, s.at = s.bt = s.ct = s.dt = CUDA_R_16BF;
  EXPECT_LE(run_case(s), kBf16Tol);  // NaN in C must not reach D
  s.in_place = true;
  EXPECT_LE(run_case(s), kBf16Tol);
  s.beta = 1.0f;
  EXPECT_TRUE(std::isnan(run_case(s)));  // ... but beta != 0 reads it
}

TEST(EmuCublasLt, BiasAndActivationEpilogues) {
  for (uint32_t e :
       {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_GELU_BIAS}) {
    Spec s;
    s.epilogue = e, s.at = s.bt = CUDA_R_16BF, s.ct = s.dt = CUDA_R_16BF, s.beta = 1.0f;
    // GELU: the emulation uses the tanh form; it is within 1e-3 of the erf form used by the reference.
    EXPECT_LE(run_case(s), e == CUBLASLT_EPILOGUE_GELU_BIAS ? 2e-3 + kBf16Tol : kBf16Tol) << "epilogue " << e;
    s.ct = s.dt = CUDA_R_32F;
    EXPECT_LE(run_case(s), e == CUBLASLT_EPILOGUE_GELU_BIAS ? 2e-3 : kF32Tol) << "f32 epilogue " << e;
  }
}

// The backend's mapping (cuda_matmul.cu lt_matmul): row-major C (m,n) = A (m,k) x B^T with B
// stored (n,k) is cuBLASLt's D (n,m) = op(B) op(A) with TRANSA = T over our B.
TEST(EmuCublasLt, BackendRowMajorMapping) {
  const int m = 5, n = 9, k = 17;
  std::mt19937 rng(7);
  const Mat la = make(CUDA_R_16BF, k, n, 0, false, 1, 0), lb = make(CUDA_R_16BF, k, m, 0, false, 1, 0);
  const Mat lc = make(CUDA_R_32F, n, m, 0, false, 1, 0);
  const auto hb = random_bytes(la, rng), ha = random_bytes(lb, rng);  // our B (n,k) row-major, our A (m,k)
  Dev da(ha.size()), db(hb.size()), dc(lc.bytes());
  da.upload(ha), db.upload(hb);
  const Mat* mats[4] = {&la, &lb, &lc, &lc};
  Lt lt(true, false, mats, 0);
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(lt.matmul(1.0f, db.p, da.p, 0.0f, dc.p, dc.p), CUBLAS_STATUS_SUCCESS);
  const auto out = dc.download();
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double ref = 0;
      for (int p = 0; p < k; ++p)
        ref += double(get(ha, CUDA_R_16BF, size_t(i * k + p))) * get(hb, CUDA_R_16BF, size_t(j * k + p));
      EXPECT_NEAR(get(out, CUDA_R_32F, size_t(i * n + j)), ref, 1e-5 * (1 + std::fabs(ref)));
    }
}

TEST(EmuCublasLt, FP8NeedsAda) {
  Spec s;
  s.at = s.bt = CUDA_R_8F_E4M3, s.ct = s.dt = CUDA_R_16BF, s.ta = true, s.m = 16, s.n = 8, s.k = 32;
  s.scale_a = 0.5f, s.scale_b = 4.0f, s.in_place = true;  // FP8: 16-byte leading dimensions
  {
    ArchScope arch("90");
    EXPECT_LE(run_case(s), kBf16Tol);
    Spec e = s;
    e.bt = CUDA_R_8F_E5M2, e.ct = e.dt = CUDA_R_32F;
    EXPECT_LE(run_case(e), kF32Tol);
    // FP8 output: C bf16, D e4m3 scaled by scale_D (3 mantissa bits: 2^-4 relative), with a bias.
    e = s;
    e.dt = CUDA_R_8F_E4M3, e.in_place = false, e.d_pad = 0, e.scale_d = 8.0f, e.beta = 1.0f;
    e.epilogue = CUBLASLT_EPILOGUE_BIAS;
    EXPECT_LE(run_case(e), 1.0 / 16);
  }
  const Mat A = make(CUDA_R_8F_E4M3, 32, 16, 0, false, 1, 0), B = make(CUDA_R_8F_E4M3, 32, 8, 0, false, 1, 0);
  const Mat C = make(CUDA_R_16BF, 16, 8, 0, false, 1, 0);
  const Mat* mats[4] = {&A, &B, &C, &C};
  {
    ArchScope arch("80");
    Lt lt(true, false, mats);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(lt.count, 0);
  }
  const Mat An = make(CUDA_R_8F_E4M3, 16, 32, 0, false, 1, 0);  // op(A) = A: "NN"
  const Mat* nn[4] = {&An, &B, &C, &C};
  {
    ArchScope arch("90");
    Lt lt(false, false, nn);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(lt.count, 0);
  }
  {
    ArchScope arch("100");  // Blackwell datacenter parts take every FP8 layout
    Lt lt(false, false, nn);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  }
  {
    ArchScope arch("90");
    const Mat A5 = make(CUDA_R_8F_E5M2, 32, 16, 0, false, 1, 0), B5 = make(CUDA_R_8F_E5M2, 32, 8, 0, false, 1, 0);
    const Mat* e5[4] = {&A5, &B5, &C, &C};
    Lt lt(true, false, e5);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);  // E5M2 x E5M2 has no kernel
  }
}

// What cuBLASLt's FP8 requirements (cuBLAS documentation, cublasLtMatmul) exclude, one at a time
// from an accepted "TN" e4m3 problem: another compute type, row order, stored rows or leading
// dimensions that are not 16 bytes, alignments below 16 bytes, scales where the types take none,
// and scale pointers or operands that are not 16-byte aligned device memory at matmul time.
TEST(EmuCublasLt, FP8RejectsWhatCublasLtRejects) {
  ArchScope arch("89");  // Ada: FP8, "TN" only
  const Mat A = make(CUDA_R_8F_E4M3, 32, 16, 0, false, 1, 0), B = make(CUDA_R_8F_E4M3, 32, 8, 0, false, 1, 0);
  const Mat C = make(CUDA_R_16BF, 16, 8, 0, false, 1, 0);
  const Mat* ok[4] = {&A, &B, &C, &C};
  {
    Lt lt(true, false, ok);
    ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
    Dev da(A.bytes() + 64), db(B.bytes()), dc(C.bytes()), ds(64);
    const float scales[2] = {0.5f, 2.0f};
    ASSERT_EQ(cudaMemcpy(ds.p, scales, 8, cudaMemcpyHostToDevice), cudaSuccess);
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(ds.at<float>()));
    lt.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(ds.at<float>(4)));
    EXPECT_EQ(lt.matmul(1, da.p, db.p, 0, dc.p, dc.p), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(lt.matmul(1, da.at(8), db.p, 0, dc.p, dc.p), CUBLAS_STATUS_INVALID_VALUE);  // A 8-byte aligned
    float host_scale = 1.0f;
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(&host_scale));
    EXPECT_EQ(lt.matmul(1, da.p, db.p, 0, dc.p, dc.p), CUBLAS_STATUS_INVALID_VALUE);  // scale in host memory
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(ds.at<float>(2)));
    EXPECT_EQ(lt.matmul(1, da.p, db.p, 0, dc.p, dc.p), CUBLAS_STATUS_INVALID_VALUE);  // misaligned f32 scale
    lt.set(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(ds.at<float>()));
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_INVALID_VALUE);  // a D scale for a bf16 D
  }
  {
    Lt lt(true, false, ok);
    const int32_t pedantic = CUBLAS_COMPUTE_32F_PEDANTIC;
    lt.set(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, pedantic);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(lt.count, 0);
  }
  {
    Lt lt(true, false, ok, 8);  // the FP8 kernels need 16-byte alignment
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {
    const Mat Ak = make(CUDA_R_8F_E4M3, 24, 16, 0, false, 1, 0), Bk = make(CUDA_R_8F_E4M3, 24, 8, 0, false, 1, 0);
    const Mat* odd_k[4] = {&Ak, &Bk, &C, &C};  // k = 24: 24-byte stored columns
    Lt lt(true, false, odd_k);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {
    const Mat Ar = make(CUDA_R_8F_E4M3, 32, 16, 0, true, 1, 0);
    const Mat* row[4] = {&Ar, &B, &C, &C};  // row-major A
    Lt lt(true, false, row);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {
    const Mat Ab = make(CUDA_R_16BF, 32, 16, 0, false, 1, 0), Bb = make(CUDA_R_16BF, 32, 8, 0, false, 1, 0);
    const Mat* bf[4] = {&Ab, &B, &C, &C};  // bf16 x e4m3: cuBLASLt does not mix them
    Lt lt(true, false, bf);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
    const Mat* bf2[4] = {&Ab, &Bb, &C, &C};
    Lt lt2(true, false, bf2);
    Dev ds(16);
    lt2.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(ds.p));
    EXPECT_EQ(lt2.heuristic(), CUBLAS_STATUS_INVALID_VALUE);  // per-tensor scales are for FP8 operands
  }
  {
    ArchScope blackwell_geforce("120");  // 12.x keeps the "TN" rule
    const Mat An = make(CUDA_R_8F_E4M3, 16, 32, 0, false, 1, 0);
    const Mat* nn[4] = {&An, &B, &C, &C};
    Lt lt(false, false, nn);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
  }
}

// MXFP8 through cuBLASLt's block scaling on Blackwell: A (m,k) and B^T (n,k) quantized by the
// repository's MXFP8 reference (e4m3 codes, an e8m0 scale per 32 of a row, stored row-major), the
// scales rearranged into cuBLASLt's 128 x 4 tiles (quant/block_scale_layout.h), and the product
// against the dequantized operands in double. m = 132 crosses a 128-row band, k = 96 pads its
// three blocks to a tile of four. Then the rejections: another architecture, the other mode,
// mixed modes, "NN", k % 32 != 0, and scale arrays missing or shorter than the tiles at matmul.
TEST(EmuCublasLt, MXFP8BlockScaledOnBlackwell) {
  const int64_t m = 132, n = 40, k = 96, kb = k / 32;  // FP8: D (f32) rows of 16-byte multiples
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> a(size_t(m * k)), b(size_t(n * k));
  for (size_t i = 0; i < a.size(); ++i) a[i] = nd(rng) * (i % 97 == 0 ? 40.0f : 1.0f);  // uneven block scales
  for (float& v : b) v = 0.1f * nd(rng);
  qlora::QuantParams p;
  p.format = qlora::QuantFormat::MXFP8_E4M3;
  const qlora::QuantizedTensor qa = qlora::quantize_ref(a.data(), m, k, p), qb = qlora::quantize_ref(b.data(), n, k, p);
  std::vector<float> da_(a.size()), db_(b.size());
  qlora::dequantize_ref(qa, da_.data());
  qlora::dequantize_ref(qb, db_.data());
  const auto ta = qlora::tile_block_scales(qa.scales.data(), m, kb), tb = qlora::tile_block_scales(qb.scales.data(), n, kb);
  ASSERT_EQ(int64_t(ta.size()), 256 * 4);  // two 128-row bands, one tile of 4 blocks
  // Column-major storage: A as (k, m), B as (k, n); both are our row-major (m,k) / (n,k) codes.
  const Mat A = make(CUDA_R_8F_E4M3, k, m, 0, false, 1, 0), B = make(CUDA_R_8F_E4M3, k, n, 0, false, 1, 0);
  const Mat D = make(CUDA_R_32F, m, n, 0, false, 1, 0);
  const Mat* mats[4] = {&A, &B, &D, &D};
  Dev dA(A.bytes()), dB(B.bytes()), dD(D.bytes()), dsa(ta.size()), dsb(tb.size()), dshort(ta.size() - 16);
  dA.upload(qa.data), dB.upload(qb.data), dsa.upload(ta), dsb.upload(tb);
  const int32_t vec32 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0, vec16 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3,
                scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  auto block_lt = [&](Lt& lt, int32_t ma, int32_t mb) {
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, ma);
    lt.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mb);
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(dsa.p));
    lt.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(dsb.p));
  };
  {
    ArchScope arch("100");
    Lt lt(true, false, mats);
    block_lt(lt, vec32, vec32);
    ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(lt.matmul(1, dA.p, dB.p, 0, dD.p, dD.p), CUBLAS_STATUS_SUCCESS);
    std::vector<float> got(size_t(m * n));
    ASSERT_EQ(cudaMemcpy(got.data(), dD.p, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    double max_ref = 0, max_err = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t q = 0; q < k; ++q) ref += double(da_[size_t(i * k + q)]) * db_[size_t(j * k + q)];
        max_ref = std::max(max_ref, std::fabs(ref));
        max_err = std::max(max_err, std::fabs(got[size_t(i + j * m)] - ref));
      }
    EXPECT_LE(max_err, kF32Tol * max_ref);
    // Without the block scales (or with the row-major ones read as tiles) the result is wrong.
    Dev dsa_flat(ta.size());
    std::vector<uint8_t> flat(ta.size(), 127);
    std::copy(qa.scales.begin(), qa.scales.end(), flat.begin());
    dsa_flat.upload(flat);
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(dsa_flat.p));
    ASSERT_EQ(lt.matmul(1, dA.p, dB.p, 0, dD.p, dD.p), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaMemcpy(got.data(), dD.p, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    double wrong = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t q = 0; q < k; ++q) ref += double(da_[size_t(i * k + q)]) * db_[size_t(j * k + q)];
        wrong = std::max(wrong, std::fabs(got[size_t(i + j * m)] - ref));
      }
    EXPECT_GT(wrong, 0.01 * max_ref) << "row-major scales read as tiles must not pass";
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(dshort.p));
    EXPECT_EQ(lt.matmul(1, dA.p, dB.p, 0, dD.p, dD.p), CUBLAS_STATUS_INVALID_VALUE);  // shorter than the tiles
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(nullptr));
    EXPECT_EQ(lt.matmul(1, dA.p, dB.p, 0, dD.p, dD.p), CUBLAS_STATUS_INVALID_VALUE);  // no scales
  }
  struct Case {
    const char* arch;
    int32_t ma, mb;
    bool ta, tb;
    int64_t k;
  } rejected[] = {
      {"90", vec32, vec32, true, false, 96},       // block scaling is Blackwell's
      {"100", vec16, vec16, true, false, 96},      // NVFP4's mode on FP8 data
      {"100", vec32, scalar, true, false, 96},     // mixed modes
      {"100", vec32, vec32, false, false, 96},     // "NN": A's blocks would run along M
      {"100", vec32, vec32, true, false, 48},      // k % 32 != 0
  };
  for (const Case& c : rejected) {
    SCOPED_TRACE(std::string(c.arch) + " k=" + std::to_string(c.k));
    ArchScope arch(c.arch);
    const Mat Ak = c.ta ? make(CUDA_R_8F_E4M3, c.k, m, 0, false, 1, 0) : make(CUDA_R_8F_E4M3, m, c.k, 0, false, 1, 0);
    const Mat Bk = make(CUDA_R_8F_E4M3, c.k, n, 0, false, 1, 0);
    const Mat* mk[4] = {&Ak, &Bk, &D, &D};
    Lt lt(c.ta, c.tb, mk);
    block_lt(lt, c.ma, c.mb);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
  }
}

// NVFP4: e2m1 codes two to a byte (even element in the low nibble), an e4m3 scale per 16 of K in
// the tiled layout, the per-tensor decode scales in alpha; against the repository's NVFP4
// reference (quant/nvfp4.cpp), whose stored codes and nibble order are what cuBLASLt reads.
TEST(EmuCublasLt, NVFP4BlockScaledOnBlackwell) {
  const int64_t m = 136, n = 24, k = 96, kb = k / 16;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> a(size_t(m * k)), b(size_t(n * k));
  for (size_t i = 0; i < a.size(); ++i) a[i] = nd(rng) * (i % 89 == 0 ? 30.0f : 1.0f);  // uneven block scales
  for (float& v : b) v = 0.2f * nd(rng);
  qlora::QuantParams p;
  p.format = qlora::QuantFormat::NVFP4;
  const qlora::QuantizedTensor qa = qlora::quantize_ref(a.data(), m, k, p), qb = qlora::quantize_ref(b.data(), n, k, p);
  std::vector<float> da_(a.size()), db_(b.size());
  qlora::dequantize_ref(qa, da_.data());
  qlora::dequantize_ref(qb, db_.data());
  const auto ta = qlora::tile_block_scales(qa.scales.data(), m, kb), tb = qlora::tile_block_scales(qb.scales.data(), n, kb);
  ASSERT_EQ(int64_t(ta.size()), 256 * 8);  // two 128-row bands, two tiles of 4 blocks
  Mat A = make(CUDA_R_4F_E2M1, k, m, 0, false, 1, 0), B = make(CUDA_R_4F_E2M1, k, n, 0, false, 1, 0);
  const Mat D = make(CUDA_R_32F, m, n, 0, false, 1, 0);
  const Mat* mats[4] = {&A, &B, &D, &D};
  Dev dA(qa.data.size()), dB(qb.data.size()), dD(D.bytes()), dsa(ta.size()), dsb(tb.size());
  dA.upload(qa.data), dB.upload(qb.data), dsa.upload(ta), dsb.upload(tb);
  const int32_t vec16 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3, vec32 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
                scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  auto block_lt = [&](Lt& lt, int32_t ma, int32_t mb) {
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, ma);
    lt.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mb);
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(dsa.p));
    lt.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(dsb.p));
  };
  auto max_err = [&](const std::vector<float>& got, double& max_ref) {
    double err = 0;
    max_ref = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t q = 0; q < k; ++q) ref += double(da_[size_t(i * k + q)]) * db_[size_t(j * k + q)];
        max_ref = std::max(max_ref, std::fabs(ref));
        err = std::max(err, std::fabs(got[size_t(i + j * m)] - ref));
      }
    return err;
  };
  {
    ArchScope arch("100");
    Lt lt(true, false, mats);
    block_lt(lt, vec16, vec16);
    ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
    const float alpha = qa.scales_f32[0] * qb.scales_f32[0];  // the two per-tensor decode scales
    ASSERT_EQ(lt.matmul(alpha, dA.p, dB.p, 0, dD.p, dD.p), CUBLAS_STATUS_SUCCESS);
    std::vector<float> got(size_t(m * n));
    ASSERT_EQ(cudaMemcpy(got.data(), dD.p, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    double max_ref = 0;
    const double err = max_err(got, max_ref);
    ASSERT_GT(max_ref, 0.0);
    EXPECT_LE(err, kF32Tol * max_ref);
    // The nibbles swapped (bitsandbytes' order: even element high) give another product.
    std::vector<uint8_t> swapped(qa.data);
    for (uint8_t& x : swapped) x = uint8_t((x << 4) | (x >> 4));
    dA.upload(swapped);
    ASSERT_EQ(lt.matmul(alpha, dA.p, dB.p, 0, dD.p, dD.p), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaMemcpy(got.data(), dD.p, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    const double ref_mag = max_ref;
    EXPECT_GT(max_err(got, max_ref), 0.05 * ref_mag) << "swapped nibbles must not pass";
    dA.upload(qa.data);
    // Row-major scales read as tiles must not pass either.
    Dev dsa_flat(ta.size());
    std::vector<uint8_t> flat(ta.size(), 0x38);  // e4m3 1.0
    std::copy(qa.scales.begin(), qa.scales.end(), flat.begin());
    dsa_flat.upload(flat);
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(dsa_flat.p));
    ASSERT_EQ(lt.matmul(alpha, dA.p, dB.p, 0, dD.p, dD.p), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaMemcpy(got.data(), dD.p, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_GT(max_err(got, max_ref), 0.05 * ref_mag) << "row-major scales read as tiles must not pass";
    Dev dshort(ta.size() - 16);
    lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(dshort.p));
    EXPECT_EQ(lt.matmul(alpha, dA.p, dB.p, 0, dD.p, dD.p), CUBLAS_STATUS_INVALID_VALUE);  // shorter than the tiles
  }
  struct Case {
    const char* what;
    const char* arch;
    int32_t ma, mb;
    bool ta;
    int64_t k;
    cudaDataType_t bt, dt;
  } rejected[] = {
      {"block scaling is Blackwell's", "90", vec16, vec16, true, 96, CUDA_R_4F_E2M1, CUDA_R_32F},
      {"sm_120 is not 10.x", "120", vec16, vec16, true, 96, CUDA_R_4F_E2M1, CUDA_R_32F},
      {"e2m1 without block scales", "100", scalar, scalar, true, 96, CUDA_R_4F_E2M1, CUDA_R_32F},
      {"MXFP4 (ue8m0 per 32 on e2m1)", "100", vec32, vec32, true, 96, CUDA_R_4F_E2M1, CUDA_R_32F},
      {"mixed modes", "100", vec16, scalar, true, 96, CUDA_R_4F_E2M1, CUDA_R_32F},
      {"NN: A's blocks would run along M", "100", vec16, vec16, false, 96, CUDA_R_4F_E2M1, CUDA_R_32F},
      {"k % 32 != 0: rows of 8 bytes", "100", vec16, vec16, true, 48, CUDA_R_4F_E2M1, CUDA_R_32F},
      {"e2m1 x e4m3", "100", vec16, vec16, true, 96, CUDA_R_8F_E4M3, CUDA_R_32F},
      {"an e2m1 D is not emulated", "100", vec16, vec16, true, 96, CUDA_R_4F_E2M1, CUDA_R_4F_E2M1},
  };
  for (const Case& c : rejected) {
    SCOPED_TRACE(c.what);
    ArchScope arch(c.arch);
    const Mat Ak = c.ta ? make(CUDA_R_4F_E2M1, c.k, m, 0, false, 1, 0) : make(CUDA_R_4F_E2M1, m, c.k, 0, false, 1, 0);
    const Mat Bk = make(c.bt, c.k, n, 0, false, 1, 0);
    const Mat Dk = make(c.dt, m, n, 0, false, 1, 0);
    const Mat Ck = make(CUDA_R_16BF, Dk.rows, n, 0, false, 1, 0);
    const Mat* mk[4] = {&Ak, &Bk, c.dt == CUDA_R_4F_E2M1 ? &Ck : &Dk, &Dk};
    Lt lt(c.ta, false, mk);
    block_lt(lt, c.ma, c.mb);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
  }
}

TEST(EmuCublasLt, HeuristicRejectsUnsupportedAndInvalidProblems) {
  const Mat A = make(CUDA_R_16BF, 8, 4, 0, false, 1, 0), B32 = make(CUDA_R_32F, 4, 6, 0, false, 1, 0);
  const Mat B = make(CUDA_R_16BF, 4, 6, 0, false, 1, 0), C = make(CUDA_R_16BF, 8, 6, 0, false, 1, 0);
  const Mat C16 = make(CUDA_R_16F, 8, 6, 0, false, 1, 0), Bbad = make(CUDA_R_16BF, 5, 6, 0, false, 1, 0);
  Mat Cld = C;
  Cld.ld = 7;  // < rows
  const Mat Cb2 = make(CUDA_R_16BF, 8, 6, 0, false, 2, 0);
  struct Case {
    const Mat *a, *b, *c;
    cublasStatus_t want;
  } cases[] = {
      {&A, &B32, &C, CUBLAS_STATUS_NOT_SUPPORTED},   // A 16BF x B 32F
      {&A, &B, &C16, CUBLAS_STATUS_NOT_SUPPORTED},   // 16BF inputs, 16F output
      {&A, &B, &Cld, CUBLAS_STATUS_INVALID_VALUE},   // ldc < rows
      {&A, &Bbad, &C, CUBLAS_STATUS_INVALID_VALUE},  // k mismatch
      {&A, &B, &Cb2, CUBLAS_STATUS_INVALID_VALUE},   // batch counts differ
  };
  for (const Case& c : cases) {
    const Mat* mats[4] = {c.a, c.b, c.c, c.c};
    Lt lt(false, false, mats);
    EXPECT_EQ(lt.heuristic(), c.want);
    EXPECT_EQ(lt.count, 0);
  }
  const Mat* ok[4] = {&A, &B, &C, &C};
  Lt lt(false, false, ok);
  lt.set_align(1, 2, 2, 2);  // below the element size
  EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
  lt.set_align(2, 2, 2, 2);
  lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX);
  EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
  lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
  const int32_t mode = CUBLASLT_POINTER_MODE_DEVICE_VECTOR;
  lt.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, mode);
  EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST(EmuCublasLt, MatmulRejectsBadPointers) {
  const Mat A = make(CUDA_R_16BF, 8, 4, 0, false, 1, 0), B = make(CUDA_R_16BF, 4, 6, 0, false, 1, 0);
  const Mat C = make(CUDA_R_16BF, 8, 6, 0, false, 1, 0), C2 = make(CUDA_R_16BF, 8, 6, 2, false, 1, 0);
  const Mat* mats[4] = {&A, &B, &C, &C};
  Dev da(A.bytes() + 64), db(B.bytes()), dc(C.bytes()), dbig(4096);
  Lt lt(false, false, mats, 16);
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.matmul(1, da.p, db.p, 0, dc.p, dc.p), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.matmul(1, da.at(2), db.p, 0, dc.p, dc.p), CUBLAS_STATUS_INVALID_VALUE);  // below the algo's 16 bytes
  EXPECT_EQ(lt.matmul(1, da.at(1), db.p, 0, dc.p, dc.p), CUBLAS_STATUS_INVALID_VALUE);  // below the element
  std::vector<uint16_t> host(64);
  EXPECT_EQ(lt.matmul(1, host.data(), db.p, 0, dc.p, dc.p), CUBLAS_STATUS_INVALID_VALUE);    // not device memory
  EXPECT_EQ(lt.matmul(1, da.p, db.at(16), 0, dc.p, dc.p), CUBLAS_STATUS_INVALID_VALUE);      // runs past the allocation
  EXPECT_EQ(lt.matmul(1, da.p, db.p, 0, dc.p, da.p), CUBLAS_STATUS_INVALID_VALUE);           // D overlaps A
  EXPECT_EQ(lt.matmul(1, da.p, db.p, 1, dbig.p, dc.p), CUBLAS_STATUS_SUCCESS);               // separate C
  EXPECT_EQ(lt.matmul(1, da.p, db.p, 1, dbig.p, dbig.at(32)), CUBLAS_STATUS_INVALID_VALUE);  // C overlaps D
  EXPECT_EQ(cublasLtMatmul(nullptr, lt.op, nullptr, da.p, lt.l[0], db.p, lt.l[1], nullptr, dc.p, lt.l[2], dc.p, lt.l[3],
                           &lt.res.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_INITIALIZED);
  // In place (C == D) needs equal layouts.
  cublasLtMatrixLayout_t l2;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&l2, CUDA_R_16BF, 8, 6, C2.ld), CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f;
  EXPECT_EQ(cublasLtMatmul(lt.h, lt.op, &one, da.p, lt.l[0], db.p, lt.l[1], &one, dbig.p, l2, dbig.p, lt.l[3],
                           &lt.res.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  // Bias epilogue without a bias pointer.
  lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
  EXPECT_EQ(lt.matmul(1, da.p, db.p, 0, dc.p, dc.p), CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatrixLayoutDestroy(l2);
}

// The heuristic's algorithm asks for workspace up to the preference's MAX_WORKSPACE_BYTES, the
// GEMM refuses less and overwrites what it gets; QLORA_CUDA_EMU_LT_HEURISTIC=none finds nothing
// (the backend then takes its cublasGemmEx fallback: the cuda_emu_lt_no_algorithm test entry).
TEST(EmuCublasLt, AlgorithmsNeedTheWorkspaceTheHeuristicReports) {
  const Mat A = make(CUDA_R_16BF, 8, 4, 0, false, 1, 0), B = make(CUDA_R_16BF, 4, 6, 0, false, 1, 0);
  const Mat C = make(CUDA_R_16BF, 8, 6, 0, false, 1, 0);
  const Mat* mats[4] = {&A, &B, &C, &C};
  Dev da(A.bytes()), db(B.bytes()), dc(C.bytes());
  Lt lt(false, false, mats, 16);
  const uint64_t none = 0;
  ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &none, 8),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.res.workspaceSize, 0u);  // the preference allows none
  const uint64_t allowed = uint64_t(1) << 20;
  ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &allowed, 8),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(lt.count, 1);
  EXPECT_EQ(lt.res.workspaceSize, allowed);
  const float one = 1.0f, zero = 0.0f;
  auto run = [&](void* ws, size_t bytes) {
    return cublasLtMatmul(lt.h, lt.op, &one, da.p, lt.l[0], db.p, lt.l[1], &zero, dc.p, lt.l[2], dc.p, lt.l[3],
                          &lt.res.algo, ws, bytes, nullptr);
  };
  EXPECT_EQ(run(nullptr, 0), CUBLAS_STATUS_INVALID_VALUE);  // the workspace requirement ignored
  Dev ws(allowed);
  EXPECT_EQ(run(ws.p, allowed / 2), CUBLAS_STATUS_INVALID_VALUE);
  ASSERT_EQ(cudaMemset(ws.p, 0, allowed), cudaSuccess);
  EXPECT_EQ(run(ws.p, allowed), CUBLAS_STATUS_SUCCESS);
  const auto after = ws.download();
  EXPECT_EQ(after[0], 0xff);  // the GEMM's scratch: the zeros are gone
  EXPECT_EQ(after[allowed - 1], 0xff);
  ASSERT_EQ(setenv("QLORA_CUDA_EMU_LT_HEURISTIC", "none", 1), 0);
  EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(lt.count, 0);
  unsetenv("QLORA_CUDA_EMU_LT_HEURISTIC");
  EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
}

TEST(EmuCublasLt, AttributeSizesAreChecked) {
  cublasLtMatmulDesc_t op;
  ASSERT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const int64_t wide = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)),
            CUBLAS_STATUS_INVALID_VALUE);
  const int32_t t = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)), CUBLAS_STATUS_SUCCESS);
  int32_t back = 0;
  size_t written = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 0, &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, 4u);
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &back, 4, &written), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(back, CUBLAS_OP_T);
  const int8_t fast = 1;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, 1), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescDestroy(op), CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t l;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 3, 4, 3), CUBLAS_STATUS_SUCCESS);
  const int32_t ld32 = 5;
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld32, 4), CUBLAS_STATUS_INVALID_VALUE);
  uint64_t rows = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, 8, nullptr), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(rows, 3u);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(l), CUBLAS_STATUS_SUCCESS);
}

// ---- Legacy cuBLAS: column-major gemm with transposes, leading dimensions, strided batches.
double gemm_ex_case(cublasHandle_t h, cudaDataType_t ab, cudaDataType_t c, bool ta, bool tb, int batch, float beta) {
  const int m = 7, n = 13, k = 33, pad = 3;
  std::mt19937 rng(99 + ta + 2 * tb);
  const Mat A = make(ab, ta ? k : m, ta ? m : k, pad, false, batch, 5);
  const Mat B = make(ab, tb ? n : k, tb ? k : n, pad, false, batch, 1);
  const Mat C = make(c, m, n, pad, false, batch, 2);
  const auto ha = random_bytes(A, rng), hb = random_bytes(B, rng);
  auto hc = random_bytes(C, rng);
  if (beta == 0.0f)
    for (size_t i = 0; i < C.elems(); ++i) put(hc, c, i, std::numeric_limits<float>::quiet_NaN());
  Dev da(A.bytes()), db(B.bytes()), dc(C.bytes());
  da.upload(ha), db.upload(hb), dc.upload(hc);
  const float alpha = 1.5f;
  const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasStatus_t s = batch == 1
                               ? cublasGemmEx(h, oa, ob, m, n, k, &alpha, da.p, ab, int(A.ld), db.p, ab, int(B.ld),
                                              &beta, dc.p, c, int(C.ld), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                               : cublasGemmStridedBatchedEx(h, oa, ob, m, n, k, &alpha, da.p, ab, int(A.ld), A.stride,
                                                            db.p, ab, int(B.ld), B.stride, &beta, dc.p, c, int(C.ld),
                                                            C.stride, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  EXPECT_EQ(s, CUBLAS_STATUS_SUCCESS);
  const auto out = dc.download();
  double max_ref = 0, max_err = 0;
  for (int bi = 0; bi < batch; ++bi)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double acc = 0;
        for (int p = 0; p < k; ++p)
          acc += double(get(ha, ab, size_t(bi * A.stride + (ta ? A.at(p, i) : A.at(i, p))))) *
                 get(hb, ab, size_t(bi * B.stride + (tb ? B.at(j, p) : B.at(p, j))));
        double ref = alpha * acc;
        if (beta != 0.0f) ref += beta * get(hc, c, size_t(bi * C.stride + C.at(i, j)));
        const double got = get(out, c, size_t(bi * C.stride + C.at(i, j)));
        if (std::isnan(got)) return std::numeric_limits<double>::quiet_NaN();
        max_ref = std::max(max_ref, std::fabs(ref));
        max_err = std::max(max_err, std::fabs(got - ref));
      }
  return max_err / max_ref;
}

TEST(EmuCublas, GemmExMatchesReference) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(h, nullptr), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    EXPECT_LE(gemm_ex_case(h, CUDA_R_32F, CUDA_R_32F, ta, tb, 1, 0.0f), kF32Tol);
    EXPECT_LE(gemm_ex_case(h, CUDA_R_16BF, CUDA_R_16BF, ta, tb, 1, 1.0f), kBf16Tol);
    EXPECT_LE(gemm_ex_case(h, CUDA_R_16BF, CUDA_R_32F, ta, tb, 1, 0.0f), kF32Tol);
    EXPECT_LE(gemm_ex_case(h, CUDA_R_16F, CUDA_R_16F, ta, tb, 3, 0.5f), kF16Tol);
  }
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

TEST(EmuCublas, GemmExRejectsBadArguments) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  Dev a(4096), b(4096), c(4096);
  const float one = 1.0f, zero = 0.0f;
  auto gemm = [&](cublasOperation_t ta, int m, int n, int k, cudaDataType_t at, cudaDataType_t bt, cudaDataType_t ct,
                  int lda, int ldb, int ldc, const void* A = nullptr) {
    return cublasGemmEx(h, ta, CUBLAS_OP_N, m, n, k, &one, A ? A : a.p, at, lda, b.p, bt, ldb, &zero, c.p, ct, ldc,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  EXPECT_EQ(gemm(CUBLAS_OP_N, 8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 8, 6, 8), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 7, 6, 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(CUBLAS_OP_T, 8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 6, 6, 8), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(CUBLAS_OP_T, 8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 5, 6, 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 8, 5, 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 8, 6, 7), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(CUBLAS_OP_N, -1, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 8, 6, 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 8, 4, 6, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F, 8, 6, 8), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_16BF, 8, 6, 8), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 8, 6, 8, a.at(2)),
            CUBLAS_STATUS_INVALID_VALUE);
  std::vector<float> host(64);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 8, 6, 8, host.data()),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 8, 6, 8, a.at(4096 - 4 * 40)),
            CUBLAS_STATUS_INVALID_VALUE);  // A's 48 floats run past the allocation
  EXPECT_EQ(gemm(CUBLAS_OP_N, 0, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 1, 6, 1), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 8, 6, 8), CUBLAS_STATUS_NOT_INITIALIZED);
}

}  // namespace
