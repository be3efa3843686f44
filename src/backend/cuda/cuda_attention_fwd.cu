// Flash-attention forward on tensor cores: causal, GQA, packed-document segments, lse output;
// with a KV cache the queries are the last T of T_kv positions (AttentionFwdArgs::t_kv).
//
// Split as tile traits (attention_mma.cuh: FwdTraits<D>), main loop and epilogue. One block owns
// kBr=128 queries of one (batch, head); each of its 8 warps owns 16 query rows and keeps them in
// registers (Q fragments, O accumulators, running max and sum). K/V tiles of kBc keys (64; 32 at
// width 256, where Q's fragments are re-read from shared memory each step instead of held) stream
// through a two-stage cp.async pipeline. Scores never leave registers: S = Q K^T (mma), mask,
// online softmax in the exp2 domain, P (bf16) V (mma). No (T,T) matrix exists anywhere.
// Instantiated for tile widths 64, 128 and 256; smaller head dims run zero-padded (attention_mma.cuh).
#include <cmath>

#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/cuda_backend_impl.cuh"

namespace qlora::cuda {

namespace attn {

template <int D>
__global__ void __launch_bounds__(FwdTraits<D>::kThreads, 1) attn_fwd_kernel(const AttnParams p) {
  using Tr = FwdTraits<D>;
  QLORA_DYNAMIC_SMEM(smem, 128);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q4 = lane & 3;
  const int64_t T = p.t, Tk = p.t_kv, off = Tk - T;  // queries; keys; query i sits at position i + off
  const int qblock = int(gridDim.x) - 1 - int(blockIdx.x);  // latest (heaviest) query blocks first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const int64_t q0 = int64_t(qblock) * Tr::kBr;
  const int hd = p.d, dchunks = hd / 8;
  const int64_t ldq = int64_t(p.n_head) * hd, ldk = int64_t(p.n_head_kv) * hd;
  const bf16* qg = p.q + (int64_t(b) * T * p.n_head + h) * hd;     // row t at qg + t*ldq
  const bf16* kg = p.k + (int64_t(b) * Tk * p.n_head_kv + hk) * hd;  // row s at kg + s*ldk
  const bf16* vg = p.v + (int64_t(b) * Tk * p.n_head_kv + hk) * hd;
  const int32_t* seg = p.seg ? p.seg + int64_t(b) * T : nullptr;  // (T)

  const uint32_t sQ = smem_addr(smem);       // (kBr, D)
  const uint32_t sK = sQ + Tr::kQBytes;      // 2 x (kBc, D)
  const uint32_t sV = sK + 2 * Tr::kKVBytes;  // 2 x (kBc, D)

  // Keys past the block's last query are never visible (causal), so the loop stops there; with a
  // sliding window it starts at the tile of the block's first query's first key.
  const int64_t kv_end = Tk < q0 + Tr::kBr + off ? Tk : q0 + Tr::kBr + off;
  const int n_kb = int((kv_end + Tr::kBc - 1) / Tr::kBc);
  const int64_t first_key = p.window > 0 && q0 + off - p.window + 1 > 0 ? q0 + off - p.window + 1 : 0;
  const int j0 = int(first_key / Tr::kBc);

  load_tile<Tr::kBr, D, Tr::kThreads>(sQ, qg, ldq, q0, T, dchunks);
  cp_async_commit();
  load_tile<Tr::kBc, D, Tr::kThreads>(sK, kg, ldk, int64_t(j0) * Tr::kBc, Tk, dchunks);
  load_tile<Tr::kBc, D, Tr::kThreads>(sV, vg, ldk, int64_t(j0) * Tr::kBc, Tk, dchunks);
  cp_async_commit();
  cp_async_wait<1>();  // Q landed (K/V stage 0 may still be in flight)
  __syncthreads();

  int lr, lc, qr, qc;
  constexpr int kN = Tr::kBc / 8;  // 8-key n-tiles per step
  // This warp's 16 query rows as A fragments, one per 16-wide k-slice (width 256: one slice at a
  // time, loaded where it is used).
  uint32_t qf[Tr::kQInRegs ? D / 16 : 1][4];
  lane_rows16(lane, qr, qc);
  if constexpr (Tr::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) ldsm_x4(qf[kk], sQ + swz(warp * 16 + qr, kk * 2 + qc, Tr::kChunks));
  }

