// CUDA matmul through cuBLASLt: bf16 (or f32) operands, fp32 accumulation, mixed dtypes via a
// bf16 scratch copy of the f32 operand.
//
// Supported (C, A, B) dtype combinations; any other is Error(Unsupported):
//   C BF16|F32  =/+=  A BF16 x B BF16   tensor cores, fp32 accumulate (the base linears, LoRA grads
//                                       "F32 += BF16^T x BF16", logits "F32 = BF16 x BF16^T")
//   C F32       =/+=  A F32  x B F32    true fp32 SGEMM (no TF32)
//   C BF16      =/+=  A F32  x B F32    both rounded to bf16 in scratch (cuBLASLt's f32 GEMM
//                                       writes f32 only)
//   C BF16|F32  =/+=  A BF16 x B F32    B rounded to bf16 in scratch first (LoRA weights: h = x A^T)
//   C BF16|F32  =/+=  A F32  x B BF16   A rounded to bf16 in scratch first (dlogits x lm_head)
// A problem cuBLASLt's heuristic has no kernel for goes to cublasGemmEx (same dtypes).
// cuBLASLt cannot mix A/B types, and rounding the f32 operand costs one pass over it; for the
// model that is a LoRA weight (r x in, small) or one cross-entropy chunk of logits.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <string>

#include "backend/cuda/cuda_backend_impl.cuh"

namespace qlora::cuda {

namespace {

constexpr int kCvtThreads = 256;  // f32_to_bf16_kernel's block

__global__ void __launch_bounds__(kCvtThreads)
    f32_to_bf16_kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, int64_t n, int vec) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    for (; i < n / 8; i += stride) {
      float v[8];
      ld8(FPtr{const_cast<float*>(src), 0}, i * 8, v);
      st8(FPtr{dst, 1}, i * 8, v);
    }
    for (int64_t j = n / 8 * 8 + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride)
      dst[j] = __float2bfloat16_rn(src[j]);
  } else {
    for (; i < n; i += stride) dst[i] = __float2bfloat16_rn(src[i]);
  }
}

void lt_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail(ErrorKind::Internal, "cuda op matmul", std::string(what) + " failed with cublas status " + std::to_string(int(s)),
         "check the matmul shapes and dtypes; run under compute-sanitizer");
}

// Largest power of two (<= 256) dividing the address: what cuBLASLt may assume about a pointer.
int alignment_of(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (u % uintptr_t(a)) != 0) a >>= 1;
  return a;
}

cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

bool overlaps(const void* p, int64_t p_bytes, const void* q, int64_t q_bytes) {
  auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  return p_bytes > 0 && q_bytes > 0 && a < b + uintptr_t(q_bytes) && b < a + uintptr_t(p_bytes);
}

// RAII for the cuBLASLt descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

