// Dequantization kernels: bnb NF4/FP4 (+ double quant), NVFP4, MXFP4/MXFP8, FP8 -> bf16.
// Each thread of the fast path reads 16 packed bytes with one load and writes its bf16 values
// with 16-byte stores; block scales are fetched once per 16 bytes. Every product is formed with
// explicit rounding intrinsics in the CPU reference's order, so results match dequantize_ref_bf16.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/dequant.h"
#include "quant/bnb4.h"
#include "quant/quant_layout.h"
#include "quant/quantize.h"

namespace qlora::cuda {

namespace {

constexpr int kThreads = 256;  // every launch in this file; the kernels' __launch_bounds__

// E2M1 magnitudes by code, bit 3 the sign (code 8 is -0).
__constant__ float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// E4M3FN: bias 7, subnormals m * 2^-9, S.1111.111 is NaN, no infinities.
__device__ __forceinline__ float e4m3_value(uint32_t v) {
  const uint32_t s = (v >> 7) & 1u, e = (v >> 3) & 15u, m = v & 7u;
  float f;
  if (e == 15u && m == 7u)
    f = __int_as_float(0x7fc00000);
  else if (e == 0u)
    f = float(m) * 0.001953125f;
  else
    f = __int_as_float(int(((e + 120u) << 23) | (m << 20)));
  return s ? -f : f;
}
// E5M2 is the upper byte of an IEEE half.
__device__ __forceinline__ float e5m2_value(uint32_t v) {
  __half_raw r;
  r.x = uint16_t(v << 8);
  return __half2float(__half(r));
}
// E8M0: 2^(e-127); 0xFF is NaN; 0x00 is the subnormal 2^-127.
__device__ __forceinline__ float e8m0_value(uint32_t e) {
  if (e == 0xffu) return __int_as_float(0x7fc00000);
  return e == 0u ? __int_as_float(0x00400000) : __int_as_float(int(e << 23));
}

// 32 f32 values -> 64 bytes of bf16 at out (16-byte aligned).
__device__ __forceinline__ void store32(__nv_bfloat16* out, const float (&v)[32]) {
#pragma unroll
  for (int q = 0; q < 4; q++) {
    __nv_bfloat162 h[4];
#pragma unroll
    for (int j = 0; j < 4; j++) h[j] = __floats2bfloat162_rn(v[q * 8 + 2 * j], v[q * 8 + 2 * j + 1]);
    uint4 u;
    memcpy(&u, h, 16);  // one 16-byte store; memcpy keeps the type pun defined
    reinterpret_cast<uint4*>(out)[q] = u;
  }
}
__device__ __forceinline__ void store16(__nv_bfloat16* out, const float (&v)[16]) {
#pragma unroll
  for (int q = 0; q < 2; q++) {
    __nv_bfloat162 h[4];
#pragma unroll
    for (int j = 0; j < 4; j++) h[j] = __floats2bfloat162_rn(v[q * 8 + 2 * j], v[q * 8 + 2 * j + 1]);
    uint4 u;
    memcpy(&u, h, 16);  // one 16-byte store; memcpy keeps the type pun defined
    reinterpret_cast<uint4*>(out)[q] = u;
  }
}

// ---- bitsandbytes NF4/FP4: blocks of `bs` over the flattened tensor, high nibble first ----

__device__ __forceinline__ float bnb_absmax(const QuantDeviceView& q, const float* nested_code, float offset,
                                           int64_t block) {
  if (!q.params.double_quant) return q.absmax[block];
  return __fadd_rn(__fmul_rn(nested_code[q.absmax_q[block]], q.nested_absmax[block / 256]), offset);
}

__global__ void __launch_bounds__(kThreads)
    bnb4_kernel(const QuantDeviceView q, __nv_bfloat16* __restrict__ out, int64_t n, int vec) {
  QLORA_SHARED(float[16], code);
  QLORA_SHARED(float[256], nested);
  const float offset = q.offset_dev ? *q.offset_dev : q.offset;
  if (threadIdx.x < 16) code[threadIdx.x] = q.code4[threadIdx.x];
  if (q.params.double_quant)
    for (int i = threadIdx.x; i < 256; i += blockDim.x) nested[i] = q.nested_code[i];
  __syncthreads();
  const int64_t bs = q.params.blocksize, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {  // 16 bytes = 32 elements inside one block (bs is a multiple of 32)
    for (int64_t c = tid; c < n / 32; c += stride) {
      const uint4 u = reinterpret_cast<const uint4*>(q.data)[c];
      const float am = bnb_absmax(q, nested, offset, c * 32 / bs);
      const uint8_t* by = reinterpret_cast<const uint8_t*>(&u);
      float v[32];
#pragma unroll
      for (int j = 0; j < 16; j++) {
        v[2 * j] = __fmul_rn(code[by[j] >> 4], am);
        v[2 * j + 1] = __fmul_rn(code[by[j] & 15], am);
      }
      store32(out + c * 32, v);
    }
    return;
  }
  for (int64_t i = tid; i < n; i += stride) {
    const uint8_t byte = q.data[i / 2];
    const uint32_t nib = (i % 2 == 0) ? (byte >> 4) : (byte & 15u);
    out[i] = __float2bfloat16_rn(__fmul_rn(code[nib], bnb_absmax(q, nested, offset, i / bs)));
  }
}

// ---- NVFP4: rows of E2M1 (low nibble first), E4M3 scale per 16, f32 tensor scale ----

__global__ void __launch_bounds__(kThreads)
    nvfp4_kernel(const QuantDeviceView q, __nv_bfloat16* __restrict__ out, int vec) {
  const int64_t rows = q.rows, cols = q.cols, row_bytes = (cols + 1) / 2, n_cb = (cols + 15) / 16;
  const float s_dec = q.scales_f32[0];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {  // cols % 32 == 0: 16 bytes = 32 elements = two scale blocks of one row
    const int64_t per_row = cols / 32;
    for (int64_t c = tid; c < rows * per_row; c += stride) {
      const int64_t r = c / per_row, cc = c % per_row;
      const uint4 u = reinterpret_cast<const uint4*>(q.data + r * row_bytes)[cc];
      const float sb0 = e4m3_value(q.scales[r * n_cb + cc * 2]), sb1 = e4m3_value(q.scales[r * n_cb + cc * 2 + 1]);
      const uint8_t* by = reinterpret_cast<const uint8_t*>(&u);
      float v[32];
#pragma unroll
      for (int j = 0; j < 16; j++) {
        const float sb = j < 8 ? sb0 : sb1;
        v[2 * j] = __fmul_rn(__fmul_rn(kE2M1[by[j] & 15], sb), s_dec);
        v[2 * j + 1] = __fmul_rn(__fmul_rn(kE2M1[by[j] >> 4], sb), s_dec);
      }
      store32(out + r * cols + cc * 32, v);
    }
    return;
  }
  for (int64_t i = tid; i < rows * cols; i += stride) {
    const int64_t r = i / cols, c = i % cols;
    const uint8_t byte = q.data[r * row_bytes + c / 2];
    const float e = kE2M1[(c % 2 == 0) ? (byte & 15) : (byte >> 4)];
    out[i] = __float2bfloat16_rn(__fmul_rn(__fmul_rn(e, e4m3_value(q.scales[r * n_cb + c / 16])), s_dec));
  }
}

// ---- OCP MX: MXFP4 (E2M1, low nibble first) or MXFP8 (E4M3), E8M0 scale per 32 of a row ----

__global__ void __launch_bounds__(kThreads)
    mx_kernel(const QuantDeviceView q, __nv_bfloat16* __restrict__ out, int fp4, int vec) {
  const int64_t rows = q.rows, cols = q.cols, n_cb = (cols + 31) / 32;
  const int64_t row_bytes = fp4 ? (cols + 1) / 2 : cols;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec && fp4) {  // cols % 32 == 0: 16 bytes = one scale block
    const int64_t per_row = cols / 32;
    for (int64_t c = tid; c < rows * per_row; c += stride) {
      const int64_t r = c / per_row, cc = c % per_row;
      const uint4 u = reinterpret_cast<const uint4*>(q.data + r * row_bytes)[cc];
      const float s = e8m0_value(q.scales[r * n_cb + cc]);
      const uint8_t* by = reinterpret_cast<const uint8_t*>(&u);
      float v[32];
#pragma unroll
      for (int j = 0; j < 16; j++) {
        v[2 * j] = __fmul_rn(kE2M1[by[j] & 15], s);
        v[2 * j + 1] = __fmul_rn(kE2M1[by[j] >> 4], s);
      }
      store32(out + r * cols + cc * 32, v);
    }
    return;
  }
  if (vec) {  // MXFP8, cols % 32 == 0: 16 bytes = half a scale block
    const int64_t per_row = cols / 16;
    for (int64_t c = tid; c < rows * per_row; c += stride) {
      const int64_t r = c / per_row, cc = c % per_row;
      const uint4 u = reinterpret_cast<const uint4*>(q.data + r * row_bytes)[cc];
      const float s = e8m0_value(q.scales[r * n_cb + cc / 2]);
      const uint8_t* by = reinterpret_cast<const uint8_t*>(&u);
      float v[16];
#pragma unroll
      for (int j = 0; j < 16; j++) v[j] = __fmul_rn(e4m3_value(by[j]), s);
      store16(out + r * cols + cc * 16, v);
    }
    return;
  }
  for (int64_t i = tid; i < rows * cols; i += stride) {
    const int64_t r = i / cols, c = i % cols;
    float e;
    if (fp4) {
      const uint8_t byte = q.data[r * row_bytes + c / 2];
      e = kE2M1[(c % 2 == 0) ? (byte & 15) : (byte >> 4)];
    } else {
      e = e4m3_value(q.data[r * row_bytes + c]);
    }
    out[i] = __float2bfloat16_rn(__fmul_rn(e, e8m0_value(q.scales[r * n_cb + c / 32])));
  }
}

// ---- FP8 E4M3/E5M2 with an f32 scale_inv per tensor, 1x128 block or 128x128 tile ----

__global__ void __launch_bounds__(kThreads)
    fp8_kernel(const QuantDeviceView q, __nv_bfloat16* __restrict__ out, int e4m3, int64_t block_rows, int64_t block_cols,
               int64_t n_bc, int vec) {
  const int64_t rows = q.rows, cols = q.cols;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {  // cols % 16 == 0: 16 codes of one row inside one scale region (16 divides 128)
    const int64_t per_row = cols / 16;
    for (int64_t c = tid; c < rows * per_row; c += stride) {
      const int64_t r = c / per_row, c0 = (c % per_row) * 16;
      const uint4 u = reinterpret_cast<const uint4*>(q.data)[c];
      const float s = q.scales_f32[(r / block_rows) * n_bc + c0 / block_cols];
      const uint8_t* by = reinterpret_cast<const uint8_t*>(&u);
      float v[16];
#pragma unroll
      for (int j = 0; j < 16; j++) v[j] = __fmul_rn(e4m3 ? e4m3_value(by[j]) : e5m2_value(by[j]), s);
      store16(out + r * cols + c0, v);
    }
    return;
  }
  for (int64_t i = tid; i < rows * cols; i += stride) {
    const int64_t r = i / cols, c = i % cols;
    const float s = q.scales_f32[(r / block_rows) * n_bc + c / block_cols];
    out[i] = __float2bfloat16_rn(__fmul_rn(e4m3 ? e4m3_value(q.data[i]) : e5m2_value(q.data[i]), s));
  }
}

int grid_for(int64_t work, int sm_count) {
  return int(std::clamp<int64_t>(ceil_div64(work, kThreads), 1, int64_t(sm_count) * 16));
}

// Local names: the quant library's traits table is not linked into the CUDA backend.
const char* fmt_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::NF4: return "nf4";
    case QuantFormat::FP4: return "fp4";
    case QuantFormat::NVFP4: return "nvfp4";
    case QuantFormat::MXFP4: return "mxfp4";
    case QuantFormat::MXFP8_E4M3: return "mxfp8_e4m3";
    case QuantFormat::FP8_E4M3: return "fp8_e4m3";
    case QuantFormat::FP8_E5M2: return "fp8_e5m2";
  }
  return "?";
}

