// cuBLASLt and cuBLAS for the host harness: the documented semantics of the calls the CUDA
// backend makes (layouts, transposes, leading dimensions, batch strides, epilogues, supported
// types, alignment), computed on the CPU.
//
// Misuse is answered with the status the real library documents (NOT_INITIALIZED for a null or
// destroyed handle, INVALID_VALUE for inconsistent arguments, NOT_SUPPORTED for a configuration
// with no kernel); beyond that, what would be undefined behaviour on a GPU (an operand outside
// device memory, a pointer less aligned than the algorithm was chosen for, an output overlapping
// an input) is answered with INVALID_VALUE instead of corrupting memory. Numerics: products
// accumulate in f32 (OpenBLAS sgemm on the decoded operands), then alpha/beta/bias/activation in float (the scale type), and
// the result is stored with round-to-nearest-even (FP8 outputs saturate to the largest finite).
#include <cblas.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_emu/emu_runtime.h"
#include "quant/block_scale_layout.h"

struct cublasLtContext {
  int unused = 0;
};
struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

namespace qlora::emu {
namespace {

// ---- Live objects: a destroyed or foreign handle/descriptor is reported, not dereferenced.
// Never freed, so that handles destroyed from static destructors still find it.
enum class Kind { LtHandle, Desc, Layout, Pref, BlasHandle };
struct Registry {
  std::mutex mu;
  std::unordered_map<const void*, Kind> live;
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}
void track(const void* p, Kind k) {
  auto& [mu, live] = registry();
  std::lock_guard<std::mutex> g(mu);
  live[p] = k;
}
bool untrack(const void* p, Kind k) {
  auto& [mu, live] = registry();
  std::lock_guard<std::mutex> g(mu);
  auto it = live.find(p);
  if (it == live.end() || it->second != k) return false;
  live.erase(it);
  return true;
}
bool is_live(const void* p, Kind k) {
  auto& [mu, live] = registry();
  std::lock_guard<std::mutex> g(mu);
  auto it = live.find(p);
  return p && it != live.end() && it->second == k;
}

// ---- Attributes: a fixed table of (id, size in bytes, default) per descriptor kind; set/get
// check the size exactly, as documented ("sizeInBytes doesn't match size of internal storage").
struct AttrSpec {
  int id;
  size_t size;
  int64_t def;
};
struct AttrSet {
  const AttrSpec* specs;
  size_t n;
  uint64_t vals[48] = {};
  AttrSet(const AttrSpec* s, size_t count) : specs(s), n(count) {
    for (size_t i = 0; i < n; ++i) std::memcpy(&vals[i], &specs[i].def, specs[i].size);
  }
  int index(int id) const {
    for (size_t i = 0; i < n; ++i)
      if (specs[i].id == id) return int(i);
    return -1;
  }
  cublasStatus_t set(int id, const void* buf, size_t size) {
    const int i = index(id);
    if (i < 0 || !buf || size != specs[i].size) return CUBLAS_STATUS_INVALID_VALUE;
    vals[i] = 0;
    std::memcpy(&vals[i], buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  cublasStatus_t get(int id, void* buf, size_t size, size_t* written) const {
    const int i = index(id);
    if (i < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (size == 0) {
      if (!written) return CUBLAS_STATUS_INVALID_VALUE;
      *written = specs[i].size;
      return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || size != specs[i].size) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(buf, &vals[i], size);
    if (written) *written = size;
    return CUBLAS_STATUS_SUCCESS;
  }
  template <class T>
  T value(int id) const {
    T t{};
    std::memcpy(&t, &vals[index(id)], sizeof(T));
    return t;
  }
  void put(int id, int64_t v) { std::memcpy(&vals[index(id)], &v, specs[index(id)].size); }
};

// Attribute ids, storage sizes and defaults as declared in cublasLt.h.
// clang-format off
constexpr AttrSpec kDescSpecs[] = {
    {CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, 4, CUBLAS_COMPUTE_32F}, {CUBLASLT_MATMUL_DESC_SCALE_TYPE, 4, CUDA_R_32F},
    {CUBLASLT_MATMUL_DESC_POINTER_MODE, 4, 0}, {CUBLASLT_MATMUL_DESC_TRANSA, 4, CUBLAS_OP_N},
    {CUBLASLT_MATMUL_DESC_TRANSB, 4, CUBLAS_OP_N}, {CUBLASLT_MATMUL_DESC_TRANSC, 4, CUBLAS_OP_N},
    {CUBLASLT_MATMUL_DESC_FILL_MODE, 4, CUBLAS_FILL_MODE_FULL},
    {CUBLASLT_MATMUL_DESC_EPILOGUE, 4, CUBLASLT_EPILOGUE_DEFAULT}, {CUBLASLT_MATMUL_DESC_BIAS_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, 8, 0}, {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, 8, 0}, {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, 8, 0},
    {CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, 8, 0}, {CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, 4, 0},
    {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, 8, 0}, {CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, 8, 0}, {CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, 8, 0}, {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, 4, -1},
    {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, 8, 0}, {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_FAST_ACCUM, 1, 0}, {CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, 4, -1},
    {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, 4, 0}, {CUBLASLT_MATMUL_DESC_B_SCALE_MODE, 4, 0},
    {CUBLASLT_MATMUL_DESC_C_SCALE_MODE, 4, 0}, {CUBLASLT_MATMUL_DESC_D_SCALE_MODE, 4, 0},
    {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE, 4, 0}, {CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, 4, 0}, {CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR, 8, 0},
};
constexpr AttrSpec kLayoutSpecs[] = {
    {CUBLASLT_MATRIX_LAYOUT_TYPE, 4, CUDA_R_32F}, {CUBLASLT_MATRIX_LAYOUT_ORDER, 4, CUBLASLT_ORDER_COL},
    {CUBLASLT_MATRIX_LAYOUT_ROWS, 8, 0}, {CUBLASLT_MATRIX_LAYOUT_COLS, 8, 0}, {CUBLASLT_MATRIX_LAYOUT_LD, 8, 0},
    {CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 4, 1}, {CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, 8, 0},
    {CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, 8, 0}, {CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, 4, CUBLASLT_BATCH_MODE_STRIDED},
};
constexpr AttrSpec kPrefSpecs[] = {
    {CUBLASLT_MATMUL_PREF_SEARCH_MODE, 4, CUBLASLT_SEARCH_BEST_FIT}, {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, 8, 0},
    {CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, 4, CUBLASLT_REDUCTION_SCHEME_MASK},
    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, 4, 256}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, 4, 256},
    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, 4, 256}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, 4, 256},
    {CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, 4, 0}, {CUBLASLT_MATMUL_PREF_IMPL_MASK, 8, -1},
};
// clang-format on

struct Desc : cublasLtMatmulDescOpaque_t {
  AttrSet a{kDescSpecs, std::size(kDescSpecs)};
};
struct Layout : cublasLtMatrixLayoutOpaque_t {
  AttrSet a{kLayoutSpecs, std::size(kLayoutSpecs)};
};
struct Pref : cublasLtMatmulPreferenceOpaque_t {
  AttrSet a{kPrefSpecs, std::size(kPrefSpecs)};
};

// ---- Element types.
bool is_fp8(int t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
bool is_fp4(int t) { return t == CUDA_R_4F_E2M1; }
// Bits per element: 4 for e2m1, two to a byte, the element of even index in the low nibble (the
// order of cuda_fp4.h's __nv_fp4x2_storage_t and of PTX cvt.rn.satfinite.e2m1x2.f32).
size_t type_bits(int t) { return is_fp4(t) ? 4 : 0; }
size_t type_size(int t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2:
    case CUDA_R_4F_E2M1: return 1;  // e2m1: the smallest addressable unit holds two elements
    default: return 0;
  }
}
// e2m1 (OCP): sign, 2 exponent bits (bias 1), 1 mantissa bit; no inf or NaN.
float e2m1_value(uint8_t code) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}
float load(const void* base, int t, int64_t i) {
  switch (t) {
    case CUDA_R_4F_E2M1: {
      const uint8_t b = static_cast<const uint8_t*>(base)[i / 2];
      return e2m1_value(i % 2 == 0 ? uint8_t(b & 0x0F) : uint8_t(b >> 4));
    }
    case CUDA_R_32F: return static_cast<const float*>(base)[i];
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(base)[i]);
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default: {  // FP8: decode through half, which holds every e4m3/e5m2 value exactly
      const auto s = static_cast<const __nv_fp8_storage_t*>(base)[i];
      return __half2float(__half(__nv_cvt_fp8_to_halfraw(s, t == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2)));
    }
  }
}
void store(void* base, int t, int64_t i, float v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(base)[i] = v; break;
    case CUDA_R_16F: static_cast<__half*>(base)[i] = __float2half_rn(v); break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); break;
    default:
      static_cast<__nv_fp8_storage_t*>(base)[i] =
          __nv_cvt_float_to_fp8(v, __NV_SATFINITE, t == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2);
  }
}

