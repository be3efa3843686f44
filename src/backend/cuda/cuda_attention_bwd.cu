// Flash-attention backward on tensor cores (FA2 order): one block per (batch, kv head, 64 keys).
//
// The block keeps dK and dV of its keys in registers and walks every query head of its GQA group
// and every query block that can see its keys, so dK/dV are written once, without atomics. Per
// step (32 queries) each warp recomputes its 16 keys' slice of S^T = K Q^T, P^T = exp2(S^T - lse),
// then dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q. Working on S^T (keys
// as rows) puts P^T and dS^T in the A-fragment layout those two products need. dQ = dS K needs the
// transpose, so dS^T goes through shared memory and the block adds its dQ part into an f32
// accumulator with atomics (dq is reproducible to rounding only). Instantiated with kDq false
// (AttnDq::Recompute, p.dq_acc null) the block skips dQ, which attn_bwd_dq_kernel
// (cuda_attention_dq.cu) computes in a query-major pass of its own. Instantiated for tile widths
// D = 64, 128 and 256; smaller head dims run zero-padded (attention_mma.cuh). At 256 two warps
// share each 16 keys, each holding half of dK's and dV's columns (BwdTraits::kDSplit), and dQ
// always takes its own pass.
#include <climits>
#include <cmath>

#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/cuda_backend_impl.cuh"

