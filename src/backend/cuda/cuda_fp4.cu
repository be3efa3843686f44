// CUDA matmul_fp4: a base projection through cuBLASLt's block-scaled FP4 GEMM (NVFP4: e2m1 data,
// an e4m3 scale per 16 elements, CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3), on an NVFP4 or MXFP4
// weight's stored codes and the GEMM scales made from it at load (quant/fp4_gemm.h).
//
// The bf16 activation is quantized to NVFP4 with quant/nvfp4.cpp's recipe (TransformerEngine's):
// a per-tensor amax (one partial per block, no atomics), then one thread per 16-element block
// computes its e4m3 scale, its e2m1 codes (round-to-nearest-even, saturating) and writes the
// scale where cuBLASLt's tiled layout wants it (quant/block_scale_layout.h). Block 0 records
// {amax, decode scale, alpha = both decode scales, beta = 0}: cuBLASLt reads alpha and beta from
// device memory (POINTER_MODE_DEVICE), so no host synchronization.
//
// cuBLASLt's rules for it (cuBLAS documentation, cublasLtMatmul; NVIDIA's LtNvfp4Matmul sample;
// TransformerEngine's "NVFP4 gemm is only supported in TN layout"): compute capability 10.x, A and B
// both CUDA_R_4F_E2M1 with VEC16_UE4M3 scale modes and scale pointers, A transposed and B not
// ("TN": the blocks run along K), CUBLAS_COMPUTE_32F, 16-byte aligned operands and rows. The
// row-major y (m,out) = x w^T is the column-major y^T = w x^T with w stored (in,out) column-major:
// A = w (TRANSA = T), B = x codes (TRANSB = N), C = D = y (bf16).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <string>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "quant/block_scale_layout.h"
#include "quant/fp4_gemm.h"

namespace qlora::cuda {

namespace {

constexpr int kFp4Threads = 256;
static_assert(cuda_plan::kFp8AmaxBlocks <= kFp4Threads, "one thread per amax partial in fp4_quantize_kernel");

// partial[blockIdx.x] = max |x| over the block's grid-stride share.
__global__ void __launch_bounds__(kFp4Threads)
    fp4_amax_kernel(const __nv_bfloat16* __restrict__ x, int64_t n, float* __restrict__ partial) {
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

// e2m1 round-to-nearest-even, saturating to +-6, the sign kept (quant/minifloat.cpp f32_to_e2m1;
// ties: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4).
__device__ __forceinline__ uint8_t e2m1_rn(float v) {
  const float a = fabsf(v);
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return uint8_t(c | (signbit(v) ? 8 : 0));
}

// One thread per 16-element block of x (m, in): the NVFP4 recipe in quant/nvfp4.cpp's operation
// order, with __f*_rn so no contraction changes a rounding. Every block reduces the amax partials.
__global__ void __launch_bounds__(kFp4Threads)
    fp4_quantize_kernel(const __nv_bfloat16* __restrict__ x, int64_t m, int64_t in, const float* __restrict__ partial,
                        int n_partial, const float* __restrict__ w_decode, float* __restrict__ stats,
                        uint8_t* __restrict__ codes, uint8_t* __restrict__ tiles) {
  QLORA_SHARED(float[32], red);
  QLORA_SHARED(float, s_enc_sh);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float mx = int(threadIdx.x) < n_partial ? partial[threadIdx.x] : 0.0f;
  mx = warp_max(mx);
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  if (threadIdx.x == 0) {
    float amax = 0.0f;
    for (int w = 0; w < int(blockDim.x >> 5); w++) amax = fmaxf(amax, red[w]);
    float s_enc = amax == 0.0f ? 1.0f : fminf(__fdiv_rn(2688.0f, amax), FLT_MAX);  // 448 * 6
    s_enc_sh = s_enc;
    if (blockIdx.x == 0) {
      const float s_dec = __fdiv_rn(1.0f, s_enc);
      stats[0] = amax;
      stats[1] = s_dec;
      stats[2] = __fmul_rn(s_dec, *w_decode);  // alpha
      stats[3] = 0.0f;                          // beta
    }
  }
  __syncthreads();
  const float s_enc = s_enc_sh, s_dec = __fdiv_rn(1.0f, s_enc), block_mul = __fmul_rn(s_enc, 1.0f / 6.0f);
  const int64_t kb = in / 16, nb = m * kb;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < nb; b += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = b / kb, cb = b % kb;
    const __nv_bfloat16* xb = x + r * in + cb * 16;
    float v[16];
    float bmax = 0.0f;
    for (int i = 0; i < 16; i++) {
      v[i] = __bfloat162float(xb[i]);
      bmax = fmaxf(bmax, fabsf(v[i]));
    }
    const __nv_fp8_storage_t sb = __nv_cvt_float_to_fp8(fminf(__fmul_rn(bmax, block_mul), FLT_MAX), __NV_SATFINITE, __NV_E4M3);
    const float sbf = __half2float(__half(__nv_cvt_fp8_to_halfraw(sb, __NV_E4M3)));
    const float enc = fminf(__fdiv_rn(1.0f, __fmul_rn(sbf, s_dec)), FLT_MAX);
    uint8_t* cq = codes + r * (in / 2) + cb * 8;
    for (int i = 0; i < 8; i++)
      cq[i] = uint8_t(e2m1_rn(__fmul_rn(v[2 * i], enc)) | (e2m1_rn(__fmul_rn(v[2 * i + 1], enc)) << 4));
    tiles[block_scale_offset(r, cb, kb)] = sb;
  }
}

void fp4_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail(ErrorKind::Internal, "cuda op matmul_fp4", std::string(what) + " failed with cublas status " + std::to_string(int(s)),
         "check the FP4 GEMM's shapes and alignment; run under compute-sanitizer");
}

}  // namespace