// ---- One matrix operand as stored: type, order, shape, leading dimension, strided batches.
struct Mat {
  int type = CUDA_R_32F;
  bool row_major = false;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;
  size_t esize() const { return type_size(type); }
  size_t bits() const { return type_bits(type) ? type_bits(type) : 8 * type_size(type); }
  int64_t at(int64_t r, int64_t c) const { return row_major ? r * ld + c : r + c * ld; }
  int64_t span() const {
    return row_major ? int64_t(rows - 1) * ld + int64_t(cols) : int64_t(cols - 1) * ld + int64_t(rows);
  }
  uint64_t bytes() const { return ((uint64_t(batch - 1) * uint64_t(stride) + uint64_t(span())) * bits() + 7) / 8; }
  bool same(const Mat& o) const {
    return type == o.type && row_major == o.row_major && rows == o.rows && cols == o.cols && ld == o.ld &&
           batch == o.batch && (batch == 1 || stride == o.stride);
  }
};

// A leading dimension below the stored row (col-major) or column (row-major) count makes columns
// overlap: INVALID_VALUE, as documented for CUBLASLT_MATRIX_LAYOUT_LD. Sizes are limited so that
// every element offset fits comfortably in int64.
cublasStatus_t check_mat(const Mat& m) {
  if (m.rows > uint64_t(INT32_MAX) || m.cols > uint64_t(INT32_MAX)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m.rows == 0 || m.cols == 0) return CUBLAS_STATUS_NOT_SUPPORTED;  // no kernel for an empty problem
  const uint64_t minor = m.row_major ? m.cols : m.rows, major = m.row_major ? m.rows : m.cols;
  if (m.ld < 1 || uint64_t(m.ld) < minor || m.ld > (int64_t(1) << 40) || m.batch < 1 || m.stride < 0 ||
      m.stride > (int64_t(1) << 44) || (uint64_t(m.ld) * major) > (uint64_t(1) << 44))
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

bool overlaps(const void* p, uint64_t pb, const void* q, uint64_t qb) {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  return pb && qb && a < b + qb && b < a + pb;
}
bool aligned(const void* p, uint64_t a) { return a <= 1 || reinterpret_cast<uintptr_t>(p) % a == 0; }

// Every batch's base pointer of `m` at `p` is aligned to `align` and the whole extent is device memory.
bool operand_ok(const void* p, const Mat& m, uint64_t align) {
  if (!p || !is_device_range(p, m.bytes())) return false;
  return aligned(p, align) && (m.batch == 1 || align <= 1 || (uint64_t(m.stride) * m.esize()) % align == 0);
}

// ---- The computation: D = epilogue(alpha*scale_a*scale_b*op(A)op(B) + beta*scale_c*C + bias), per batch.
struct Gemm {
  Mat a, b, c, d;
  bool ta = false, tb = false;
  uint64_t m = 0, n = 0, k = 0;
  const void *A = nullptr, *B = nullptr, *C = nullptr;
  void* D = nullptr;
  float alpha = 1, beta = 0, scale_ab = 1, scale_c = 1, scale_d = 1;
  bool skip_ab = false;  // alpha == 0 or k == 0 in legacy BLAS: A and B are not read
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int bias_type = CUDA_R_32F;
  int64_t bias_stride = 0;
  float* amax = nullptr;
  // Block scaling: one scale of op(A)'s rows and op(B)'s columns per `block` of K, tiled as
  // quant/block_scale_layout.h: e8m0 per 32 (VEC32_UE8M0, MXFP8) or e4m3 per 16 (VEC16_UE4M3,
  // NVFP4); null for per-tensor scaling.
  const uint8_t *a_bs = nullptr, *b_bs = nullptr;
  int64_t block = 32;
  bool ue4m3 = false;
};

// 2^(e - 127): an e8m0 block scale (0xFF, NaN, never comes from a finite block).
float e8m0(uint8_t e) { return e == 0xFF ? NAN : std::ldexp(1.0f, int(e) - 127); }
// A block scale of the problem's kind: ue4m3 (an e4m3 byte, read through half, which holds every
// e4m3 value exactly) or e8m0.
float block_scale(const Gemm& g, uint8_t v) {
  return g.ue4m3 ? __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E4M3))) : e8m0(v);
}

