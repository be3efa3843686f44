// CUDA matmul_fp8: a base projection on an FP8 (e4m3, per-tensor scale) weight read as stored.
// The bf16 activation is quantized to e4m3 per tensor with current scaling (an amax reduction,
// then scale + convert: two kernels, no host synchronization, no atomics), and cuBLASLt multiplies
// the codes with both scale_inv as its A/B scale pointers, accumulating in f32, writing bf16.
//
// cuBLASLt's FP8 rules (cuBLAS documentation, cublasLtMatmul, FP8 requirements): compute type
// CUBLAS_COMPUTE_32F with CUDA_R_32F scales, compute capability 8.9 or later, A transposed and B
// not ("TN") except on 10.x, 16-byte aligned pointers and 16-byte multiples for the stored rows and
// leading dimensions. The row-major y (m,out) = x w^T is the column-major y^T = w x^T with w
// stored (in,out) column-major, so cuBLASLt's A is w with TRANSA = T and its B is x with
// TRANSB = N: "TN" as the forward stores it. (The backward's dy w is "NN": it stays bf16.)
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <string>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "quant/quant_layout.h"

namespace qlora::cuda {

namespace {

constexpr int kFp8Threads = 256;  // both kernels' block; the amax grid is at most cuda_plan::kFp8AmaxBlocks
static_assert(cuda_plan::kFp8AmaxBlocks <= kFp8Threads, "one thread per amax partial in fp8_quantize_kernel");

// partial[blockIdx.x] = max |x| over the block's grid-stride share (NaN ignored, as fmaxf does).
__global__ void __launch_bounds__(kFp8Threads)
    fp8_amax_kernel(const __nv_bfloat16* __restrict__ x, int64_t n, float* __restrict__ partial) {
  QLORA_SHARED(float[32], red);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float m = 0.0f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  m = warp_max(m);
  if (lane == 0) red[warp] = m;
  __syncthreads();
  if (warp == 0) {
    float r = lane < int(blockDim.x >> 5) ? red[lane] : 0.0f;
    r = warp_max(r);
    if (lane == 0) partial[blockIdx.x] = r;
  }
}

// q = e4m3_rn_satfinite(x * s), s = 448 / amax (amax 0: 1; overflow: FLT_MAX), as quant/fp8.cpp.
// Each block reduces the n_partial amax partials itself; block 0 writes stats = {amax, 1 / s}.
__global__ void __launch_bounds__(kFp8Threads)
    fp8_quantize_kernel(const __nv_bfloat16* __restrict__ x, int64_t n, const float* __restrict__ partial,
                        int n_partial, float* __restrict__ stats, __nv_fp8_storage_t* __restrict__ q) {
  QLORA_SHARED(float[32], red);
  QLORA_SHARED(float, scale);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float m = int(threadIdx.x) < n_partial ? partial[threadIdx.x] : 0.0f;
  m = warp_max(m);
  if (lane == 0) red[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float amax = 0.0f;
    for (int w = 0; w < int(blockDim.x >> 5); w++) amax = fmaxf(amax, red[w]);
    float s = amax == 0.0f ? 1.0f : __fdiv_rn(448.0f, amax);
    if (s > FLT_MAX) s = FLT_MAX;  // infinite
    scale = s;
    if (blockIdx.x == 0) {
      stats[0] = amax;
      stats[1] = __fdiv_rn(1.0f, s);
    }
  }
  __syncthreads();
  const float s = scale;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    q[i] = __nv_cvt_float_to_fp8(__fmul_rn(__bfloat162float(x[i]), s), __NV_SATFINITE, __NV_E4M3);
}

void fp8_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail(ErrorKind::Internal, "cuda op matmul_fp8", std::string(what) + " failed with cublas status " + std::to_string(int(s)),
         "check the FP8 GEMM's shapes and alignment; run under compute-sanitizer");
}

}  // namespace

