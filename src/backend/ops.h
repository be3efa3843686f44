// Backend op argument structs: one struct per op, documenting shapes, dtypes and = / += semantics.
//
// Conventions for every op:
//  - Tensors are row-major. N = number of tokens (B*T). Shapes are given as // (dims) comments.
//  - CPU backend: every floating tensor is F32 (the reference). CUDA backend: activations BF16,
//    statistics (rstd, lse, losses) and all LoRA/optimizer tensors F32.
//  - "=" outputs are overwritten; "+=" outputs are accumulated into (caller zeroes them).
//  - Integer side inputs (tokens, labels, positions, segment ids) are int32 host-or-device
//    pointers living on the same device as the tensors.
#pragma once
#include <cstdint>
#include <vector>

#include "core/activation.h"
#include "core/attention_dq.h"
#include "core/tensor.h"
#include "quant/format.h"

namespace qlora {

// C = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T.  C (m,n); op(A) (m,k); op(B) (k,n).
// A is stored (m,k) or, with trans_a, (k,m); B is stored (k,n) or, with trans_b, (n,k).
// C may only alias nothing. beta=0 means C is "=" (C's old contents ignored even if NaN).
struct MatmulArgs {
  Tensor c, a, b;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
};

// A base projection on an FP8 weight as stored, no dequantization:
//   y (m,out) "=" q(x) w^T      x (m,in) in the compute dtype; y in the compute dtype
// w is one packed FP8_E4M3 per-tensor weight (out,in) on the backend's device (quant/quant_layout.h):
// its e4m3 codes times its stored scale_inv. q(x) is x quantized to e4m3 per tensor with current
// scaling, as quant/fp8.cpp scales a weight: s = 448 / amax(|x|) (amax 0: s = 1; s overflowing to
// inf: FLT_MAX), codes e4m3_rn_satfinite(x * s), value code / s. Products of codes accumulate in
// f32 and are multiplied by both scale_inv. amax (optional, F32 (1) on the device) "=" amax(|x|).
// CUDA: cuBLASLt FP8 on sm_89 and later (Backend::has_fp8_gemm), in % 16 == 0 and out % 8 == 0,
// 16-byte aligned x and y; anything else is Error(Unsupported). The CPU computes the same in f32.
struct MatmulFp8Args {
  Tensor y, x;
  const void* w = nullptr;
  int64_t m = 0, out = 0, in = 0;
  Tensor amax;
};

// A base projection through the block-scaled FP4 GEMM (NVFP4 numerics), no dequantization:
//   y (m,out) "=" q(x) w^T      x (m,in) in the compute dtype; y in the compute dtype
// w is one packed NVFP4 or MXFP4 weight (out,in) (quant/quant_layout.h: its e2m1 codes first) and
// w_scales its GEMM scales (quant/fp4_gemm.h: f32 decode scale, then e4m3 scales per 16, tiled).
// q(x) is x quantized to NVFP4 with quant/nvfp4.cpp's recipe (TransformerEngine's): a per-tensor
// decode scale amax / 2688 and an e4m3 scale per 16 of a row, codes e2m1 round-to-nearest-even.
// Products of decoded codes times both block scales accumulate in f32, times both decode scales.
// CUDA: cuBLASLt VEC16_UE4M3 on sm_100 (Backend::has_fp4_gemm), in % 32 == 0, out % 8 == 0,
// x and y 16-byte aligned; anything else is Error(Unsupported). The CPU computes the same in f32.
struct MatmulFp4Args {
  Tensor y, x;
  const void* w = nullptr;
  const void* w_scales = nullptr;
  int64_t m = 0, out = 0, in = 0;
};

// out[i,:] = table[tokens[i],:]     out (N,C) "="; table (V,C).
struct EmbeddingFwdArgs {
  Tensor out, table;
  const int32_t* tokens = nullptr;
  int64_t n = 0, c = 0, vocab = 0;
};
// dtable[tokens[i],:] += dout[i,:]  dtable (V,C) "+="; dout (N,C).
struct EmbeddingBwdArgs {
  Tensor dtable, dout;
  const int32_t* tokens = nullptr;
  int64_t n = 0, c = 0, vocab = 0;
};

// out = x * rstd * (w + w_offset), rstd = 1/sqrt(mean(x^2)+eps).  x,out (N,C); w (C); rstd (N) F32 "=".
// w_offset: 0 (Llama's RMSNorm), or 1 for Gemma's, which stores the weight as an offset from one
// and multiplies by (1 + w) in f32.
struct RmsnormFwdArgs {
  Tensor out, rstd, x, w;
  int64_t n = 0, c = 0;
  float eps = 1e-5f;
  float w_offset = 0.0f;
};
// dx "=" (N,C); dw "+=" (C) optional (empty = frozen norm weight); dout,x (N,C); rstd (N) from fwd.
// w_offset as in RmsnormFwdArgs (dw is the same either way).
struct RmsnormBwdArgs {
  Tensor dx, dw, dout, x, w, rstd;
  int64_t n = 0, c = 0;
  float w_offset = 0.0f;
};

// In-place rotary embedding, Hugging Face "rotate_half" layout over the first R = rotary_dim dims
// of each head (0: R = D): dims i and i+R/2 form a pair, dims from R on pass unchanged.
// x (N, n_head, D); positions (N); inv_freq (R/2) F32 (already includes rope scaling).
// fwd: x_rot <- scale (x_rot cos + rotate_half(x_rot) sin), angle pos*inv_freq (scale: LongRoPE's
// attention factor on cos and sin); bwd applies the transpose to a gradient in place.
struct RopeArgs {
  Tensor x, inv_freq;
  const int32_t* positions = nullptr;
  int64_t n = 0, n_head = 0, head_dim = 0;
  int64_t rotary_dim = 0;
  float scale = 1.0f;
  int64_t rot() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
};

// Causal attention with grouped KV heads and optional document segments for packed batches:
// query t attends to key s iff s <= t and (seg == null or seg[b,s] == seg[b,t]) and, with a
// sliding window (window > 0), t - s < window: the window keys up to and including t.
// q,out (B,T,Hq,D); k,v (B,T,Hkv,D); lse (B,Hq,T) F32 "=" (natural-log sum-exp of scaled scores);
// seg (B,T) int32 or null. scale = 1/sqrt(D) normally.
// KV-cache decoding: with t_kv > t, k and v hold t_kv positions per sequence, (B,t_kv,Hkv,D), and
// the t queries are the last t of them: query i sits at position t_kv - t + i and sees key s iff
// s <= t_kv - t + i. seg must then be null. t_kv = 0 means t (training).
struct AttentionFwdArgs {
  Tensor out, lse, q, k, v;
  const int32_t* seg = nullptr;
  int64_t b = 0, t = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 0.0f;
  int64_t t_kv = 0;
  // Documents (runs of equal seg along a row) in the whole call, when the caller knows them (0:
  // unknown). The CUDA backend's cuDNN path needs it for a packed call (docs/cuda_backend.md).
  int64_t n_docs = 0;
  // Sliding window (Mistral v0.1, Qwen's sliding layers): keys further back than window - 1
  // positions are hidden (with a KV cache, counted from the query's position t_kv - t + i). 0: none.
  int64_t window = 0;
  // Logit soft-capping (Gemma 2's attn_logit_softcapping): each score s = scale q.k becomes
  // softcap * tanh(s / softcap) before the mask and the softmax; lse is over the capped scores.
  // 0: none. The CPU backend implements it; CUDA refuses it (Error(Unsupported)).
  float softcap = 0.0f;
  // Attention sinks (gpt-oss's learned per-head logits; optional, (n_head) F32 on the device): head
  // h's softmax runs over the visible scores and sinks[h], whose probability attends to nothing:
  // out = sum_s e^(S_s) v_s / (e^(sinks[h]) + sum_s e^(S_s)), lse = log of that denominator. The
  // backward needs nothing more (its P = e^(S - lse) already carries the sink's share).
  Tensor sinks{};
};
// dq "=" (B,T,Hq,D); dk, dv "=" (B,T,Hkv,D); dout, out (B,T,Hq,D); lse from fwd.
struct AttentionBwdArgs {
  Tensor dq, dk, dv, dout, q, k, v, out, lse;
  const int32_t* seg = nullptr;
  int64_t b = 0, t = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 0.0f;
  int64_t n_docs = 0;  // as in AttentionFwdArgs
  int64_t window = 0;  // as in AttentionFwdArgs
  float softcap = 0.0f;  // as in AttentionFwdArgs: dS is carried back through the tanh
  // The forward ran with attention sinks (lse includes them; the gradient needs nothing else). The
  // CUDA backend then stays on the kernels its forward ran on (not cuDNN).
  bool sinks = false;
  // How the CUDA backend forms dq (core/attention_dq.h): Recompute needs no f32 accumulator
  // scratch. The CPU backend computes dq directly either way.
  AttnDq dq_mode = AttnDq::Accumulate;
};

// The gated MLP's activation: out = act(gate) * up.  all (N,F). act: silu (SwiGLU: Llama, Mistral,
// Qwen) or the tanh approximation of GELU (GeGLU: Gemma's gelu_pytorch_tanh,
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), as torch computes it); or gpt-oss's clamped
// SwiGLU with `clamp`: out = (u' + 1) g' sigmoid(alpha g'), g' = min(g, limit),
// u' = clamp(u, -limit, limit), in f32 in torch's order (g' alpha, sigmoid, g' times it, times u' + 1).
struct SwigluFwdArgs {
  Tensor out, gate, up;
  int64_t n = 0;  // total elements N*F
  Activation act = Activation::Silu;
  ClampedSwigluParams clamp{};  // ClampedSwiglu only
};
// dgate, dup "=" (N,F); dout, gate, up (N,F). ClampedSwiglu: as torch's autograd carries the
// gradient through each clamp, where g <= limit (gate) and -limit <= u <= limit (up), else 0.
struct SwigluBwdArgs {
  Tensor dgate, dup, dout, gate, up;
  int64_t n = 0;
  Activation act = Activation::Silu;
  ClampedSwigluParams clamp{};
};

