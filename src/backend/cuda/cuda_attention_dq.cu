// Flash-attention backward's dQ in its own query-major pass (AttnDq::Recompute): one block per
// (batch, head, 64 queries), no f32 accumulator and no atomics.
//
// The key-major kernel (cuda_attention_bwd.cu) then computes dK and dV only. This kernel walks the
// keys its queries can see, as the forward does, and per tile of 64 keys recomputes
// S = Q K^T, P = exp2(S scale log2e - lse log2e), dP = dO V^T, dS = P (dP - delta) and adds dS K
// into its rows' dQ in registers; each dQ row is written once, in bf16, times `scale`. The cost is
// S and dP computed a second time (7 products per tile pair instead of 5); what it saves is the
// (tokens x heads x head_dim) f32 accumulator, the largest buffer of a long-context backward. dQ
// is then reproducible bit for bit. Each warp owns 16 query rows; Q and dO stay in shared memory
// and K/V tiles of kBc keys (64; 32 at width 256) stream through a two-stage cp.async pipeline.
// Tile widths D = 64, 128 and 256 as the other kernels (smaller head dims zero-padded,
// attention_mma.cuh).
#include <climits>
#include <cmath>

#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/cuda_backend_impl.cuh"

namespace qlora::cuda {

namespace attn {

template <int D>
__global__ void __launch_bounds__(DqTraits<D>::kThreads, 2) attn_bwd_dq_kernel(const AttnParams p) {
  using Tr = DqTraits<D>;
  constexpr int kN = Tr::kBc / 8;  // 8-key n-tiles per step
  QLORA_DYNAMIC_SMEM(smem, 128);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q4 = lane & 3;
  const int64_t T = p.t;
  const int qblock = int(gridDim.x) - 1 - int(blockIdx.x);  // latest (heaviest) query blocks first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const int64_t q0 = int64_t(qblock) * Tr::kBr;
  const int dchunks = p.d / 8;
  const int64_t ldq = int64_t(p.n_head) * p.d, ldk = int64_t(p.n_head_kv) * p.d;
  const int64_t qoff = (int64_t(b) * T * p.n_head + h) * p.d;  // row t of q and dout at + t*ldq
  const bf16* kg = p.k + (int64_t(b) * T * p.n_head_kv + hk) * p.d;
  const bf16* vg = p.v + (int64_t(b) * T * p.n_head_kv + hk) * p.d;
  const int32_t* seg = p.seg ? p.seg + int64_t(b) * T : nullptr;  // (T)

  const uint32_t sQ = smem_addr(smem);        // (kBr, D)
  const uint32_t sDO = sQ + Tr::kQBytes;      // (kBr, D)
  const uint32_t sK = sDO + Tr::kQBytes;      // 2 x (kBc, D)
  const uint32_t sV = sK + 2 * Tr::kKVBytes;  // 2 x (kBc, D)

  // Keys from the window of the block's first query up to its last query (causal).
  const int64_t kv_end = T < q0 + Tr::kBr ? T : q0 + Tr::kBr;
  const int n_kb = int((kv_end + Tr::kBc - 1) / Tr::kBc);
  const int64_t first_key = p.window > 0 && q0 - p.window + 1 > 0 ? q0 - p.window + 1 : 0;
  const int j0 = int(first_key / Tr::kBc);

  load_tile<Tr::kBr, D, Tr::kThreads>(sQ, p.q + qoff, ldq, q0, T, dchunks);
  load_tile<Tr::kBr, D, Tr::kThreads>(sDO, p.dout + qoff, ldq, q0, T, dchunks);
  load_tile<Tr::kBc, D, Tr::kThreads>(sK, kg, ldk, int64_t(j0) * Tr::kBc, T, dchunks);
  load_tile<Tr::kBc, D, Tr::kThreads>(sV, vg, ldk, int64_t(j0) * Tr::kBc, T, dchunks);
  cp_async_commit();

  const int64_t row_t[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const int seg_row[2] = {seg && row_t[0] < T ? seg[row_t[0]] : -1, seg && row_t[1] < T ? seg[row_t[1]] : -1};
  float lse2[2], dlt[2];  // lse (log2 domain) and delta of rows g, g+8; rows past the end: P = 0
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int64_t i = (int64_t(b) * p.n_head + h) * T + row_t[r];
    lse2[r] = row_t[r] < T ? p.lse_in[i] * kLog2e : INFINITY;
    dlt[r] = row_t[r] < T ? p.delta[i] : 0.0f;
  }
  float dq[D / 8][4];  // rows g, g+8 of the warp; 8-column tiles of D
#pragma unroll
  for (int i = 0; i < D / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;

  for (int j = j0; j < n_kb; j++) {
    const int stage = (j - j0) & 1;
    if (j + 1 < n_kb) {  // prefetch the next K/V tile into the other stage
      load_tile<Tr::kBc, D, Tr::kThreads>(sK + (stage ^ 1) * Tr::kKVBytes, kg, ldk, int64_t(j + 1) * Tr::kBc, T, dchunks);
      load_tile<Tr::kBc, D, Tr::kThreads>(sV + (stage ^ 1) * Tr::kKVBytes, vg, ldk, int64_t(j + 1) * Tr::kBc, T, dchunks);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint32_t k_tile = sK + stage * Tr::kKVBytes, v_tile = sV + stage * Tr::kKVBytes;
    const int64_t k0 = int64_t(j) * Tr::kBc;
    int lr, lc;

    // S = Q K^T and dP = dO V^T for 16 rows x kBc keys: kN n-tiles of 8 keys each.
    float s[kN][4], dp[kN][4];
#pragma unroll
    for (int i = 0; i < kN; i++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      uint32_t aq[4], ao[4];
      lane_rows16(lane, lr, lc);
      ldsm_x4(aq, sQ + swz(warp * 16 + lr, kk * 2 + lc, Tr::kChunks));
      ldsm_x4(ao, sDO + swz(warp * 16 + lr, kk * 2 + lc, Tr::kChunks));
      lane_rows8x2(lane, lr, lc);
#pragma unroll
      for (int np = 0; np < kN / 2; np++) {
        uint32_t bk[4], bv[4];
        ldsm_x4(bk, k_tile + swz(np * 16 + lr, kk * 2 + lc, Tr::kChunks));
        mma16816(s[2 * np], aq, bk[0], bk[1]);
        mma16816(s[2 * np + 1], aq, bk[2], bk[3]);
        ldsm_x4(bv, v_tile + swz(np * 16 + lr, kk * 2 + lc, Tr::kChunks));
        mma16816(dp[2 * np], ao, bv[0], bv[1]);
        mma16816(dp[2 * np + 1], ao, bv[2], bv[3]);
      }
    }

    // P = exp2(S scale log2e - lse log2e), masked entries 0; dS = P (dP - delta), kept in s.
    const bool need_mask = seg != nullptr || k0 + Tr::kBc - 1 > q0 + warp * 16 || k0 + Tr::kBc > T ||
                           (p.window > 0 && int(q0 - k0) + warp * 16 + 15 >= p.window);
#pragma unroll
    for (int nt = 0; nt < kN; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = e >> 1;
        float dcap;
        float pv = exp2f(score_log2(p, s[nt][e], &dcap) - lse2[r]);
        if (need_mask) {
          const int64_t key = k0 + nt * 8 + 2 * q4 + (e & 1), t = row_t[r];
          const bool vis = key <= t && key < T && (seg == nullptr || seg[key] == seg_row[r]) &&
                           (p.window == 0 || int(t - key) < p.window);
          if (!vis) pv = 0.0f;
        }
        s[nt][e] = pv * (dp[nt][e] - dlt[r]) * dcap;
      }

    // dQ += dS K: dS's C fragments become A fragments; K arrives transposed through ldmatrix.trans.
    mma_c_by_tile<Tr::kBc / 16, D>(dq, s, k_tile, lane);
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  // Epilogue: dQ = scale * sum dS K, written once.
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int64_t t = row_t[r];
    if (t >= T) continue;
    bf16* row = p.dq + qoff + t * ldq;
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
      if (dt < dchunks)
        *reinterpret_cast<uint32_t*>(row + dt * 8 + 2 * q4) = pack_bf16(dq[dt][2 * r] * p.scale, dq[dt][2 * r + 1] * p.scale);
  }
}

}  // namespace attn

size_t attention_bwd_dq_smem_bytes(int64_t head_dim) {
  using namespace attn;
  return by_tile_width<size_t>(head_dim, DqTraits<64>::kSmemBytes, DqTraits<128>::kSmemBytes, DqTraits<256>::kSmemBytes);
}
static void (*dq_kernel(int64_t head_dim))(attn::AttnParams) {
  using namespace attn;
  return by_tile_width(head_dim, attn_bwd_dq_kernel<64>, attn_bwd_dq_kernel<128>, attn_bwd_dq_kernel<256>);
}

void attention_bwd_dq_launch(const attn::AttnParams& p, int64_t b, cudaStream_t s) {
  using Tr = attn::DqTraits<64>;  // every width's block shape
  static_assert(Tr::kBr == attn::DqTraits<128>::kBr && Tr::kThreads == attn::DqTraits<128>::kThreads &&
                Tr::kBr == attn::DqTraits<256>::kBr && Tr::kThreads == attn::DqTraits<256>::kThreads);
  const dim3 grid(unsigned(ceil_div64(p.t, Tr::kBr)), unsigned(p.n_head), unsigned(b));
  launch(dq_kernel(p.d), {grid, dim3(Tr::kThreads), attention_bwd_dq_smem_bytes(p.d), s}, p);
  QLORA_CUDA_LAUNCH_CHECK();
}
void attention_bwd_dq_set_smem_limits() {
  for (int w : {64, 128, 256}) allow_dynamic_smem(dq_kernel(w), attention_bwd_dq_smem_bytes(w));
}

}  // namespace qlora::cuda
