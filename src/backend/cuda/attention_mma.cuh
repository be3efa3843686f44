// Tensor-core building blocks of the flash-attention kernels: cp.async tile loads into swizzled
// shared memory, ldmatrix fragment loads and the bf16 m16n8k16 mma (sm_80+), plus tile traits.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA), lane = 4*g + q (g = lane/4 "group", q = lane%4):
//   A (16x16, row):  reg0 = A[g][2q..2q+1]   reg1 = A[g+8][2q..]   reg2 = A[g][2q+8..]   reg3 = A[g+8][2q+8..]
//   B (16x8,  col):  reg0 = B[2q..2q+1][g]   reg1 = B[2q+8..2q+9][g]
//   C (16x8,  f32):  c0,c1 = C[g][2q..2q+1]  c2,c3 = C[g+8][2q..2q+1]
// So the C fragments of two adjacent 8-column tiles are exactly the A fragment of one 16-wide
// k-slice (the P of softmax feeds the next mma without leaving registers).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace qlora::cuda::attn {

using bf16 = __nv_bfloat16;

// Tile traits: the three tile widths with kernels, and the block shapes chosen for them. A head
// dim d (a multiple of 8, at most 256) runs on the smallest tile width D >= d: the columns past d
// are loaded as zeros (they add nothing to Q K^T) and never stored. Width 256 (Gemma's head dim)
// keeps a thread's accumulators (16 rows x 256 columns per warp: 128 f32 registers) in the
// register file by narrower key steps, Q re-read from shared memory and, in the key-major
// backward, dK and dV split by columns over two warps (BwdTraits::kDSplit).
template <int D>
inline constexpr bool kTileWidth = D == 64 || D == 128 || D == 256;

template <int D>
struct FwdTraits {
  static_assert(kTileWidth<D>, "attention kernels exist for tile widths 64, 128 and 256");
  static constexpr int kHeadDim = D;
  static constexpr int kBr = 128;              // queries per block (8 warps x 16 rows)
  static constexpr int kBc = D == 256 ? 32 : 64;  // keys per main-loop step
  static constexpr bool kQInRegs = D <= 128;   // Q's A fragments held for the whole loop (256: re-read per step)
  static constexpr int kWarps = kBr / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunks = D / 8;        // 16-byte chunks per row
  static constexpr int kQBytes = kBr * D * 2;
  static constexpr int kKVBytes = kBc * D * 2;  // one K (or V) stage
  static constexpr int kSmemBytes = kQBytes + 4 * kKVBytes;  // Q + 2 stages of K and V
};

template <int D>
struct BwdTraits {
  static_assert(kTileWidth<D>, "attention kernels exist for tile widths 64, 128 and 256");
  static constexpr int kHeadDim = D;
  static constexpr int kBc = 64;             // keys per block (4 key warps x 16 rows of S^T)
  static constexpr int kBq = 32;             // queries per main-loop step
  // Warps that share 16 keys: each computes their whole S^T and dP^T and accumulates D / kDSplit
  // columns of dK and dV (width 256: 2, the price being S^T and dP^T computed twice).
  static constexpr int kDSplit = D == 256 ? 2 : 1;
  static constexpr int kCols = D / kDSplit;  // dK/dV columns per warp
  static constexpr int kKeyWarps = kBc / 16;
  static constexpr int kWarps = kKeyWarps * kDSplit;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMinBlocks = D == 256 ? 1 : 2;  // __launch_bounds__: 256 threads at 1 block keep 255 registers
  static constexpr int kChunks = D / 8;
  static constexpr int kKVBytes = kBc * D * 2;
  static constexpr int kQBytes = kBq * D * 2;   // one Q (or dO) stage
  static constexpr int kDsStride = kBq + 8;     // dS^T row: 32 queries + 16 bytes pad (no bank conflicts)
  static constexpr int kDsBytes = kBc * kDsStride * 2;
  static constexpr int kStatBytes = 2 * 2 * kBq * 4;  // 2 stages of lse and delta
  static constexpr int kSmemBytes = 2 * kKVBytes + 4 * kQBytes + kDsBytes + kStatBytes;
};