void need(const void* p, const char* what, QuantFormat f) {
  if (!p)
    fail(ErrorKind::Internal, std::string("cuda dequantize ") + fmt_name(f), std::string(what) + " is a null pointer",
         "upload every buffer the format uses (see QuantDeviceView)");
}

}  // namespace

void dequantize_bf16(Backend& backend, const QuantDeviceView& q, void* out_ptr) {
  auto* be = dynamic_cast<CudaBackend*>(&backend);
  if (!be) fail(ErrorKind::Internal, "cuda dequantize", "called with the " + backend.name() + " backend");
  dequantize_bf16_on(*be, q, out_ptr, be->stream());
}

void dequantize_bf16_on(CudaBackend& backend, const QuantDeviceView& q, void* out_ptr, cudaStream_t s) {
  CudaBackend* be = &backend;
  if (q.rows <= 0 || q.cols <= 0) fail(ErrorKind::Shape, "cuda dequantize", "empty shape");
  auto* out = static_cast<__nv_bfloat16*>(out_ptr);
  const int64_t n = q.rows * q.cols;
  const bool out16 = aligned16(out);
  const int sms = be->sm_count();
  need(q.data, "data", q.params.format);
  switch (q.params.format) {
    case QuantFormat::NF4:
    case QuantFormat::FP4: {
      const int64_t bs = q.params.blocksize;
      if (bs <= 0) fail(ErrorKind::Internal, "cuda dequantize", "blocksize is unresolved (0)");
      if (q.params.double_quant) {
        need(q.absmax_q, "absmax_q", q.params.format);
        need(q.nested_absmax, "nested_absmax", q.params.format);
        need(q.nested_code, "nested_code", q.params.format);
      } else {
        need(q.absmax, "absmax", q.params.format);
      }
      const int vec = n % 32 == 0 && bs % 32 == 0 && out16 && aligned16(q.data);
      launch(bnb4_kernel, {grid_for(vec ? n / 32 : n, sms), kThreads, 0, s}, q, out, n, vec);
      break;
    }
    case QuantFormat::NVFP4: {
      need(q.scales, "scales", q.params.format);
      need(q.scales_f32, "scales_f32", q.params.format);
      const int vec = q.cols % 32 == 0 && out16 && aligned16(q.data);
      launch(nvfp4_kernel, {grid_for(vec ? n / 32 : n, sms), kThreads, 0, s}, q, out, vec);
      break;
    }
    case QuantFormat::MXFP4:
    case QuantFormat::MXFP8_E4M3: {
      need(q.scales, "scales", q.params.format);
      const int fp4 = q.params.format == QuantFormat::MXFP4;
      const int vec = q.cols % 32 == 0 && out16 && aligned16(q.data);
      launch(mx_kernel, {grid_for(vec ? n / (fp4 ? 32 : 16) : n, sms), kThreads, 0, s}, q, out, fp4, vec);
      break;
    }
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: {
      need(q.scales_f32, "scales_f32", q.params.format);
      int64_t br = q.rows, bc = q.cols;  // per tensor
      if (q.params.fp8_scaling == Fp8Scaling::Block1x128) br = 1, bc = 128;
      if (q.params.fp8_scaling == Fp8Scaling::Block128x128) br = 128, bc = 128;
      const int64_t n_bc = ceil_div64(q.cols, bc);
      const int vec = q.cols % 16 == 0 && out16 && aligned16(q.data);
      launch(fp8_kernel, {grid_for(vec ? n / 16 : n, sms), kThreads, 0, s}, q, out,
             q.params.format == QuantFormat::FP8_E4M3, br, bc, n_bc, vec);
      break;
    }
  }
  QLORA_CUDA_LAUNCH_CHECK();
}