// Mixture-of-experts routing (Mixtral, Qwen3-MoE), as transformers' top-k routers: per token
// p = softmax(logits) in f32 over the n_experts, its top_k largest (ties: the lower expert first),
// those p divided by their sum when norm_topk. The (token, choice) pairs are then laid out sorted by
// expert, an expert's in token order (the rows its GEMMs read). Outputs, all "=":
//   expert (N,K) I32 and weight (N,K) F32: token t's j-th choice (descending p) and its weight;
//   row (N,K) I32: the row of (t, j) in the expert-sorted layout (0 .. N*K-1);
//   token (N*K) I32 and row_weight (N*K) F32: the token of each sorted row and its weight;
//   offsets (E+1) I32: expert e's rows are [offsets[e], offsets[e+1]).
// logits (N,E) in the compute dtype.
struct MoeRouteArgs {
  Tensor logits, expert, weight, row, token, row_weight, offsets;
  int64_t n = 0, n_experts = 0, top_k = 0;
  bool norm_topk = true;
};
// dlogits (N,E) "=" the gradient of sum_{t,j} dweight[t,j] * weight[t,j] through the
// renormalisation and the softmax (the choice itself has none): with g_j = dweight[t,j] and
// Z = sum of the chosen p (1 without norm_topk), dp_e = (g_j - [norm_topk] sum_i g_i weight_i) / Z
// for the chosen e = expert[t,j], 0 for the others; dlogits_e = p_e (dp_e - sum_f p_f dp_f).
// dweight (N,K) F32; logits and expert as in the forward. With aux_grad (E) F32, the
// load-balancing loss's gradient in p (the same for every token): dp_e += mask[t] aux_grad[e] for
// every expert e before the softmax's backward (mask (N) F32, empty: 1; aux_grad empty: none).
struct MoeRouteBwdArgs {
  Tensor dlogits, dweight, logits, expert;
  int64_t n = 0, n_experts = 0, top_k = 0;
  bool norm_topk = true;
  Tensor aux_grad{}, mask{};
};
// Router statistics for the auxiliary load-balancing loss (transformers' load_balancing_loss_func),
// both "+=" so that a forward sums them over its layers: prob_sum (E) F32 += sum_t mask[t] p[t,e],
// p = softmax(logits[t]) in f32; count (E) F32 += sum_t mask[t] #{j : expert[t,j] = e}.
// logits (N,E) in the compute dtype; expert (N,K) I32 as moe_route_fwd wrote it; mask (N) F32
// (empty: 1). Each sum runs over t in order (deterministic).
struct MoeRouterStatsArgs {
  Tensor prob_sum, count, logits, expert, mask;
  int64_t n = 0, n_experts = 0, top_k = 0;
};
// dst (M,C) "=" rows of src (R,C): dst[r] = src[index[r]] * scale[r] (scale (M) F32; empty: 1).
struct GatherRowsArgs {
  Tensor dst, src, scale;
  const int32_t* index = nullptr;  // (M) on the device, each in [0, R)
  int64_t m = 0, c = 0;
};
// out (N,C) "=" (or "+=" with accumulate) the weighted sum of k rows of src (M,C) per token:
// out[t] = sum_j weight[t,j] * src[row[t,j]], j in order (weight (N,K) F32; empty: 1).
struct CombineRowsArgs {
  Tensor out, src, weight;
  const int32_t* row = nullptr;  // (N,K) on the device, each in [0, M)
  int64_t n = 0, k = 0, c = 0;
  bool accumulate = false;
};
// out (N,K) F32 "=": out[t,j] = dot(a[t], b[row[t,j]]) in f32; a (N,C), b (M,C).
struct RowDotsArgs {
  Tensor out, a, b;
  const int32_t* row = nullptr;  // (N,K) on the device
  int64_t n = 0, k = 0, c = 0;
};