// Legacy cuBLAS for the rare problem cuBLASLt's heuristic has no kernel for (odd leading
// dimensions, say): same column-major mapping, any leading dimension, 32-bit sizes.
void gemm_ex_fallback(CudaBackend& be, const MatmulArgs& a, const void* a_ptr, DType a_t, const void* b_ptr, DType b_t) {
  if (std::max({a.m, a.n, a.k}) > INT32_MAX)
    fail(ErrorKind::Unsupported, "cuda op matmul", "no cuBLASLt kernel and a dimension exceeds 32 bits",
         "split the matmul into chunks");
  if (!be.blas_) {
    if (cublasCreate(&be.blas_) != CUBLAS_STATUS_SUCCESS) lt_check(CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate");
    lt_check(cublasSetStream(be.blas_, be.stream_), "cublasSetStream");
  }
  const float alpha = a.alpha, beta = a.beta;
  lt_check(cublasGemmEx(be.blas_, a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(a.n),
                        int(a.m), int(a.k), &alpha, b_ptr, cuda_type(b_t), int(a.trans_b ? a.k : a.n), a_ptr,
                        cuda_type(a_t), int(a.trans_a ? a.m : a.k), &beta, a.c.data, cuda_type(a.c.dtype), int(a.n),
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
           "cublasGemmEx");
}

void convert_to_bf16(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  const int vec = aligned16(src) && aligned16(dst);
  const int64_t work = vec ? std::max<int64_t>(n / 8, 1) : n;
  const int blocks = int(std::min<int64_t>(ceil_div64(work, kCvtThreads), 65535));
  launch(f32_to_bf16_kernel, {blocks, kCvtThreads, 0, s}, src, dst, n, vec);
  QLORA_CUDA_LAUNCH_CHECK();
}

// Row-major C (m,n) = op(A) op(B) is column-major C^T (n,m) = op(B)^T op(A)^T, so cuBLASLt's
// "A" is our B and its "B" is our A; a row-major (r,c) buffer is a column-major (c,r) one.
void lt_matmul(CudaBackend& be, const MatmulArgs& a, const void* a_ptr, DType a_t, const void* b_ptr, DType b_t) {
  QLORA_ASSERT(a_t == b_t);
  CudaBackend::GemmKey key{a.m, a.n, a.k, int(a.trans_a), int(a.trans_b), int(a_t), int(b_t), int(a.c.dtype),
                           alignment_of(a_ptr), alignment_of(b_ptr), alignment_of(a.c.data), a.beta == 0.0f};
  if (be.no_lt_algo_.count(key)) {
    gemm_ex_fallback(be, a, a_ptr, a_t, b_ptr, b_t);
    return;
  }
  auto it = be.lt_plans_.find(key);
  if (it == be.lt_plans_.end()) {  // first time this problem is seen: descriptors and heuristic
    LtDescs d;
    lt_check(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t op_lt_a = a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // applies to our B
    const cublasOperation_t op_lt_b = a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // applies to our A
    lt_check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a)), "set TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b)), "set TRANSB");
    // Stored shapes (column-major rows, cols, ld) of cuBLASLt's A (= our B) and B (= our A).
    const uint64_t la_rows = a.trans_b ? a.k : a.n, la_cols = a.trans_b ? a.n : a.k;
    const uint64_t lb_rows = a.trans_a ? a.m : a.k, lb_cols = a.trans_a ? a.k : a.m;
    lt_check(cublasLtMatrixLayoutCreate(&d.a, cuda_type(b_t), la_rows, la_cols, int64_t(la_rows)), "layout A");
    lt_check(cublasLtMatrixLayoutCreate(&d.b, cuda_type(a_t), lb_rows, lb_cols, int64_t(lb_rows)), "layout B");
    lt_check(cublasLtMatrixLayoutCreate(&d.c, cuda_type(a.c.dtype), uint64_t(a.n), uint64_t(a.m), a.n), "layout C");
    lt_check(cublasLtMatmulPreferenceCreate(&d.pref), "preference create");
    const uint64_t ws = be.lt_workspace_bytes_;
    lt_check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
             "set workspace");
    const uint32_t al_a = uint32_t(key.align_b), al_b = uint32_t(key.align_a), al_c = uint32_t(key.align_c);
    lt_check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)),
             "set align A");
    lt_check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)),
             "set align B");
    lt_check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)),
             "set align C");
    lt_check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)),
             "set align D");
    cublasLtMatmulHeuristicResult_t res{};
    int count = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(be.lt_, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &res, &count);
    if (s != CUBLAS_STATUS_SUCCESS || count == 0) {
      be.no_lt_algo_.insert(key);
      gemm_ex_fallback(be, a, a_ptr, a_t, b_ptr, b_t);
      return;
    }
    CudaBackend::LtPlan plan{d.op, d.a, d.b, d.c, res.algo};
    d.op = nullptr, d.a = d.b = d.c = nullptr;  // the plan owns them now (released in release())
    it = be.lt_plans_.emplace(key, plan).first;
  }
  const CudaBackend::LtPlan& p = it->second;
  const float alpha = a.alpha, beta = a.beta;
  lt_check(cublasLtMatmul(be.lt_, p.op, &alpha, b_ptr, p.a, a_ptr, p.b, &beta, a.c.data, p.c, a.c.data, p.c, &p.algo,
                          be.lt_workspace_, be.lt_workspace_bytes_, be.stream_),
           "cublasLtMatmul");
}

void CudaBackend::matmul(const MatmulArgs& a) {
  const char* op = "matmul";
  check_dim(op, "m", a.m);
  check_dim(op, "n", a.n);
  check_dim(op, "k", a.k);
  check_tensor(op, "c", a.c, a.m * a.n, true, true);
  check_tensor(op, "a", a.a, a.m * a.k, true, true);
  check_tensor(op, "b", a.b, a.k * a.n, true, true);
  if (a.m == 0 || a.n == 0) return;
  wait_prefetched(a.a.data);  // an operand a prefetched dequantization is still writing
  wait_prefetched(a.b.data);
  const int64_t c_bytes = a.m * a.n * dtype_size(a.c.dtype);
  if (overlaps(a.c.data, c_bytes, a.a.data, a.m * a.k * dtype_size(a.a.dtype)) ||
      overlaps(a.c.data, c_bytes, a.b.data, a.k * a.n * dtype_size(a.b.dtype)))
    fail(ErrorKind::Internal, "cuda op matmul, tensor 'c'", "output overlaps an input",
         "matmul writes C while reading A and B; use a separate output buffer");
  if (a.k == 0) {  // C = beta*C: cuBLASLt does not take empty inner dimensions
    if (a.beta == 0.0f)
      QLORA_CUDA_CHECK(cudaMemsetAsync(a.c.data, 0, size_t(c_bytes), stream_));
    else if (a.beta != 1.0f)
      scale({a.c, a.m * a.n, a.beta});
    return;
  }
  const bool all_f32 = a.a.dtype == DType::F32 && a.b.dtype == DType::F32;
  if (a.a.dtype == a.b.dtype && !(all_f32 && a.c.dtype == DType::BF16)) {
    lt_matmul(*this, a, a.a.data, a.a.dtype, a.b.data, a.b.dtype);
    return;
  }
  // Mixed: round each f32 operand to bf16 in scratch, then a bf16 x bf16 GEMM.
  const void* pa = a.a.data;
  const void* pb = a.b.data;
  if (a.a.dtype == DType::F32) {
    auto* dst = static_cast<__nv_bfloat16*>(scratch(Scratch::MatmulCvt, size_t(a.m * a.k) * 2));
    convert_to_bf16(a.a.f32(), dst, a.m * a.k, stream_);
    pa = dst;
  }
  if (a.b.dtype == DType::F32) {
    auto* dst = static_cast<__nv_bfloat16*>(scratch(Scratch::MatmulCvtB, size_t(a.k * a.n) * 2));
    convert_to_bf16(a.b.f32(), dst, a.k * a.n, stream_);
    pb = dst;
  }
  lt_matmul(*this, a, pa, DType::BF16, pb, DType::BF16);
}

}  // namespace qlora::cuda