QuantDeviceBuffers::QuantDeviceBuffers(Backend& be, const QuantizedTensor& q, const float* code4) : be_(be) {
  view_.params = q.params;
  view_.rows = q.rows;
  view_.cols = q.cols;
  view_.offset = q.offset;
  if (code4) std::copy(code4, code4 + 16, view_.code4);
  view_.data = static_cast<const uint8_t*>(upload(q.data.data(), q.data.size()));
  view_.absmax = static_cast<const float*>(upload(q.absmax.data(), q.absmax.size() * 4));
  view_.absmax_q = static_cast<const uint8_t*>(upload(q.absmax_q.data(), q.absmax_q.size()));
  view_.nested_absmax = static_cast<const float*>(upload(q.nested_absmax.data(), q.nested_absmax.size() * 4));
  view_.nested_code = static_cast<const float*>(upload(q.nested_code.data(), q.nested_code.size() * 4));
  view_.scales = static_cast<const uint8_t*>(upload(q.scales.data(), q.scales.size()));
  view_.scales_f32 = static_cast<const float*>(upload(q.scales_f32.data(), q.scales_f32.size() * 4));
}

QuantDeviceBuffers::~QuantDeviceBuffers() {
  for (void* p : allocs_) {
    try {
      be_.free(p);
    } catch (...) {  // destructors must not throw; a failed free leaks at worst
    }
  }
}