// dQ's own query-major pass (cuda_attention_dq.cu): 64 queries per block (4 warps x 16 rows), Q and
// dO held in shared memory, two stages of K and V.
template <int D>
struct DqTraits {
  static_assert(kTileWidth<D>, "attention kernels exist for tile widths 64, 128 and 256");
  static constexpr int kHeadDim = D;
  static constexpr int kBr = 64;             // queries per block
  static constexpr int kBc = D == 256 ? 32 : 64;  // keys per main-loop step
  static constexpr int kWarps = kBr / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunks = D / 8;
  static constexpr int kQBytes = kBr * D * 2;   // Q (or dO)
  static constexpr int kKVBytes = kBc * D * 2;  // one K (or V) stage
  static constexpr int kSmemBytes = 2 * kQBytes + 4 * kKVBytes;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The PTX below runs as inline assembly on the device; the host harness executes the same
// instructions from their PTX ISA definitions (tests/support/cuda_emu/emu_block.cpp).

// Byte offset of 16-byte chunk `c` of row `r` in a tile with `chunks` chunks per row. The XOR
// spreads the 8 rows an ldmatrix reads over all 32 banks (rows are 128 or 256 bytes apart, which
// would otherwise put the same chunk of every row in the same banks).
__device__ __forceinline__ uint32_t swz(int r, int c, int chunks) { return uint32_t((r * chunks + (c ^ (r & 7))) * 16); }

// 16 bytes global -> shared, asynchronously; src_bytes 0 writes zeros (rows past the sequence end).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
#ifdef QLORA_CUDA_EMU
  ::qlora::emu::cp_async16(dst, src, src_bytes);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef QLORA_CUDA_EMU
  ::qlora::emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef QLORA_CUDA_EMU
  ::qlora::emu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Rows [row0, row0+R) of a matrix with row stride `ld` elements into a swizzled (R, D) tile;
// rows at or past `rows_valid` and 16-byte chunks at or past `chunks_valid` (head dims below the
// tile's D) become zeros.
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile(uint32_t tile, const bf16* g, int64_t ld, int64_t row0, int64_t rows_valid,
                                          int chunks_valid) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < R * kChunks; i += NT) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = row0 + r < rows_valid && c < chunks_valid;
    const bf16* src = ok ? g + (row0 + r) * ld + c * 8 : g;
    cp_async16(tile + swz(r, c, kChunks), src, ok ? 16 : 0);
  }
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
#ifdef QLORA_CUDA_EMU
  ::qlora::emu::ldmatrix_x4(r, addr, false);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
#ifdef QLORA_CUDA_EMU
  ::qlora::emu::ldmatrix_x4(r, addr, true);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// The two lane->address patterns of ldmatrix.x4 over a 16x16 region at (row0, chunk0):
//  rows16: lane reads row row0 + (lane & 15), chunk chunk0 + (lane >> 4).
//    Non-trans from a row-major [m][k] tile -> an A fragment; trans from a [k][n] tile -> the B
//    fragments of two adjacent 8-column n-tiles (regs 0,1 for the first, 2,3 for the second).
//  rows8x2: lane reads row row0 + (lane & 7) + ((lane >> 4) << 3), chunk chunk0 + ((lane >> 3) & 1).
//    Non-trans from an [n][k] tile -> B fragments of two n-tiles (regs 0,1 and 2,3); trans from a
//    [k][m] tile -> an A fragment.
__device__ __forceinline__ void lane_rows16(int lane, int& r, int& c) {
  r = lane & 15;
  c = lane >> 4;
}
__device__ __forceinline__ void lane_rows8x2(int lane, int& r, int& c) {
  r = (lane & 7) + ((lane >> 4) << 3);
  c = (lane >> 3) & 1;
}

// d += a * b for one m16n8k16 tile, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef QLORA_CUDA_EMU
  ::qlora::emu::mma_m16n8k16_bf16(d, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two floats -> one register of two bf16, the first in the low half (the lower column).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, 4);
  return r;
}