float activation(uint32_t epilogue, float v) {
  if (epilogue & CUBLASLT_EPILOGUE_RELU) return v > 0.0f ? v : 0.0f;  // max(x, 0); NaN becomes 0
  if (epilogue & CUBLASLT_EPILOGUE_GELU) {                            // tanh approximation
    const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    return 0.5f * v * (1.0f + std::tanh(u));
  }
  return v;
}

// Base of batch `bi` (null stays null: an operand the call does not read).
const void* batch_ptr(const void* p, int32_t bi, int64_t stride, size_t esize) {
  return p ? static_cast<const char*>(p) + uint64_t(bi) * uint64_t(stride) * esize : nullptr;
}

// The products go through OpenBLAS sgemm on the operands decoded to f32 (exact for bf16, f16 and
// fp8): f32 accumulation, as the tensor cores accumulate, and fast enough to run the backend tests
// at Llama-70B shapes. B is decoded a block of columns at a time to bound the memory.
void run(const Gemm& g) {
  const int64_t m = int64_t(g.m), n = int64_t(g.n), k = g.skip_ab ? 0 : int64_t(g.k);
  const int64_t nb = std::max<int64_t>(1, std::min<int64_t>(n, (int64_t(1) << 24) / std::max<int64_t>(k, 1)));
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * nb)), p(static_cast<size_t>(m * nb));
  float amax = 0.0f;
  for (int32_t bi = 0; bi < g.d.batch; ++bi) {
    const void* A = batch_ptr(g.A, bi, g.a.stride, g.a.esize());
    const void* B = batch_ptr(g.B, bi, g.b.stride, g.b.esize());
    const void* C = batch_ptr(g.C, bi, g.c.stride, g.c.esize());
    void* D = const_cast<void*>(batch_ptr(g.D, bi, g.d.stride, g.d.esize()));
    const void* bias = batch_ptr(g.bias, bi, g.bias_stride, type_size(g.bias_type));
    const int64_t bk = g.block, kb = k / bk;  // block-scaled problems have k % block == 0
    for (int64_t i = 0; i < m; ++i)  // op(A), row-major m x k
      for (int64_t q = 0; q < k; ++q) {
        a[size_t(i * k + q)] = load(A, g.a.type, g.ta ? g.a.at(q, i) : g.a.at(i, q));
        if (g.a_bs) a[size_t(i * k + q)] *= block_scale(g, g.a_bs[block_scale_offset(i, q / bk, kb)]);
      }
    for (int64_t j0 = 0; j0 < n; j0 += nb) {
      const int64_t w = std::min(nb, n - j0);
      for (int64_t q = 0; q < k; ++q)  // op(B) columns j0..j0+w, row-major k x w
        for (int64_t j = 0; j < w; ++j)
          b[size_t(q * w + j)] = load(B, g.b.type, g.tb ? g.b.at(j0 + j, q) : g.b.at(q, j0 + j)) *
                                 (g.b_bs ? block_scale(g, g.b_bs[block_scale_offset(j0 + j, q / bk, kb)]) : 1.0f);
      if (k > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(w), int(k), 1.0f, a.data(), int(k), b.data(),
                    int(w), 0.0f, p.data(), int(w));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < w; ++j) {
          float v = k == 0 ? 0.0f : g.alpha * (g.scale_ab * p[size_t(i * w + j)]);
          if (g.beta != 0.0f) v += g.beta * (g.scale_c * load(C, g.c.type, g.c.at(i, j0 + j)));  // beta == 0: C unread
          if (g.epilogue & CUBLASLT_EPILOGUE_BIAS) v += load(bias, g.bias_type, i);
          v = activation(g.epilogue, v);
          amax = std::max(amax, std::fabs(v));
          store(D, g.d.type, g.d.at(i, j0 + j), is_fp8(g.d.type) ? v * g.scale_d : v);
        }
    }
  }
  if (g.amax) *g.amax = amax;
}

