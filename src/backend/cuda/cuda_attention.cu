// attention_fwd / attention_bwd ops: argument checks, the delta pre-pass and the dq epilogue
// around the flash-attention kernels (cuda_attention_fwd.cu, cuda_attention_bwd.cu, and
// cuda_attention_dq.cu for dQ's own pass).
#include <climits>
#include <cmath>
#include <string>

#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cudnn_attention.h"

namespace qlora::cuda {

namespace {

constexpr int kDeltaThreads = 256;  // attn_delta_kernel's block: 8 rows, one warp each
constexpr int kDqThreads = 256;     // attn_dq_kernel's block

// delta[b,h,t] = sum_d dout[b,t,h,d] * out[b,t,h,d]; one warp per (b,t,h) row.
__global__ void __launch_bounds__(kDeltaThreads)
    attn_delta_kernel(const __nv_bfloat16* __restrict__ dout, const __nv_bfloat16* __restrict__ out,
                      float* __restrict__ delta, int64_t rows, int64_t t_len, int n_head, int head_dim) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float s = 0.0f;
  for (int d = lane; d < head_dim; d += 32)
    s += __bfloat162float(dout[row * head_dim + d]) * __bfloat162float(out[row * head_dim + d]);
  s = warp_sum(s);
  if (lane == 0) {
    const int64_t h = row % n_head, bt = row / n_head, t = bt % t_len, b = bt / t_len;
    delta[(b * n_head + h) * t_len + t] = s;
  }
}

// dq = bf16(scale * dq_acc): `rows` rows of d columns; dq_acc rows are the kernel's tile width
// `dp` >= d wide (the padded columns are never read).
__global__ void __launch_bounds__(kDqThreads) attn_dq_kernel(const float* __restrict__ acc, __nv_bfloat16* __restrict__ dq,
                                                             int64_t rows, int d, int dp, float scale) {
  const int64_t half = d / 2, n = rows * half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / half, c = i % half;
    const float2 v = reinterpret_cast<const float2*>(acc + r * dp)[c];
    reinterpret_cast<__nv_bfloat162*>(dq)[i] = __floats2bfloat162_rn(v.x * scale, v.y * scale);
  }
}

struct AttnDims {
  int64_t b, t, hq, hkv, d;
};

AttnDims attn_dims(const char* op, int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t d, float scale,
                   int64_t window) {
  if (window < 0 || window > INT32_MAX)
    fail(ErrorKind::Internal, std::string("cuda op ") + op + ", argument 'window'", "must be in [0, 2^31)");
  check_dim(op, "b", b);
  check_dim(op, "t", t);
  check_dim(op, "head_dim", d);
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0)
    fail(ErrorKind::Shape, std::string("cuda op ") + op + ", dimension 'n_head'",
         "n_head " + std::to_string(hq) + " is not a positive multiple of n_head_kv " + std::to_string(hkv));
  if (!(scale > 0.0f) || !std::isfinite(scale))
    fail(ErrorKind::Internal, std::string("cuda op ") + op + ", argument 'scale'",
         "scale must be positive and finite, got " + std::to_string(scale), "normally 1/sqrt(head_dim)");
  if (d % 8 != 0 || d > 256)
    unsupported(op, "head_dim " + std::to_string(d) + " has no flash-attention kernel (head dims that are multiples of 8 up to 256 do)",
                "use device=cpu for this model");
  if (hq > 65535 || b > 65535) unsupported(op, "more than 65535 heads or sequences in one call");
  return {b, t, hq, hkv, d};
}

void check_vec_aligned(const char* op, const char* name, const Tensor& t) {
  if (!aligned16(t.data))
    fail(ErrorKind::Internal, std::string("cuda op ") + op + ", tensor '" + name + "'",
         "is not 16-byte aligned; the attention kernels load rows with 16-byte copies");
}

attn::AttnParams base_params(const AttnDims& g, const Tensor& q, const Tensor& k, const Tensor& v, const int32_t* seg,
                             float scale) {
  attn::AttnParams p{};
  p.q = static_cast<const attn::bf16*>(q.data);
  p.k = static_cast<const attn::bf16*>(k.data);
  p.v = static_cast<const attn::bf16*>(v.data);
  p.seg = seg;
  p.t = g.t;
  p.t_kv = g.t;
  p.d = int(g.d);
  p.n_head = int(g.hq);
  p.n_head_kv = int(g.hkv);
  p.group = int(g.hq / g.hkv);
  p.scale = scale;
  p.scale_log2 = scale * attn::kLog2e;
  return p;
}

}  // namespace

void attention_set_smem_limits() {
  attention_fwd_set_smem_limits();
  attention_bwd_set_smem_limits();
  attention_bwd_dq_set_smem_limits();
}