const void* QuantDeviceBuffers::upload(const void* src, size_t bytes) {
  if (bytes == 0) return nullptr;
  void* d = be_.alloc(bytes);
  allocs_.push_back(d);
  be_.copy_to_device(d, src, bytes);
  bytes_ += int64_t(bytes);
  return d;
}

}  // namespace qlora::cuda

namespace qlora::cuda {

namespace {

// A view of one packed blob (quant/quant_layout.h) already on the device: no copy.
QuantDeviceView view_of_blob(const void* src, const QuantParams& p, int64_t rows, int64_t cols) {
  const QuantLayout L = quant_layout(p, rows, cols);
  const auto* base = static_cast<const uint8_t*>(src);
  auto f32 = [&](const QuantLayout::Section& s) {
    return s.offset < 0 ? nullptr : reinterpret_cast<const float*>(base + s.offset);
  };
  auto u8 = [&](const QuantLayout::Section& s) { return s.offset < 0 ? nullptr : base + s.offset; };
  QuantDeviceView v;
  v.params = p;
  v.rows = rows;
  v.cols = cols;
  v.data = u8(L.data);
  v.absmax = f32(L.absmax);
  v.absmax_q = u8(L.absmax_q);
  v.nested_absmax = f32(L.nested_absmax);
  v.nested_code = f32(L.nested_code);
  v.offset_dev = f32(L.offset);
  v.scales = u8(L.scales);
  v.scales_f32 = f32(L.scales_f32);
  if (p.format == QuantFormat::NF4) std::memcpy(v.code4, nf4_code(), sizeof(v.code4));
  if (p.format == QuantFormat::FP4) std::memcpy(v.code4, fp4_code(), sizeof(v.code4));
  return v;
}

}  // namespace

// The table's dequantize op. A bf16 output (the CUDA engine's compute dtype, so every use in
// training and generation) is decoded on the device straight from the packed blob in the arena:
// the quantized base never leaves the GPU. An f32 output has no device kernel; it takes the host
// reference (packed bytes to the host and back), which only tests use.
void CudaBackend::dequantize(const DequantizeArgs& a) {
  const char* op = "dequantize";
  check_dim(op, "rows", a.rows);
  check_dim(op, "cols", a.cols);
  const int64_t n = a.rows * a.cols;
  check_tensor(op, "out", a.out, n, true, true);
  if (n == 0) return;
  check_ptr(op, "src", a.src);
  QuantParams p = a.params;
  p.blocksize = quant_blocksize(p);
  if (a.out.dtype == DType::BF16) {
    const QuantDeviceView v = view_of_blob(a.src, p, a.rows, a.cols);
    if (!a.prefetch) {
      dequantize_bf16_on(*this, v, a.out.data, stream_);
      return;
    }
    // On the side stream, after everything issued so far (earlier readers of `out` included); the
    // first matmul that reads `out` makes the main stream wait for it (wait_prefetched).
    dequantize_bf16_on(*this, v, a.out.data, side_begin(prefetch_));
    side_end(prefetch_, a.out.data, n * 2);
    return;
  }
  const QuantLayout L = quant_layout(p, a.rows, a.cols);
  std::vector<uint8_t> blob(size_t(L.total));
  copy_to_host(blob.data(), a.src, blob.size());
  QuantizedTensor q;
  unpack_quantized(blob.data(), p, a.rows, a.cols, q);
  std::vector<float> f(static_cast<size_t>(n));
  dequantize_ref(q, f.data());
  copy_to_device(a.out.data, f.data(), f.size() * 4);
}

}  // namespace qlora::cuda
