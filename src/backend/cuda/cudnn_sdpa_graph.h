// cuDNN fused attention (SDPA) graphs of the CUDA backend, described with the cuDNN frontend:
// one graph per shape, forward (O and the log-sum-exp stats) or backward (dQ, dK, dV), over the
// backend's packed layout. Host-only (no kernels); shared by the backend (cudnn_attention.cu), the
// host harness's cuDNN (emu/emu_cudnn.cpp) and the graph validation tests.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>

namespace cudnn_frontend::graph {
class Graph;
}

namespace qlora::cuda::sdpa {

// One graph's shape. Every document (run of equal segment ids) of every packed row is one cuDNN
// batch entry: its tokens start at a ragged offset into the (B,T,H,D) buffers and it holds
// seq_len[e] <= s tokens (the padding mask hides the rest); causal within the entry.
//   Q, O, dQ, dO  (B,T,Hq,D) bf16     entry e at element q_off[e] = token0(e) * Hq * D (token0:
//   K, V, dK, dV  (B,T,Hkv,D) bf16    entry e at element kv_off[e] = token0(e) * Hkv * D   index in B*T)
//   Stats (lse)   (B,Hq,T) f32        entry e of row r at element stats_off[e] = r*Hq*T + t0(e), where
//                                     t0(e) is its first token's index in the row (natural log)
struct Shape {
  int64_t entries = 0;  // cuDNN batch entries: a power of two >= the documents in the call
  int64_t s = 0;        // the longest an entry may be: the packed row length T
  int64_t tokens = 0;   // B*T: the total tokens of the call (max_total_seq_len)
  int64_t hq = 0, hkv = 0, d = 0;
  float scale = 0.0f;
  bool backward = false;
  // A sliding window: query i sees keys j with i - j < window (cuDNN's diagonal band, left bound
  // `window`, top-left aligned per entry); 0: every key up to i.
  int64_t window = 0;
  auto tie() const { return std::tie(entries, s, tokens, hq, hkv, d, scale, backward, window); }
  bool operator<(const Shape& o) const { return tie() < o.tie(); }
};

// Variant-pack UIDs of the graphs' tensors. The ragged offsets and sequence lengths are int32
// device arrays (entries+1 offsets, entries lengths) that the seg kernel writes each call.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV,
  kSeqLenQ, kSeqLenKv,
  kOffQ, kOffK, kOffV, kOffO, kOffStats, kOffdO, kOffdQ, kOffdK, kOffdV,
};

// The graph for `shape` (nodes and tensors described, not yet validated or built). `sm` is the
// target's compute capability x10 (80, 90, 100); 0 leaves it to the handle's device.
std::shared_ptr<cudnn_frontend::graph::Graph> describe(const Shape& shape, int sm);

// graph.validate() (no device or handle needed): "" when the frontend accepts it, else its
// error code and message.
std::string validate(cudnn_frontend::graph::Graph& g);

// Human-readable shape for error messages: "fwd entries=8 s=512 tokens=4096 hq=32 hkv=8 d=128"
// (and " window=W" with one).
std::string describe_shape(const Shape& shape);

// Smallest power of two >= n (n >= 1).
int64_t entries_bucket(int64_t n);

}  // namespace qlora::cuda::sdpa