// y += x  (elementwise, n elements).
struct AddArgs {
  Tensor y, x;
  int64_t n = 0;
};
// y[i,:] += bias  y (N,M), bias (M).
struct BiasAddArgs {
  Tensor y, bias;
  int64_t n = 0, m = 0;
};
// x *= s (n elements).
struct ScaleArgs {
  Tensor x;
  int64_t n = 0;
  float s = 1.0f;
};

// Inverted dropout, mask from hash_uniform(seed, stream, i): keep iff u >= p; kept values * 1/(1-p).
// fwd: out "=" (n); bwd: dx "=" dout * same mask / (1-p). Same (seed, stream) => same mask on every backend.
struct DropoutArgs {
  Tensor out, x;  // bwd: out=dx, x=dout
  int64_t n = 0;
  float p = 0.0f;
  uint64_t seed = 0, stream = 0;
  // Element i uses mask position offset + i: a tile of rows of a larger tensor gets the mask the
  // whole tensor would.
  uint64_t offset = 0;
};

// Cross-entropy over one chunk of rows, fused with its gradient.
// logits (n,V) in; dlogits (n,V) "=" and may alias logits; labels (n) int32, -100 = ignored row
// (its dlogits row is zeroed, loss 0). losses (n) F32 "=" per-row -log softmax[label].
// dlogits = (softmax - onehot) * grad_scale for counted rows.
// softcap > 0 (Gemma 2's final_logit_softcapping): the logits are first capped to
// softcap * tanh(logits / softcap); the losses are those of the capped logits and dlogits is
// carried back through the tanh (times 1 - tanh^2). The CPU backend implements it; CUDA refuses it.
struct CrossEntropyArgs {
  Tensor logits, dlogits, losses;
  const int32_t* labels = nullptr;
  int64_t n = 0, vocab = 0;
  float grad_scale = 1.0f;
  float softcap = 0.0f;
};