namespace qlora::cuda {

namespace attn {

// kDq false: dK and dV only (AttnDq::Recompute; p.dq_acc unused). kCap: the scores soft-capped
// (p.softcap > 0, Gemma 2), instantiated without dQ only (with it the tile-128 variant spills).
template <int D, bool kDq, bool kCap = false>
__global__ void __launch_bounds__(BwdTraits<D>::kThreads, BwdTraits<D>::kMinBlocks) attn_bwd_kernel(const AttnParams p) {
  using Tr = BwdTraits<D>;
  static_assert(!kDq || Tr::kDSplit == 1, "with dK/dV split over warps, dQ takes its own pass");
  QLORA_DYNAMIC_SMEM(smem, 128);
  const int lane = threadIdx.x & 31, g = lane >> 2, q4 = lane & 3;
  // warp: this warp's 16 keys (rows warp*16 of the block's); dh: its part of dK's and dV's columns
  const int warp = Tr::kDSplit == 1 ? threadIdx.x >> 5 : (threadIdx.x >> 5) % Tr::kKeyWarps;
  const int dh = Tr::kDSplit == 1 ? 0 : (threadIdx.x >> 5) / Tr::kKeyWarps;
  const int64_t T = p.t;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int64_t k0 = int64_t(blockIdx.x) * Tr::kBc;
  // The head dim p.d is read from the kernel parameters where it is used (no register held).
  const int64_t ldq = int64_t(p.n_head) * p.d, ldk = int64_t(p.n_head_kv) * p.d;
  const bf16* kg = p.k + (int64_t(b) * T * p.n_head_kv + hk) * p.d;  // row s at kg + s*ldk
  const bf16* vg = p.v + (int64_t(b) * T * p.n_head_kv + hk) * p.d;
  const int32_t* seg = p.seg ? p.seg + int64_t(b) * T : nullptr;  // (T)

  const uint32_t sK = smem_addr(smem);            // (kBc, D)
  const uint32_t sV = sK + Tr::kKVBytes;          // (kBc, D)
  const uint32_t sQ = sV + Tr::kKVBytes;          // 2 x (kBq, D)
  const uint32_t sDO = sQ + 2 * Tr::kQBytes;      // 2 x (kBq, D)
  unsigned char* ds_ptr = smem + 2 * Tr::kKVBytes + 4 * Tr::kQBytes;  // (kBc, kDsStride) bf16 dS^T
  bf16* sDs = reinterpret_cast<bf16*>(ds_ptr);
  const uint32_t sDs_addr = smem_addr(ds_ptr);
  float* sLse = reinterpret_cast<float*>(ds_ptr + Tr::kDsBytes);  // 2 x (kBq), times log2(e)
  float* sDelta = sLse + 2 * Tr::kBq;                               // 2 x (kBq)

  load_tile<Tr::kBc, D, Tr::kThreads>(sK, kg, ldk, k0, T, p.d / 8);
  load_tile<Tr::kBc, D, Tr::kThreads>(sV, vg, ldk, k0, T, p.d / 8);
  cp_async_commit();

  // Queries before k0 see none of these keys, nor (sliding window) queries from the block's last
  // key + window on; iterations run over (head in group, query block).
  const int q_start = int(k0 / Tr::kBq);
  const int64_t q_end = p.window > 0 && k0 + Tr::kBc - 1 + p.window < T ? k0 + Tr::kBc - 1 + p.window : T;
  const int n_qb = int((q_end + Tr::kBq - 1) / Tr::kBq) - q_start;
  const int n_it = p.group * n_qb;

  auto prefetch = [&](int it, int stage) {
    const int h = hk * p.group + it / n_qb;
    const int64_t q0 = int64_t(q_start + it % n_qb) * Tr::kBq;
    const int64_t off = (int64_t(b) * T * p.n_head + h) * p.d;
    load_tile<Tr::kBq, D, Tr::kThreads>(sQ + stage * Tr::kQBytes, p.q + off, ldq, q0, T, p.d / 8);
    load_tile<Tr::kBq, D, Tr::kThreads>(sDO + stage * Tr::kQBytes, p.dout + off, ldq, q0, T, p.d / 8);
    if (threadIdx.x < Tr::kBq) {
      const int64_t t = q0 + threadIdx.x, i = (int64_t(b) * p.n_head + h) * T + t;
      // lse = +inf for rows past the end makes their P exactly 0.
      sLse[stage * Tr::kBq + threadIdx.x] = t < T ? p.lse_in[i] * kLog2e : INFINITY;
      sDelta[stage * Tr::kBq + threadIdx.x] = t < T ? p.delta[i] : 0.0f;
    }
    cp_async_commit();
  };

  // rows g, g+8 of this warp's 16 keys; columns [dh kCols, (dh + 1) kCols)
  float dk_acc[Tr::kCols / 8][4], dv_acc[Tr::kCols / 8][4];
#pragma unroll
  for (int i = 0; i < Tr::kCols / 8; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk_acc[i][e] = dv_acc[i][e] = 0.0f;
  const int64_t key_r[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  const int seg_key[2] = {seg && key_r[0] < T ? seg[key_r[0]] : -1, seg && key_r[1] < T ? seg[key_r[1]] : -1};

  prefetch(0, 0);
  for (int it = 0; it < n_it; it++) {
    const int stage = it & 1;
    if (it + 1 < n_it) {
      prefetch(it + 1, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int h = hk * p.group + it / n_qb;
    const int64_t q0 = int64_t(q_start + it % n_qb) * Tr::kBq;
    const uint32_t q_tile = sQ + stage * Tr::kQBytes, do_tile = sDO + stage * Tr::kQBytes;
    const float* lse2 = sLse + stage * Tr::kBq;
    const float* dlt = sDelta + stage * Tr::kBq;
    int lr, lc;

    // S^T = K Q^T: 16 keys x 32 queries per warp (4 n-tiles of 8 queries).
    float st[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) st[i][0] = st[i][1] = st[i][2] = st[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      uint32_t a[4];
      lane_rows16(lane, lr, lc);
      ldsm_x4(a, sK + swz(warp * 16 + lr, kk * 2 + lc, Tr::kChunks));
      lane_rows8x2(lane, lr, lc);
#pragma unroll
      for (int np = 0; np < 2; np++) {
        uint32_t bq[4];
        ldsm_x4(bq, q_tile + swz(np * 16 + lr, kk * 2 + lc, Tr::kChunks));
        mma16816(st[2 * np], a, bq[0], bq[1]);
        mma16816(st[2 * np + 1], a, bq[2], bq[3]);
      }
    }

    // P^T = exp2(S^T scale log2e - lse log2e), masked entries 0.
    // Sliding window: query t sees key k iff t - k < window, i.e. tl - 8 * (e >> 1) < wlim with
    // t - k = (q0 - k0 - warp * 16 - g) + tl - 8 * (e >> 1) (one int live instead of a 64-bit bound).
    const int wlim = p.window > 0 ? p.window - (int(q0 - k0) - warp * 16 - g) : INT_MAX;
    const bool need_mask = seg != nullptr || q0 < k0 + warp * 16 + 15 || q0 + Tr::kBq > T ||
                           (p.window > 0 && int(q0 - k0) + Tr::kBq - 1 - warp * 16 >= p.window);
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int tl = nt * 8 + 2 * q4 + (e & 1);
        float pv = exp2f((kCap ? score_log2(p, st[nt][e]) : st[nt][e] * p.scale_log2) - lse2[tl]);
        if (need_mask) {
          const int64_t t = q0 + tl, key = key_r[e >> 1];
          const bool vis = key <= t && t < T && (seg == nullptr || seg[t] == seg_key[e >> 1]) &&
                           tl - 8 * (e >> 1) < wlim;
          if (!vis) pv = 0.0f;
        }
        st[nt][e] = pv;
      }

    // dV += P^T dO   (k = queries; dO arrives transposed through ldmatrix.trans)
    mma_c_by_tile<Tr::kBq / 16, D, Tr::kCols>(dv_acc, st, do_tile, lane, dh * Tr::kCols / 8);

    // dP^T = V dO^T. The k-slices run as a loop, not unrolled: unrolled, the tile width 128
    // variants sit at 255 registers and spill on sm_80/sm_100 (checked by ptxas -warn-spills).
    float dpt[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) dpt[i][0] = dpt[i][1] = dpt[i][2] = dpt[i][3] = 0.0f;
#pragma unroll 1
    for (int kk = 0; kk < D / 16; kk++) {
      uint32_t a[4];
      lane_rows16(lane, lr, lc);
      ldsm_x4(a, sV + swz(warp * 16 + lr, kk * 2 + lc, Tr::kChunks));
      lane_rows8x2(lane, lr, lc);
#pragma unroll
      for (int np = 0; np < 2; np++) {
        uint32_t bo[4];
        ldsm_x4(bo, do_tile + swz(np * 16 + lr, kk * 2 + lc, Tr::kChunks));
        mma16816(dpt[2 * np], a, bo[0], bo[1]);
        mma16816(dpt[2 * np + 1], a, bo[2], bo[3]);
      }
    }

    // dS^T = P^T (dP^T - delta), kept in st (soft-capped: times the cap's derivative).
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int tl = nt * 8 + 2 * q4 + (e & 1);
        float f = dpt[nt][e] - dlt[tl];
        if constexpr (kCap) f *= cap_derivative_from_p(p, st[nt][e], lse2[tl]);
        st[nt][e] *= f;
      }

    // dK += dS^T Q   (unscaled; the epilogue applies `scale`)
    mma_c_by_tile<Tr::kBq / 16, D, Tr::kCols>(dk_acc, st, q_tile, lane, dh * Tr::kCols / 8);

    // dS^T -> shared (bf16, padded rows), for dQ = dS K; without an accumulator dQ has its own pass.
    if constexpr (kDq) {
#pragma unroll
      for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int r = 0; r < 2; r++)
          *reinterpret_cast<uint32_t*>(sDs + (warp * 16 + g + 8 * r) * Tr::kDsStride + nt * 8 + 2 * q4) =
              pack_bf16(st[nt][2 * r], st[nt][2 * r + 1]);
      __syncthreads();

      // dQ (32 queries x D/4 columns per warp) = dS (32 x 64 keys) K (64 keys x D); A is dS^T read
      // transposed, B is K read transposed.
      constexpr int kNT = D / 32;  // 8-column tiles per warp
      float dqa[2][kNT][4];
#pragma unroll
      for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int i = 0; i < kNT; i++) dqa[mt][i][0] = dqa[mt][i][1] = dqa[mt][i][2] = dqa[mt][i][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < Tr::kBc / 16; kk++) {
        uint32_t a[2][4];
        lane_rows8x2(lane, lr, lc);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
          ldsm_x4_t(a[mt], sDs_addr + uint32_t(((kk * 16 + lr) * Tr::kDsStride + mt * 16 + lc * 8) * 2));
        lane_rows16(lane, lr, lc);
#pragma unroll
        for (int np = 0; np < kNT / 2; np++) {
          uint32_t bk[4];
          ldsm_x4_t(bk, sK + swz(kk * 16 + lr, warp * (D / 32) + np * 2 + lc, Tr::kChunks));
#pragma unroll
          for (int mt = 0; mt < 2; mt++) {
            mma16816(dqa[mt][2 * np], a[mt], bk[0], bk[1]);
            mma16816(dqa[mt][2 * np + 1], a[mt], bk[2], bk[3]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          const int64_t t = q0 + mt * 16 + g + 8 * r;
          if (t >= T) continue;
          // dq_acc rows are D wide (padded columns get zeros and are never read).
          float* dst = p.dq_acc + ((int64_t(b) * T + t) * p.n_head + h) * D + warp * (D / 4) + 2 * q4;
#pragma unroll
          for (int nt = 0; nt < kNT; nt++) {
            atomicAdd(dst + nt * 8, dqa[mt][nt][2 * r]);
            atomicAdd(dst + nt * 8 + 1, dqa[mt][nt][2 * r + 1]);
          }
        }
    }
    __syncthreads();  // the stage and dS^T are rewritten next iteration
  }

  // Epilogue: dK = scale * sum dS^T Q, dV = sum P^T dO, written once ("=").
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int64_t key = key_r[r];
    if (key >= T) continue;
    const int64_t off = ((int64_t(b) * T + key) * p.n_head_kv + hk) * p.d + dh * Tr::kCols + 2 * q4;
#pragma unroll
    for (int dt = 0; dt < Tr::kCols / 8; dt++) {
      if (dh * Tr::kCols + dt * 8 >= p.d) continue;
      *reinterpret_cast<uint32_t*>(p.dk + off + dt * 8) =
          pack_bf16(dk_acc[dt][2 * r] * p.scale, dk_acc[dt][2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(p.dv + off + dt * 8) = pack_bf16(dv_acc[dt][2 * r], dv_acc[dt][2 * r + 1]);
    }
  }
}

}  // namespace attn

size_t attention_bwd_smem_bytes(int64_t head_dim) {
  using namespace attn;
  return by_tile_width<size_t>(head_dim, BwdTraits<64>::kSmemBytes, BwdTraits<128>::kSmemBytes, BwdTraits<256>::kSmemBytes);
}
static int bwd_threads(int64_t head_dim) {
  using namespace attn;
  return by_tile_width(head_dim, BwdTraits<64>::kThreads, BwdTraits<128>::kThreads, BwdTraits<256>::kThreads);
}

// The instantiations by tile width (64, 128, 256) and whether the block adds its dQ part (width
// 256 never does: null), and those with soft-capped scores (dQ in its own pass).
using BwdKernel = void (*)(attn::AttnParams);
static const BwdKernel kBwdKernels[3][2] = {{attn::attn_bwd_kernel<64, false>, attn::attn_bwd_kernel<64, true>},
                                            {attn::attn_bwd_kernel<128, false>, attn::attn_bwd_kernel<128, true>},
                                            {attn::attn_bwd_kernel<256, false>, nullptr}};
static const BwdKernel kBwdCapKernels[3] = {attn::attn_bwd_kernel<64, false, true>, attn::attn_bwd_kernel<128, false, true>,
                                            attn::attn_bwd_kernel<256, false, true>};
static int width_index(int64_t head_dim) { return by_tile_width(head_dim, 0, 1, 2); }

void attention_bwd_launch(const attn::AttnParams& p, int64_t b, cudaStream_t s) {
  static_assert(attn::BwdTraits<64>::kBc == 64 && attn::BwdTraits<128>::kBc == 64 && attn::BwdTraits<256>::kBc == 64);
  const dim3 grid(unsigned(ceil_div64(p.t, attn::BwdTraits<64>::kBc)), unsigned(p.n_head_kv), unsigned(b));
  const int w = width_index(p.d);
  if (p.dq_acc && cuda_plan::attention_dq_own_pass(p.d, p.softcap > 0.0f))
    fail(ErrorKind::Internal, "attention_bwd",
         "soft-capped scores and head dims over 128 take dQ in its own pass (no accumulator)");
  launch(p.softcap > 0.0f ? kBwdCapKernels[w] : kBwdKernels[w][p.dq_acc != nullptr],
         {grid, dim3(bwd_threads(p.d)), attention_bwd_smem_bytes(p.d), s}, p);
  QLORA_CUDA_LAUNCH_CHECK();
}
void attention_bwd_set_smem_limits() {
  for (int w = 0; w < 3; w++) {
    const int64_t d = int64_t(64) << w;
    for (int dq = 0; dq < 2; dq++)
      if (kBwdKernels[w][dq]) allow_dynamic_smem(kBwdKernels[w][dq], attention_bwd_smem_bytes(d));
    allow_dynamic_smem(kBwdCapKernels[w], attention_bwd_smem_bytes(d));
  }
}

}  // namespace qlora::cuda