  float o[D / 8][4];  // O accumulators: rows g, g+8 of the warp; 8-column tiles of D
#pragma unroll
  for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max (log2 domain) of rows g, g+8
  float l_run[2] = {0.0f, 0.0f};            // this thread's part of the running sum
  if (p.sinks) {  // the sink is one more logit per row, attending to nothing: max it, sum e^0 (once per quad)
    m_run[0] = m_run[1] = p.sinks[h] * kLog2e;
    l_run[0] = l_run[1] = q4 == 0 ? 1.0f : 0.0f;
  }
  const int64_t row_t[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const int seg_row[2] = {seg && row_t[0] < T ? seg[row_t[0]] : -1, seg && row_t[1] < T ? seg[row_t[1]] : -1};

  for (int j = j0; j < n_kb; j++) {
    const int stage = (j - j0) & 1;
    if (j + 1 < n_kb) {  // prefetch the next K/V tile into the other stage
      load_tile<Tr::kBc, D, Tr::kThreads>(sK + (stage ^ 1) * Tr::kKVBytes, kg, ldk, int64_t(j + 1) * Tr::kBc, Tk, dchunks);
      load_tile<Tr::kBc, D, Tr::kThreads>(sV + (stage ^ 1) * Tr::kKVBytes, vg, ldk, int64_t(j + 1) * Tr::kBc, Tk, dchunks);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint32_t k_tile = sK + stage * Tr::kKVBytes, v_tile = sV + stage * Tr::kKVBytes;
    const int64_t k0 = int64_t(j) * Tr::kBc;

    // S = Q K^T for 16 rows x kBc keys: kN n-tiles of 8 keys.
    float s[kN][4];
#pragma unroll
    for (int i = 0; i < kN; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
    lane_rows8x2(lane, lr, lc);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      if constexpr (!Tr::kQInRegs) ldsm_x4(qf[0], sQ + swz(warp * 16 + qr, kk * 2 + qc, Tr::kChunks));
      const uint32_t(&a)[4] = qf[Tr::kQInRegs ? kk : 0];
#pragma unroll
      for (int np = 0; np < kN / 2; np++) {
        uint32_t bk[4];
        ldsm_x4(bk, k_tile + swz(np * 16 + lr, kk * 2 + lc, Tr::kChunks));
        mma16816(s[2 * np], a, bk[0], bk[1]);
        mma16816(s[2 * np + 1], a, bk[2], bk[3]);
      }
    }

    // Scale into the log2 domain and mask. Only tiles that reach past the warp's first row, run
    // past the sequence end, start before the window of the warp's last row, or have documents
    // need the per-element test.
    const bool need_mask = seg != nullptr || k0 + Tr::kBc - 1 > q0 + off + warp * 16 || k0 + Tr::kBc > Tk ||
                           (p.window > 0 && int(q0 + off - k0) + warp * 16 + 15 >= p.window);
#pragma unroll
    for (int nt = 0; nt < kN; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = score_log2(p, s[nt][e]);
        if (need_mask) {
          const int64_t key = k0 + nt * 8 + 2 * q4 + (e & 1), t = row_t[e >> 1];
          const bool vis = key <= t + off && key < Tk && (seg == nullptr || seg[key] == seg_row[e >> 1]) &&
                           (p.window == 0 || int(t + off - key) < p.window);
          if (!vis) x = -INFINITY;
        }
        s[nt][e] = x;
      }

    // Online softmax per row (the 4 lanes of a quad share a row).
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kN; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[r], mx);
      // A row with nothing visible yet keeps max -inf; subtracting 0 then keeps every p at 0
      // instead of producing NaN from (-inf) - (-inf).
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m_run[r] - m_use);
      m_run[r] = m_new;
      float rs = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kN; nt++) {
        s[nt][2 * r] = exp2f(s[nt][2 * r] - m_use);
        s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - m_use);
        rs += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      l_run[r] = l_run[r] * alpha + rs;
#pragma unroll
      for (int dt = 0; dt < D / 8; dt++) {
        o[dt][2 * r] *= alpha;
        o[dt][2 * r + 1] *= alpha;
      }
    }

    // O += P V: P's C fragments become A fragments; V arrives transposed through ldmatrix.trans.
    mma_c_by_tile<Tr::kBc / 16, D>(o, s, v_tile, lane);
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  // Epilogue: normalise, store O (bf16) and lse (natural log).
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float l = l_run[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int64_t t = row_t[r];
    if (t >= T) continue;
    const float inv = 1.0f / l;
    bf16* orow = p.out + ((int64_t(b) * T + t) * p.n_head + h) * hd;
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
      if (dt < dchunks)
        *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * q4) = pack_bf16(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    if (q4 == 0) p.lse[(int64_t(b) * p.n_head + h) * T + t] = (m_run[r] + log2f(l)) * kLn2;
  }
}

}  // namespace attn

size_t attention_fwd_smem_bytes(int64_t head_dim) {
  using namespace attn;
  return by_tile_width<size_t>(head_dim, FwdTraits<64>::kSmemBytes, FwdTraits<128>::kSmemBytes, FwdTraits<256>::kSmemBytes);
}
static void (*fwd_kernel(int64_t head_dim))(attn::AttnParams) {
  using namespace attn;
  return by_tile_width(head_dim, attn_fwd_kernel<64>, attn_fwd_kernel<128>, attn_fwd_kernel<256>);
}

void attention_fwd_launch(const attn::AttnParams& p, int64_t b, cudaStream_t s) {
  using Tr = attn::FwdTraits<64>;  // every width's block shape
  static_assert(Tr::kBr == attn::FwdTraits<128>::kBr && Tr::kThreads == attn::FwdTraits<128>::kThreads &&
                Tr::kBr == attn::FwdTraits<256>::kBr && Tr::kThreads == attn::FwdTraits<256>::kThreads);
  const dim3 grid(unsigned(ceil_div64(p.t, Tr::kBr)), unsigned(p.n_head), unsigned(b));
  launch(fwd_kernel(p.d), {grid, dim3(Tr::kThreads), attention_fwd_smem_bytes(p.d), s}, p);
  QLORA_CUDA_LAUNCH_CHECK();
}
void attention_fwd_set_smem_limits() {
  for (int w : {64, 128, 256}) allow_dynamic_smem(fwd_kernel(w), attention_fwd_smem_bytes(w));
}

}  // namespace qlora::cuda