void CudaBackend::matmul_fp8(const MatmulFp8Args& a) {
  const char* op = "matmul_fp8";
  check_dim(op, "m", a.m);
  check_dim(op, "out", a.out);
  check_dim(op, "in", a.in);
  check_tensor(op, "y", a.y, a.m * a.out, true, false);
  check_tensor(op, "x", a.x, a.m * a.in, true, false);
  if (a.amax.data) check_tensor(op, "amax", a.amax, 1, false, true);
  check_ptr(op, "w", a.w);
  if (!has_fp8_gemm())
    fail(ErrorKind::Unsupported, "cuda op matmul_fp8", "this GPU has no FP8 tensor cores (compute capability below 8.9)",
         "plan the base GEMMs in bf16 (gemm_dtype bf16): the quantized base is dequantized instead");
  if (a.in % 16 != 0 || a.out % 8 != 0)
    fail(ErrorKind::Unsupported, "cuda op matmul_fp8, weight (" + std::to_string(a.out) + "," + std::to_string(a.in) + ")",
         "cuBLASLt's FP8 kernels need in % 16 == 0 (e4m3 rows of 16-byte multiples) and out % 8 == 0 (bf16 output)",
         "plan the base GEMMs in bf16 for this model");
  if (!aligned16(a.x.data) || !aligned16(a.y.data))
    fail(ErrorKind::Unsupported, "cuda op matmul_fp8", "x and y must be 16-byte aligned for cuBLASLt's FP8 kernels",
         "pass whole planned buffers (the arena aligns them to 256 bytes)");
  QuantParams p;
  p.format = QuantFormat::FP8_E4M3;
  p.fp8_scaling = Fp8Scaling::PerTensor;
  const QuantLayout L = quant_layout(p, a.out, a.in);
  const char* blob = static_cast<const char*>(a.w);
  const void* w_codes = blob + L.data.offset;
  const float* w_scale_inv = reinterpret_cast<const float*>(blob + L.scales_f32.offset);
  if (!aligned16(w_codes))
    fail(ErrorKind::Internal, "cuda op matmul_fp8, weight 'w'", "its e4m3 codes are not 16-byte aligned",
         "pass the packed weight's base address (quant/quant_layout.h puts FP8 codes first)");
  const int64_t n = a.m * a.in;
  char* scr = static_cast<char*>(scratch(Scratch::Fp8Act, size_t(cuda_plan::fp8_act_bytes(a.m, a.in)), op));
  auto* partial = reinterpret_cast<float*>(scr);
  auto* stats = reinterpret_cast<float*>(scr + cuda_plan::kFp8StatsOffset);
  auto* codes = reinterpret_cast<__nv_fp8_storage_t*>(scr + cuda_plan::kFp8CodesOffset);
  const int blocks = int(std::clamp<int64_t>(ceil_div64(n, kFp8Threads * 8), 1, cuda_plan::kFp8AmaxBlocks));
  launch(fp8_amax_kernel, {blocks, kFp8Threads, 0, stream_}, static_cast<const __nv_bfloat16*>(a.x.data), n, partial);
  QLORA_CUDA_LAUNCH_CHECK();
  const int qblocks = int(std::clamp<int64_t>(ceil_div64(n, kFp8Threads * 4), 1, int64_t(sm_count_) * 8));
  launch(fp8_quantize_kernel, {qblocks, kFp8Threads, 0, stream_}, static_cast<const __nv_bfloat16*>(a.x.data), n, static_cast<const float*>(partial),
         blocks, stats, codes);
  QLORA_CUDA_LAUNCH_CHECK();
  if (a.amax.data) QLORA_CUDA_CHECK(cudaMemcpyAsync(a.amax.data, stats, 4, cudaMemcpyDeviceToDevice, stream_));
  if (a.m == 0 || a.out == 0) return;
  if (a.in == 0) {
    QLORA_CUDA_CHECK(cudaMemsetAsync(a.y.data, 0, size_t(a.m * a.out) * 2, stream_));
    return;
  }
  // Descriptors, layouts and algorithm once per shape, kept with the bf16 plans (a_t = -1 marks FP8).
  GemmKey key{a.out, a.m, a.in, 1, 0, -1, -1, int(DType::BF16), 16, 16, 16, 1};
  auto it = lt_plans_.find(key);
  if (it == lt_plans_.end()) {
    LtPlan plan;
    fp8_check(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    fp8_check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
    fp8_check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
    fp8_check(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_8F_E4M3, uint64_t(a.in), uint64_t(a.out), a.in), "layout A");
    fp8_check(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_8F_E4M3, uint64_t(a.in), uint64_t(a.m), a.in), "layout B");
    fp8_check(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_16BF, uint64_t(a.out), uint64_t(a.m), a.out), "layout C");
    lt_choose_lowp_algo(plan, "matmul_fp8", "FP8", a.m, a.in, a.out);
    it = lt_plans_.emplace(key, plan).first;
  }
  // The scale pointers change per call (the weight's own scale_inv, this activation's), so they
  // are set on the kept descriptor before each matmul; a host-side write, no synchronization.
  const LtPlan& pl = it->second;
  const void* sa = w_scale_inv;
  const void* sb = stats + 1;
  fp8_check(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)), "set A scale");
  fp8_check(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)), "set B scale");
  const float alpha = 1.0f, beta = 0.0f;
  fp8_check(cublasLtMatmul(lt_, pl.op, &alpha, w_codes, pl.a, codes, pl.b, &beta, a.y.data, pl.c, a.y.data, pl.c,
                           &pl.algo, lt_workspace_, lt_workspace_bytes_, stream_),
            "cublasLtMatmul");
}

void CudaBackend::lt_choose_lowp_algo(LtPlan& plan, const char* op, const char* kind, int64_t m, int64_t in,
                                      int64_t out) {
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t s = cublasLtMatmulPreferenceCreate(&pref);
  const uint64_t ws = lt_workspace_bytes_;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  const uint32_t al = 16;
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al));
  cublasLtMatmulHeuristicResult_t res{};
  int count = 0;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulAlgoGetHeuristic(lt_, plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1, &res, &count);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || count == 0) {
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatmulDescDestroy(plan.op);
    fail(ErrorKind::Unsupported,
         std::string("cuda op ") + op + ", (" + std::to_string(m) + "," + std::to_string(in) + ") x (" +
             std::to_string(out) + "," + std::to_string(in) + ")^T",
         std::string("cuBLASLt has no ") + kind + " kernel for this problem (status " + std::to_string(int(s)) + ")",
         "plan the base GEMMs in bf16 (gemm_dtype bf16)");
  }
  plan.algo = res.algo;
}

}  // namespace qlora::cuda
