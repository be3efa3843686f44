// How an attention backward forms dQ, a memory/compute choice the planner makes and the CUDA
// backend's attention_bwd op takes (the CPU op computes dQ directly either way: same results).
#pragma once
#include <cstdint>

namespace qlora {

enum class AttnDq : uint8_t {
  // The key-major kernel adds each key block's part of dQ into an f32 (tokens x heads x head dim)
  // accumulator: one pass, the accumulator the largest buffer of a long-context backward.
  Accumulate,
  // dQ in a second, query-major pass that recomputes S and dP (about 40% more attention-backward
  // products), with no accumulator.
  Recompute,
};

}  // namespace qlora