// The A fragment of k-slice kk built from the f32 C fragments of n-tiles 2kk and 2kk+1.
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// acc += A B for one warp's 16 rows: A (16 x 16kK) is held as the f32 C fragments c[0..2kK) of
// 8-column n-tiles (each pair packed into the A fragment of one 16-wide k-slice), B is the
// (16kK, D) swizzled tile `b` in shared memory, read transposed through ldmatrix.trans into the B
// fragments of acc's 8-column tiles; acc holds N of B's columns from 16-byte chunk `chunk0` on (all
// D by default). The softmax-side products of the attention kernels: P V and dS K (rows =
// queries), P^T dO and dS^T Q (rows = keys).
template <int kK, int D, int N = D>
__device__ __forceinline__ void mma_c_by_tile(float (&acc)[N / 8][4], const float (&c)[2 * kK][4], uint32_t b, int lane,
                                              int chunk0 = 0) {
  int lr, lc;
  lane_rows16(lane, lr, lc);
#pragma unroll
  for (int kk = 0; kk < kK; kk++) {
    uint32_t a[4];
    c_to_a(a, c[2 * kk], c[2 * kk + 1]);
#pragma unroll
    for (int dt = 0; dt < N / 16; dt++) {
      uint32_t bf[4];
      ldsm_x4_t(bf, b + swz(kk * 16 + lr, chunk0 + dt * 2 + lc, D / 8));
      mma16816(acc[2 * dt], a, bf[0], bf[1]);
      mma16816(acc[2 * dt + 1], a, bf[2], bf[3]);
    }
  }
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Everything both kernels need about one call.
struct AttnParams {
  const bf16* q;       // (B,T,Hq,D)
  const bf16* k;       // (B,T_kv,Hkv,D)
  const bf16* v;       // (B,T_kv,Hkv,D)
  const int32_t* seg;  // (B,T) or null
  int64_t t;
  int64_t t_kv;        // keys per sequence (forward; t in training, more with a KV cache)
  int d;               // head dim: a multiple of 8, at most the kernel's tile width D
  int n_head, n_head_kv, group;
  float scale_log2;    // scale * log2(e): scores go through exp2
  int window;          // sliding window: query position t sees keys s > t - window; 0: none
  // forward
  bf16* out;           // (B,T,Hq,D)
  float* lse;          // (B,Hq,T)
  const float* sinks;  // (Hq) attention sinks (natural-log logits), or null
  float softcap;       // Gemma 2's attn_logit_softcapping: scores become softcap tanh(score / softcap); 0: none
  // backward
  const bf16* dout;    // (B,T,Hq,D)
  const float* lse_in; // (B,Hq,T)
  const float* delta;  // (B,Hq,T) rowsum(dout*out)
  float* dq_acc;       // (B,T,Hq,D) f32 with D the tile width, zeroed, unscaled; null: the key-major
                       // kernel computes dK and dV only, and dQ comes from attn_bwd_dq_kernel
  bf16* dq;            // (B,T,Hq,D) attn_bwd_dq_kernel's output
  bf16* dk;            // (B,T,Hkv,D)
  bf16* dv;            // (B,T,Hkv,D)
  float scale;
};

// Score s = q.k of one element in the log2 domain: s scale, soft-capped (softcap tanh(s scale /
// softcap), as the CPU backend) when p.softcap > 0, times log2 e. dcap (optional) "=" the cap's
// derivative 1 - tanh^2 (1 without a cap), which the backward's dS carries.
__device__ __forceinline__ float score_log2(const AttnParams& p, float s, float* dcap = nullptr) {
  if (p.softcap <= 0.0f) {
    if (dcap) *dcap = 1.0f;
    return s * p.scale_log2;
  }
  const float t = tanhf(s * p.scale / p.softcap);
  if (dcap) *dcap = 1.0f - t * t;
  return t * p.softcap * kLog2e;
}
// The cap's derivative 1 - tanh^2 at an element whose P = exp2(score - lse2) is pv > 0 (the score
// recovered from P: the key-major backward keeps no copy of S); 1 without a cap.
__device__ __forceinline__ float cap_derivative_from_p(const AttnParams& p, float pv, float lse2) {
  if (p.softcap <= 0.0f || pv <= 0.0f) return 1.0f;
  const float t = (log2f(pv) + lse2) / (p.softcap * kLog2e);
  return 1.0f - t * t;
}

}  // namespace qlora::cuda::attn

namespace qlora::cuda {
// Kernel launchers (cuda_attention_fwd.cu / cuda_attention_bwd.cu); p.d is a multiple of 8 in [8, 256].
// The tile width a head dim runs on.
inline int attention_tile_width(int64_t head_dim) { return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256; }
// Of three per-width values (a kernel instance, its shared memory, its block), the one a head dim runs on.
template <class T>
T by_tile_width(int64_t head_dim, T w64, T w128, T w256) {
  const int w = attention_tile_width(head_dim);
  return w == 64 ? w64 : w == 128 ? w128 : w256;
}
void attention_fwd_launch(const attn::AttnParams& p, int64_t b, cudaStream_t s);
void attention_bwd_launch(const attn::AttnParams& p, int64_t b, cudaStream_t s);
void attention_bwd_dq_launch(const attn::AttnParams& p, int64_t b, cudaStream_t s);
void attention_fwd_set_smem_limits();
void attention_bwd_set_smem_limits();
void attention_bwd_dq_set_smem_limits();
}  // namespace qlora::cuda