void CudaBackend::matmul_fp4(const MatmulFp4Args& a) {
  const char* op = "matmul_fp4";
  check_dim(op, "m", a.m);
  check_dim(op, "out", a.out);
  check_dim(op, "in", a.in);
  check_tensor(op, "y", a.y, a.m * a.out, true, false);
  check_tensor(op, "x", a.x, a.m * a.in, true, false);
  check_ptr(op, "w", a.w);
  check_ptr(op, "w_scales", a.w_scales);
  if (!has_fp4_gemm())
    fail(ErrorKind::Unsupported, "cuda op matmul_fp4",
         "this GPU has no block-scaled FP4 tensor cores (compute capability " + std::to_string(cc_ / 10) + "." +
             std::to_string(cc_ % 10) + "; cuBLASLt's NVFP4 GEMM needs 10.x)",
         "plan the base GEMMs in bf16 (gemm_dtype bf16): the quantized base is dequantized instead");
  if (!fp4_gemm_shape_ok(a.out, a.in))
    fail(ErrorKind::Unsupported, "cuda op matmul_fp4, weight (" + std::to_string(a.out) + "," + std::to_string(a.in) + ")",
         "cuBLASLt's FP4 kernels need in % 32 == 0 (e2m1 rows of 16-byte multiples) and out % 8 == 0 (bf16 output)",
         "plan the base GEMMs in bf16 for this model");
  if (!aligned16(a.x.data) || !aligned16(a.y.data) || !aligned16(a.w) || !aligned16(a.w_scales))
    fail(ErrorKind::Unsupported, "cuda op matmul_fp4", "x, y, the weight's codes and its GEMM scales must be 16-byte aligned",
         "pass whole planned buffers (the arena aligns them to 256 bytes; quant_layout puts the codes first)");
  if (a.m == 0) return;
  const int64_t n = a.m * a.in;
  char* scr = static_cast<char*>(scratch(Scratch::Fp4Act, size_t(cuda_plan::fp4_act_bytes(a.m, a.in)), op));
  auto* partial = reinterpret_cast<float*>(scr);
  auto* stats = reinterpret_cast<float*>(scr + cuda_plan::kFp8StatsOffset);
  auto* codes = reinterpret_cast<uint8_t*>(scr + cuda_plan::kFp8CodesOffset);
  const int64_t tiles_off = cuda_plan::fp4_act_scales_offset(a.m, a.in);
  auto* tiles = reinterpret_cast<uint8_t*>(scr + tiles_off);
  const int64_t kb = a.in / 16;
  // The tiles' padding (rows past m, blocks past in/16) must read as zero scales.
  if (a.m % 128 != 0 || kb % 4 != 0)
    QLORA_CUDA_CHECK(cudaMemsetAsync(tiles, 0, size_t(block_scale_tiled_bytes(a.m, kb)), stream_));
  const int blocks = int(std::clamp<int64_t>(ceil_div64(n, kFp4Threads * 8), 1, cuda_plan::kFp8AmaxBlocks));
  launch(fp4_amax_kernel, {blocks, kFp4Threads, 0, stream_}, static_cast<const __nv_bfloat16*>(a.x.data), n, partial);
  QLORA_CUDA_LAUNCH_CHECK();
  const int qblocks = int(std::clamp<int64_t>(ceil_div64(a.m * kb, kFp4Threads), 1, int64_t(sm_count_) * 8));
  launch(fp4_quantize_kernel, {qblocks, kFp4Threads, 0, stream_}, static_cast<const __nv_bfloat16*>(a.x.data), a.m, a.in,
         static_cast<const float*>(partial), blocks, static_cast<const float*>(a.w_scales), stats, codes, tiles);
  QLORA_CUDA_LAUNCH_CHECK();
  // Descriptors, layouts and algorithm once per shape, kept with the bf16 plans (a_t = -2 marks FP4).
  GemmKey key{a.out, a.m, a.in, 1, 0, -2, -2, int(DType::BF16), 16, 16, 16, 1};
  const void* sa = static_cast<const char*>(a.w_scales) + kFp4GemmHeaderBytes;  // the weight's scale tiles
  const void* sb = tiles;
  auto it = lt_plans_.find(key);
  if (it == lt_plans_.end()) {
    LtPlan plan;
    fp4_check(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const int32_t vec16 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
    const int32_t dev = CUBLASLT_POINTER_MODE_DEVICE;
    fp4_check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
    fp4_check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
    fp4_check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec16, sizeof(vec16)), "set A scale mode");
    fp4_check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec16, sizeof(vec16)), "set B scale mode");
    fp4_check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &dev, sizeof(dev)), "set pointer mode");
    fp4_check(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_4F_E2M1, uint64_t(a.in), uint64_t(a.out), a.in), "layout A");
    fp4_check(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_4F_E2M1, uint64_t(a.in), uint64_t(a.m), a.in), "layout B");
    fp4_check(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_16BF, uint64_t(a.out), uint64_t(a.m), a.out), "layout C");
    // The heuristic wants the scale pointers set (a scale mode needs its pointer): this call's.
    fp4_check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)), "set A scale");
    fp4_check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)), "set B scale");
    lt_choose_lowp_algo(plan, "matmul_fp4", "block-scaled FP4", a.m, a.in, a.out);
    it = lt_plans_.emplace(key, plan).first;
  }
  // The weight's scale tiles change per call; the activation's stay in the scratch slot.
  const LtPlan& pl = it->second;
  fp4_check(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)), "set A scale");
  fp4_check(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)), "set B scale");
  fp4_check(cublasLtMatmul(lt_, pl.op, stats + 2, a.w, pl.a, codes, pl.b, stats + 3, a.y.data, pl.c, a.y.data, pl.c,
                           &pl.algo, lt_workspace_, lt_workspace_bytes_, stream_),
            "cublasLtMatmul");
}

}  // namespace qlora::cuda