void CudaBackend::attention_fwd(const AttentionFwdArgs& a) {
  const char* op = "attention_fwd";
  const AttnDims g = attn_dims(op, a.b, a.t, a.n_head, a.n_head_kv, a.head_dim, a.scale, a.window);
  check_softcap(op, a.softcap);
  const int64_t tk = a.t_kv == 0 ? g.t : a.t_kv;  // keys per sequence (more than t with a KV cache)
  if (tk < g.t || (tk > g.t && a.seg))
    fail(ErrorKind::Internal, std::string("cuda op ") + op + ", argument 't_kv'",
         "t_kv " + std::to_string(a.t_kv) + " must be 0 or at least t " + std::to_string(g.t) +
             (tk > g.t ? ", and a KV cache takes no segments" : ""));
  const int64_t nq = g.b * g.t * g.hq * g.d, nkv = g.b * tk * g.hkv * g.d;
  check_tensor(op, "out", a.out, nq, true, false);
  check_tensor(op, "lse", a.lse, g.b * g.hq * g.t, false, true);
  check_tensor(op, "q", a.q, nq, true, false);
  check_tensor(op, "k", a.k, nkv, true, false);
  check_tensor(op, "v", a.v, nkv, true, false);
  if (g.b == 0 || g.t == 0) return;
  for (auto [name, t] : {std::pair{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"out", &a.out}}) check_vec_aligned(op, name, *t);
  if (a.sinks.data) check_tensor(op, "sinks", a.sinks, g.hq, false, true);
  // sm_90/sm_100: cuDNN's fused attention (its graphs have no sinks and no soft-capping: those run
  // on the own kernel)
  if (!a.sinks.data && a.softcap == 0.0f && cudnn_attention_fwd(*this, a, tk)) return;
  attn::AttnParams p = base_params(g, a.q, a.k, a.v, a.seg, a.scale);
  p.t_kv = tk;
  p.window = a.window < tk ? int(a.window) : 0;  // a window as long as the keys hides nothing
  p.out = static_cast<attn::bf16*>(a.out.data);
  p.lse = a.lse.f32();
  p.sinks = a.sinks.data ? a.sinks.f32() : nullptr;
  p.softcap = a.softcap;
  attention_fwd_launch(p, g.b, stream_);
}

void CudaBackend::attention_bwd(const AttentionBwdArgs& a) {
  const char* op = "attention_bwd";
  const AttnDims g = attn_dims(op, a.b, a.t, a.n_head, a.n_head_kv, a.head_dim, a.scale, a.window);
  check_softcap(op, a.softcap);
  const int64_t nq = g.b * g.t * g.hq * g.d, nkv = g.b * g.t * g.hkv * g.d;
  check_tensor(op, "dq", a.dq, nq, true, false);
  check_tensor(op, "dk", a.dk, nkv, true, false);
  check_tensor(op, "dv", a.dv, nkv, true, false);
  check_tensor(op, "dout", a.dout, nq, true, false);
  check_tensor(op, "q", a.q, nq, true, false);
  check_tensor(op, "k", a.k, nkv, true, false);
  check_tensor(op, "v", a.v, nkv, true, false);
  check_tensor(op, "out", a.out, nq, true, false);
  check_tensor(op, "lse", a.lse, g.b * g.hq * g.t, false, true);
  if (g.b == 0 || g.t == 0) return;
  for (auto [name, t] : {std::pair{"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}, {"dout", &a.dout}, {"q", &a.q},
                         {"k", &a.k}, {"v", &a.v}, {"out", &a.out}})
    check_vec_aligned(op, name, *t);
  // sm_90/sm_100: cuDNN's fused attention (not with sinks or soft-capping)
  if (!a.sinks && a.softcap == 0.0f && cudnn_attention_bwd(*this, a)) return;

  const int64_t rows = g.b * g.t * g.hq, dp = cuda_plan::attention_dq_cols(g.d);
  // Soft-capped scores and head dims over 128: dQ in its own pass (cuda_scratch.h).
  const bool accumulate = a.dq_mode == AttnDq::Accumulate && !cuda_plan::attention_dq_own_pass(g.d, a.softcap > 0.0f);
  float* dq_acc = nullptr;  // (B,T,Hq,Dp)
  if (accumulate) {
    dq_acc = static_cast<float*>(scratch(Scratch::AttnDq, size_t(rows * dp) * 4));
    QLORA_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, size_t(rows * dp) * 4, stream_));
  }
  auto* delta = static_cast<float*>(scratch(Scratch::AttnDelta, size_t(g.b * g.hq * g.t) * 4));  // (B,Hq,T)
  launch(attn_delta_kernel, {unsigned(ceil_div64(rows * 32, kDeltaThreads)), kDeltaThreads, 0, stream_},
         static_cast<const __nv_bfloat16*>(a.dout.data), static_cast<const __nv_bfloat16*>(a.out.data), delta, rows, g.t,
         int(g.hq), int(g.d));
  QLORA_CUDA_LAUNCH_CHECK();

  attn::AttnParams p = base_params(g, a.q, a.k, a.v, a.seg, a.scale);
  p.window = a.window < g.t ? int(a.window) : 0;
  p.dout = static_cast<const attn::bf16*>(a.dout.data);
  p.lse_in = a.lse.f32();
  p.softcap = a.softcap;
  p.delta = delta;
  p.dq_acc = dq_acc;
  p.dq = static_cast<attn::bf16*>(a.dq.data);
  p.dk = static_cast<attn::bf16*>(a.dk.data);
  p.dv = static_cast<attn::bf16*>(a.dv.data);
  attention_bwd_launch(p, g.b, stream_);  // dK, dV (and dQ into the accumulator)
  if (!accumulate) return attention_bwd_dq_launch(p, g.b, stream_);  // dQ in its own pass

  const int blocks = int(std::min<int64_t>(ceil_div64(nq / 2, kDqThreads), int64_t(sm_count_) * 16));
  launch(attn_dq_kernel, {blocks, kDqThreads, 0, stream_}, dq_acc, static_cast<__nv_bfloat16*>(a.dq.data), rows,
         int(g.d), int(dp), a.scale);
  QLORA_CUDA_LAUNCH_CHECK();
}

}  // namespace qlora::cuda