// PyTorch AdamW (decoupled weight decay, bias-corrected), step >= 1, all F32 (n elements):
// p -= lr*wd*p; m = b1*m+(1-b1)*g; v = b2*v+(1-b2)*g^2; p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps).
struct AdamwArgs {
  Tensor param, grad, m, v;
  int64_t n = 0;
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  int64_t step = 1;
};

// out (rows, cols) "=" the quantized weight at src, in the backend's compute dtype. src is one packed
// weight on the backend's device: the sections of quant/quant_layout.h back to back, as the arena
// stores a quantized projection. Every element equals dequantize_ref's f32 value (rounded to
// nearest even for a bf16 out).
// prefetch: out is read only by ops issued later, so the backend may run this beside the ops in
// between (CUDA: on a side stream, after the work issued so far; the first later op that reads
// out waits for it). The CPU runs it at once.
struct DequantizeArgs {
  Tensor out;
  const void* src = nullptr;
  QuantParams params;  // as stored (blocksize 0 = the format's default)
  int64_t rows = 0, cols = 0;
  bool prefetch = false;
};

// *out += the sum of x^2 over every element of every tensor in xs (F32 or BF16), in double. One
// call for many tensors: the global gradient norm is one reduction and, on a GPU, one
// synchronization per step instead of one per tensor.
struct SumsqArgs {
  std::vector<Tensor> xs;
  double* out = nullptr;  // on the host
};

// Activation offload: dst "=" src, `bytes` bytes, between device memory and host memory from
// Backend::alloc_host. to_host: src on the device, dst on the host; else src on the host, dst on
// the device. The copy starts after every op issued before it (the producer of src, the last
// readers of dst) and runs beside the ops issued after it (CUDA: on a copy stream of its own, so
// the DMA overlaps the kernels); the CPU copies at once. Until an offload_wait covers the copy's
// device range, later ops must not write that range (to_host) or read it (to the device).
struct OffloadCopyArgs {
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t bytes = 0;
  bool to_host = false;
};
// Orders every op issued after it behind the pending offload_copy calls whose device range
// overlaps [p, p + bytes) (CUDA: the main stream waits for their events; no host synchronization).
struct OffloadWaitArgs {
  const void* p = nullptr;
  int64_t bytes = 0;
};

}  // namespace qlora