// ---- cuBLASLt problem validation, shared by the heuristic and the matmul.
struct Problem {
  Gemm g;
  uint32_t pointer_mode = 0;
  const void* scale[4] = {};  // A, B, C, D scale pointers
  bool block_scaled = false;  // A and B block-scaled: MXFP8 (VEC32_UE8M0) or NVFP4 (VEC16_UE4M3)
};

cublasStatus_t lt_problem(const void* op, const void* ad, const void* bd, const void* cd, const void* dd, Problem& pr) {
  if (!is_live(op, Kind::Desc) || !is_live(ad, Kind::Layout) || !is_live(bd, Kind::Layout) ||
      !is_live(cd, Kind::Layout) || !is_live(dd, Kind::Layout))
    return CUBLAS_STATUS_INVALID_VALUE;
  const AttrSet& o = static_cast<const Desc*>(op)->a;
  Mat* mats[4] = {&pr.g.a, &pr.g.b, &pr.g.c, &pr.g.d};
  const void* descs[4] = {ad, bd, cd, dd};
  for (int i = 0; i < 4; ++i) {
    const AttrSet& l = static_cast<const Layout*>(descs[i])->a;
    Mat& m = *mats[i];
    m.type = int(l.value<uint32_t>(CUBLASLT_MATRIX_LAYOUT_TYPE));
    const int32_t order = l.value<int32_t>(CUBLASLT_MATRIX_LAYOUT_ORDER);
    if (order != CUBLASLT_ORDER_COL && order != CUBLASLT_ORDER_ROW) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l.value<int64_t>(CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET) != 0 ||
        l.value<uint32_t>(CUBLASLT_MATRIX_LAYOUT_BATCH_MODE) != CUBLASLT_BATCH_MODE_STRIDED)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    m.row_major = order == CUBLASLT_ORDER_ROW;
    m.rows = l.value<uint64_t>(CUBLASLT_MATRIX_LAYOUT_ROWS);
    m.cols = l.value<uint64_t>(CUBLASLT_MATRIX_LAYOUT_COLS);
    m.ld = l.value<int64_t>(CUBLASLT_MATRIX_LAYOUT_LD);
    m.batch = l.value<int32_t>(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
    m.stride = l.value<int64_t>(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
    if (type_size(m.type) == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (cublasStatus_t s = check_mat(m); s != CUBLAS_STATUS_SUCCESS) return s;
  }
  Gemm& g = pr.g;
  const int32_t opa = o.value<int32_t>(CUBLASLT_MATMUL_DESC_TRANSA),
                opb = o.value<int32_t>(CUBLASLT_MATMUL_DESC_TRANSB);
  auto valid_op = [](int32_t x) { return x == CUBLAS_OP_N || x == CUBLAS_OP_T || x == CUBLAS_OP_C; };
  if (!valid_op(opa) || !valid_op(opb)) return CUBLAS_STATUS_INVALID_VALUE;
  g.ta = opa != CUBLAS_OP_N;  // CUBLAS_OP_C is CUBLAS_OP_T for real types
  g.tb = opb != CUBLAS_OP_N;
  // Shapes: op(A) m x k, op(B) k x n, C and D m x n, equal batch counts (stride 0 broadcasts A/B/C).
  g.m = g.ta ? g.a.cols : g.a.rows;
  g.k = g.ta ? g.a.rows : g.a.cols;
  g.n = g.tb ? g.b.rows : g.b.cols;
  if ((g.tb ? g.b.cols : g.b.rows) != g.k || g.c.rows != g.m || g.c.cols != g.n || g.d.rows != g.m || g.d.cols != g.n)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (g.a.batch != g.d.batch || g.b.batch != g.d.batch || g.c.batch != g.d.batch) return CUBLAS_STATUS_INVALID_VALUE;
  if (g.d.batch > 1 && g.d.stride < g.d.span()) return CUBLAS_STATUS_INVALID_VALUE;  // batches of D would overlap
  // Operation: fp32 compute and scale; host or device scalars; no TRANSC or triangular fill.
  const int32_t compute = o.value<int32_t>(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE);
  if ((compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC) ||
      o.value<int32_t>(CUBLASLT_MATMUL_DESC_SCALE_TYPE) != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  pr.pointer_mode = o.value<uint32_t>(CUBLASLT_MATMUL_DESC_POINTER_MODE);
  if (pr.pointer_mode != CUBLASLT_POINTER_MODE_HOST && pr.pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (o.value<int32_t>(CUBLASLT_MATMUL_DESC_TRANSC) != CUBLAS_OP_N ||
      o.value<int32_t>(CUBLASLT_MATMUL_DESC_FILL_MODE) != CUBLAS_FILL_MODE_FULL)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // Types: the cublasLtMatmul "Datatypes supported" tables for CUBLAS_COMPUTE_32F / CUDA_R_32F.
  const int at = g.a.type, bt = g.b.type, ct = g.c.type, dt = g.d.type;
  const bool fp4 = is_fp4(at) || is_fp4(bt);
  const bool fp8 = is_fp8(at) || is_fp8(bt) || fp4;  // the narrow types share FP8's rules below
  int bias_default = dt;
  if (!fp8) {
    const bool ok =
        at == bt && ct == dt &&
        ((at == CUDA_R_16BF && (dt == CUDA_R_16BF || dt == CUDA_R_32F)) ||
         (at == CUDA_R_16F && (dt == CUDA_R_16F || dt == CUDA_R_32F)) || (at == CUDA_R_32F && dt == CUDA_R_32F));
    if (!ok) return CUBLAS_STATUS_NOT_SUPPORTED;
  } else {
    // e2m1 pairs only with e2m1 (cublasLtMatmul's block-scaled type table; an FP4 D, with its own
    // D_OUT scales, is not emulated).
    if (fp4 && !(is_fp4(at) && is_fp4(bt) && ct == dt && (dt == CUDA_R_16BF || dt == CUDA_R_16F || dt == CUDA_R_32F)))
      return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!fp4 && (!is_fp8(at) || !is_fp8(bt) || (at == CUDA_R_8F_E5M2 && bt == CUDA_R_8F_E5M2)))
      return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool wide_out = ct == dt && (dt == CUDA_R_16BF || dt == CUDA_R_16F || dt == CUDA_R_32F);
    const bool fp8_out =
        (ct == CUDA_R_16BF || ct == CUDA_R_16F) &&
        (dt == CUDA_R_8F_E4M3 || (dt == CUDA_R_8F_E5M2 && (at == CUDA_R_8F_E5M2 || bt == CUDA_R_8F_E5M2)));
    if (!wide_out && !fp8_out) return CUBLAS_STATUS_NOT_SUPPORTED;
    bias_default = fp8_out ? ct : (dt == CUDA_R_32F ? CUDA_R_16BF : dt);
    // FP8 kernels (cuBLAS documentation, cublasLtMatmul, FP8 requirements): Ada/Hopper and later;
    // "TN" only except on Blackwell datacenter parts (10.x); compute type exactly
    // CUBLAS_COMPUTE_32F (no _PEDANTIC variant, no 16F accumulation) with a CUDA_R_32F scale type;
    // column-major A/B; 16-byte aligned stored rows and leading dimensions (Tensor Core Usage).
    if (compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    const int cc = arch();
    if (cc < 89) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (cc / 10 != 10 && !(g.ta && !g.tb)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (g.a.row_major || g.b.row_major) return CUBLAS_STATUS_NOT_SUPPORTED;
    for (const Mat* x : mats)  // 16 bytes = 128 bits: 32 e2m1, 16 fp8, 8 bf16 elements
      if ((x->rows * x->bits()) % 128 != 0 || (uint64_t(x->ld) * x->bits()) % 128 != 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // Epilogue: bias (a packed vector of D's rows) and/or RELU / GELU; no AUX or gradient outputs.
  g.epilogue = o.value<uint32_t>(CUBLASLT_MATMUL_DESC_EPILOGUE);
  switch (g.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_BIAS: break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const int32_t bias_type = o.value<int32_t>(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
  if (bias_type != -1 && bias_type != bias_default) return CUBLAS_STATUS_NOT_SUPPORTED;
  g.bias_type = bias_default;
  g.bias = o.value<const void*>(CUBLASLT_MATMUL_DESC_BIAS_POINTER);
  g.bias_stride = o.value<int64_t>(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE);
  // Per-tensor fp32 scales: FP8 problems only (A/B/C scale, amax of D); D's scale only for an FP8 D.
  const int scale_attrs[4] = {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                              CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER};
  for (int i = 0; i < 4; ++i) pr.scale[i] = o.value<const void*>(scale_attrs[i]);
  g.amax = o.value<float*>(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER);
  if (!fp8 && (pr.scale[0] || pr.scale[1] || pr.scale[2] || g.amax)) return CUBLAS_STATUS_INVALID_VALUE;
  if (pr.scale[3] && !is_fp8(dt)) return CUBLAS_STATUS_INVALID_VALUE;
  for (int attr : {CUBLASLT_MATMUL_DESC_C_SCALE_MODE, CUBLASLT_MATMUL_DESC_D_SCALE_MODE,
                   CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE})
    if (o.value<int32_t>(attr) != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  // Block scaling of A and B (cuBLAS documentation: cublasLtMatmulMatrixScale_t, "1D Block Scaling
  // Factors Layout"): one scale per 32 (VEC32_UE8M0) or 16 (VEC16_UE4M3) elements of the
  // innermost dimension, which must be K, so A transposed and B not ("TN"); Blackwell (10.x).
  // Emulated: MXFP8 (both operands VEC32_UE8M0 on FP8 data, k % 32 == 0) and NVFP4 (both
  // VEC16_UE4M3 on e2m1 data; k % 32 == 0 already follows from 16-byte rows), one batch, a
  // bf16/f16/f32 D. e2m1 data has no kernel without block scales, and VEC32_UE8M0 on e2m1 (MXFP4)
  // is not among cublasLtMatmul's block-scaled type combinations as NVIDIA's samples and this
  // harness read them (LtNvfp4Matmul, LtMxfp8Matmul; a device run confirms): NOT_SUPPORTED, as is
  // any mix of scalar and block modes. NVFP4's per-tensor scales go into alpha.
  const int32_t ma = o.value<int32_t>(CUBLASLT_MATMUL_DESC_A_SCALE_MODE),
                mb = o.value<int32_t>(CUBLASLT_MATMUL_DESC_B_SCALE_MODE);
  if (ma != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F || mb != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F || fp4) {
    const int32_t want = fp4 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
    if (ma != want || mb != ma || !fp8 || arch() / 10 != 10 || !(g.ta && !g.tb) || g.k % 32 != 0 ||
        g.d.batch != 1 || is_fp8(dt) || g.amax)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    pr.block_scaled = true;
    g.block = fp4 ? 16 : 32;
    g.ue4m3 = fp4;
  }
  if (o.value<const void*>(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER) ||
      o.value<const void*>(CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

// The algorithm records what it was chosen for: the problem's types and the pointer alignments.
constexpr uint64_t kAlgoMagic = 0x514c454d55414c47ull;  // "QLEMUALG"
constexpr uint64_t kAlgoWorkspace = uint64_t(4) << 20;  // what the heuristic's algorithm asks for
uint64_t type_sig(const Gemm& g) {
  return uint64_t(g.a.type) | uint64_t(g.b.type) << 8 | uint64_t(g.c.type) << 16 | uint64_t(g.d.type) << 24;
}

// Read an fp32 scalar from a host or device pointer (device: must be live device memory).
bool read_scalar(const void* p, bool device, float& out) {
  if (!p || !aligned(p, 4) || (device && !is_device_range(p, 4))) return false;
  std::memcpy(&out, p, 4);
  return true;
}

}  // namespace
}  // namespace qlora::emu

using namespace qlora::emu;

namespace {
std::atomic<long> g_desc_created{0};
}  // namespace
namespace qlora::emu {
long lt_descriptors_created() { return g_desc_created.load(std::memory_order_relaxed); }
}  // namespace qlora::emu

extern "C" {

// ---------------------------------------------------------------------------------------------
// cuBLASLt
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext;
  track(*handle, Kind::LtHandle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!untrack(handle, Kind::LtHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
  auto* d = new Desc;
  g_desc_created.fetch_add(1, std::memory_order_relaxed);
  d->a.put(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, compute);
  d->a.put(CUBLASLT_MATMUL_DESC_SCALE_TYPE, scale);
  track(d, Kind::Desc);
  *desc = d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  if (!desc) return CUBLAS_STATUS_SUCCESS;
  if (!untrack(desc, Kind::Desc)) return CUBLAS_STATUS_INVALID_VALUE;
  delete static_cast<Desc*>(desc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  if (!is_live(desc, Kind::Desc)) return CUBLAS_STATUS_INVALID_VALUE;
  return static_cast<Desc*>(desc)->a.set(attr, buf, size);
}
cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, void* buf,
                                              size_t size, size_t* written) {
  if (!is_live(desc, Kind::Desc)) return CUBLAS_STATUS_INVALID_VALUE;
  return static_cast<Desc*>(desc)->a.get(attr, buf, size, written);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
  auto* l = new Layout;
  l->a.put(CUBLASLT_MATRIX_LAYOUT_TYPE, type);
  l->a.put(CUBLASLT_MATRIX_LAYOUT_ROWS, int64_t(rows));
  l->a.put(CUBLASLT_MATRIX_LAYOUT_COLS, int64_t(cols));
  l->a.put(CUBLASLT_MATRIX_LAYOUT_LD, ld);
  track(l, Kind::Layout);
  *layout = l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  if (!layout) return CUBLAS_STATUS_SUCCESS;
  if (!untrack(layout, Kind::Layout)) return CUBLAS_STATUS_INVALID_VALUE;
  delete static_cast<Layout*>(layout);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  if (!is_live(layout, Kind::Layout)) return CUBLAS_STATUS_INVALID_VALUE;
  return static_cast<Layout*>(layout)->a.set(attr, buf, size);
}
cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t size, size_t* written) {
  if (!is_live(layout, Kind::Layout)) return CUBLAS_STATUS_INVALID_VALUE;
  return static_cast<Layout*>(layout)->a.get(attr, buf, size, written);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  auto* p = new Pref;
  track(p, Kind::Pref);
  *pref = p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  if (!pref) return CUBLAS_STATUS_SUCCESS;
  if (!untrack(pref, Kind::Pref)) return CUBLAS_STATUS_INVALID_VALUE;
  delete static_cast<Pref*>(pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  if (!is_live(pref, Kind::Pref)) return CUBLAS_STATUS_INVALID_VALUE;
  return static_cast<Pref*>(pref)->a.set(attr, buf, size);
}
cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void* buf, size_t size,
                                                    size_t* written) {
  if (!is_live(pref, Kind::Pref)) return CUBLAS_STATUS_INVALID_VALUE;
  return static_cast<Pref*>(pref)->a.get(attr, buf, size, written);
}

// One algorithm for every valid, supported problem; NOT_SUPPORTED and no result otherwise. The
// preference's minimum alignments must be powers of two no smaller than the element (and 16 bytes
// for FP8); cublasLtMatmul then requires the pointers to honour them. The algorithm asks for
// workspace, as most of the real ones do, as much as the preference's MAX_WORKSPACE_BYTES allows up
// to kAlgoWorkspace (none when it allows none); cublasLtMatmul then requires it and overwrites it.
// QLORA_CUDA_EMU_LT_HEURISTIC=none makes the heuristic find no algorithm for any problem, as the
// real one does for shapes it has no kernel for (the caller's fallback then runs).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t ad, cublasLtMatrixLayout_t bd,
                                              cublasLtMatrixLayout_t cd, cublasLtMatrixLayout_t dd,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* count) {
  if (count) *count = 0;
  if (!is_live(handle, Kind::LtHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (requested <= 0 || !results || !count || !is_live(pref, Kind::Pref)) return CUBLAS_STATUS_INVALID_VALUE;
  Problem pr;
  if (cublasStatus_t s = lt_problem(op, ad, bd, cd, dd, pr); s != CUBLAS_STATUS_SUCCESS) return s;
  const AttrSet& p = static_cast<const Pref*>(pref)->a;
  const Mat* mats[4] = {&pr.g.a, &pr.g.b, &pr.g.c, &pr.g.d};
  const int align_attrs[4] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  uint64_t align = 0;
  const bool fp8 = is_fp8(pr.g.a.type) || is_fp4(pr.g.a.type);
  for (int i = 0; i < 4; ++i) {
    const uint32_t al = p.value<uint32_t>(align_attrs[i]);
    if (al == 0 || (al & (al - 1)) != 0 || al < mats[i]->esize() || (fp8 && al < 16))
      return CUBLAS_STATUS_NOT_SUPPORTED;
    align |= uint64_t(std::countr_zero(al)) << (8 * i);
  }
  if (const char* h = std::getenv("QLORA_CUDA_EMU_LT_HEURISTIC"); h && std::string(h) == "none")
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint64_t ws = std::min<uint64_t>(p.value<uint64_t>(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES), kAlgoWorkspace);
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].algo.data[0] = kAlgoMagic;
  results[0].algo.data[1] = align;
  results[0].algo.data[2] = type_sig(pr.g);
  results[0].algo.data[3] = ws;
  results[0].workspaceSize = ws;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t ad, const void* B, cublasLtMatrixLayout_t bd, const void* beta,
                              const void* C, cublasLtMatrixLayout_t cd, void* D, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  if (!is_live(handle, Kind::LtHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  // The stream's earlier work first (device-side scales and operands), then the GEMM at the call.
  drain_stream(stream);
  DeviceAccess device_work;
  Problem pr;
  if (cublasStatus_t s = lt_problem(op, ad, bd, cd, dd, pr); s != CUBLAS_STATUS_SUCCESS) return s;
  Gemm& g = pr.g;
  // Algorithm: one from the heuristic for these types (NULL: an implicit heuristic query, which
  // requires no more than element alignment).
  uint64_t align[4] = {g.a.esize(), g.b.esize(), g.c.esize(), g.d.esize()};
  if (algo) {
    if (algo->data[0] != kAlgoMagic || algo->data[2] != type_sig(g)) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < 4; ++i)
      align[i] = std::max<uint64_t>(align[i], uint64_t(1) << ((algo->data[1] >> (8 * i)) & 63));
  } else if (is_fp8(g.a.type) || is_fp4(g.a.type)) {
    std::fill(std::begin(align), std::end(align), 16);
  }
  if (workspace_bytes > 0 && (!workspace || !is_device_range(workspace, workspace_bytes)))
    return CUBLAS_STATUS_INVALID_VALUE;
  // An algorithm from the heuristic needs the workspace it reported ("workspaceSizeInBytes less than
  // the workspace required by the configured algo" is CUBLAS_STATUS_INVALID_VALUE).
  const uint64_t ws_needed = algo ? algo->data[3] : 0;
  if (workspace_bytes < ws_needed) return CUBLAS_STATUS_INVALID_VALUE;
  // Scalars: fp32, host or device as the pointer mode says.
  const bool dev = pr.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
  if (!read_scalar(alpha, dev, g.alpha) || !read_scalar(beta, dev, g.beta)) return CUBLAS_STATUS_INVALID_VALUE;
  // Operands: inside device memory for their whole (batched) extent, aligned as the algo assumed.
  if (!operand_ok(A, g.a, align[0]) || !operand_ok(B, g.b, align[1]) || !operand_ok(D, g.d, align[3]))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (overlaps(D, g.d.bytes(), A, g.a.bytes()) || overlaps(D, g.d.bytes(), B, g.b.bytes()))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (C == D) {
    if (!g.c.same(g.d)) return CUBLAS_STATUS_INVALID_VALUE;  // in place: C and D layouts must be equal
  } else if (g.beta != 0.0f) {
    if (!operand_ok(C, g.c, align[2]) || overlaps(C, g.c.bytes(), D, g.d.bytes())) return CUBLAS_STATUS_INVALID_VALUE;
  }
  g.A = A, g.B = B, g.C = C, g.D = D;
  if (g.epilogue & CUBLASLT_EPILOGUE_BIAS) {
    const size_t es = type_size(g.bias_type);
    if (!g.bias || g.bias_stride < 0 || !aligned(g.bias, es) ||
        !is_device_range(g.bias, (uint64_t(g.d.batch - 1) * uint64_t(g.bias_stride) + g.m) * es))
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  float s[4] = {1, 1, 1, 1};
  if (pr.block_scaled) {  // A/B scale pointers: the tiled block-scale arrays, whole, in device memory
    const int64_t kb = int64_t(g.k) / g.block;
    for (int i = 0; i < 2; ++i) {
      const uint64_t outer = i == 0 ? g.m : g.n;
      if (!pr.scale[i] || !aligned(pr.scale[i], 16) ||
          !is_device_range(pr.scale[i], uint64_t(qlora::block_scale_tiled_bytes(int64_t(outer), kb))))
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    g.a_bs = static_cast<const uint8_t*>(pr.scale[0]);
    g.b_bs = static_cast<const uint8_t*>(pr.scale[1]);
  }
  for (int i = pr.block_scaled ? 2 : 0; i < 4; ++i)
    if (pr.scale[i] && !read_scalar(pr.scale[i], true, s[i])) return CUBLAS_STATUS_INVALID_VALUE;
  g.scale_ab = s[0] * s[1], g.scale_c = s[2], g.scale_d = s[3];
  if (g.amax && (!aligned(g.amax, 4) || !is_device_range(g.amax, 4))) return CUBLAS_STATUS_INVALID_VALUE;
  // The kernel's scratch: whatever the workspace held is gone (NaN bytes), so a workspace shared
  // with live data shows.
  if (ws_needed > 0) std::memset(workspace, 0xff, ws_needed);
  run(g);
  return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// cuBLAS (legacy API, v2 names)
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  track(*handle, Kind::BlasHandle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (!untrack(handle, Kind::BlasHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!is_live(handle, Kind::BlasHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
  if (!is_live(handle, Kind::BlasHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!is_live(handle, Kind::BlasHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int base = int(mode) & ~int(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  if (base != 0 && base != 1 && base != 2 && base != 3 && base != 4 && base != 8) return CUBLAS_STATUS_INVALID_VALUE;
  handle->math = mode;  // the fast modes *allow* reduced precision; full fp32 is always computed here
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!is_live(handle, Kind::BlasHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (!is_live(handle, Kind::BlasHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) return CUBLAS_STATUS_INVALID_VALUE;
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode) {
  if (!is_live(handle, Kind::BlasHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->pointer_mode;
  return CUBLAS_STATUS_SUCCESS;
}

// Column-major C = alpha op(A) op(B) + beta C with the reference-BLAS argument checks (dimensions
// >= 0, lda >= max(1, rows of A as stored), ...) and the cublasGemmEx type table for
// CUBLAS_COMPUTE_32F[_PEDANTIC] (A/B 16BF or 16F with C of the same type or 32F; all 32F).
// Quick returns as in reference BLAS: m or n == 0 or batchCount == 0 do nothing; alpha == 0 or
// k == 0 do not read A or B; beta == 0 does not read C.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
  if (!is_live(handle, Kind::BlasHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  drain_stream(handle->stream);  // the stream's earlier work first, then the GEMM at the call
  DeviceAccess device_work;
  auto valid_op = [](cublasOperation_t x) { return x == CUBLAS_OP_N || x == CUBLAS_OP_T || x == CUBLAS_OP_C; };
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  if (!valid_op(transa) || !valid_op(transb) || m < 0 || n < 0 || k < 0 || batchCount < 0 ||
      lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m) || !alpha || !beta)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool algo_ok = (algo >= CUBLAS_GEMM_DEFAULT && algo <= CUBLAS_GEMM_ALGO23) ||
                       (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP) ||
                       algo == CUBLAS_GEMM_AUTOTUNE;
  if (!algo_ok) return CUBLAS_STATUS_INVALID_VALUE;
  if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool types_ok = Atype == Btype && ((Atype == CUDA_R_16BF && (Ctype == CUDA_R_16BF || Ctype == CUDA_R_32F)) ||
                                           (Atype == CUDA_R_16F && (Ctype == CUDA_R_16F || Ctype == CUDA_R_32F)) ||
                                           (Atype == CUDA_R_32F && Ctype == CUDA_R_32F));
  if (!types_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
  Gemm g;
  const bool dev = handle->pointer_mode == CUBLAS_POINTER_MODE_DEVICE;
  if (!read_scalar(alpha, dev, g.alpha) || !read_scalar(beta, dev, g.beta)) return CUBLAS_STATUS_INVALID_VALUE;
  g.m = uint64_t(m), g.n = uint64_t(n), g.k = uint64_t(k), g.ta = ta, g.tb = tb;
  g.skip_ab = k == 0 || g.alpha == 0.0f;
  auto mat = [&](int t, int rows, int cols, int ld, long long stride) {
    Mat x;
    x.type = t, x.rows = uint64_t(rows), x.cols = uint64_t(cols), x.ld = ld, x.batch = batchCount, x.stride = stride;
    return x;
  };
  g.a = mat(Atype, ta ? k : m, ta ? m : k, lda, strideA);
  g.b = mat(Btype, tb ? n : k, tb ? k : n, ldb, strideB);
  g.c = g.d = mat(Ctype, m, n, ldc, strideC);
  if (strideA < 0 || strideB < 0 || strideC < 0 || (batchCount > 1 && strideC < g.c.span()))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!operand_ok(C, g.c, g.c.esize())) return CUBLAS_STATUS_INVALID_VALUE;
  if (!g.skip_ab) {
    if (!operand_ok(A, g.a, g.a.esize()) || !operand_ok(B, g.b, g.b.esize()) ||
        overlaps(C, g.c.bytes(), A, g.a.bytes()) || overlaps(C, g.c.bytes(), B, g.b.bytes()))
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  g.A = A, g.B = B, g.C = C, g.D = C;
  run(g);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C,
                                    Ctype, ldc, 0, 1, computeType, algo);
}

}  // extern "C"
