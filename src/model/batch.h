// Batch: one micro-batch of token rows, host side, as the model consumes it.
#pragma once
#include <cstdint>
#include <vector>

namespace qlora {

constexpr int32_t kIgnoreIndex = -100;

struct Batch {
  int64_t b = 0, t = 0;             // rows, tokens per row
  std::vector<int32_t> tokens;      // (B,T)
  std::vector<int32_t> targets;     // (B,T) label of the NEXT token (already shifted); -100 = no loss
  std::vector<int32_t> positions;   // (B,T) RoPE positions; restart at each packed document
  std::vector<int32_t> seg;         // (B,T) document id per token; empty = one document per row
  std::vector<int8_t> roles;        // (B,T) DocRole (text/dataset.h) of each token's document; empty = SFT
  std::vector<double> ref_logps;    // per document, rows in order: precomputed reference log-probs (or empty)
  std::vector<int32_t> lens;        // (B) each row's tokens before its right padding; empty = no padding

  int64_t n() const { return b * t; }
  int64_t n_trained() const {
    int64_t k = 0;
    for (int32_t y : targets) k += (y != kIgnoreIndex);
    return k;
  }
  // From Hugging Face style rows: labels unshifted (labels[t] is the label of token t).
  static Batch from_hf(int64_t b, int64_t t, const std::vector<int32_t>& input_ids,
                       const std::vector<int32_t>& labels) {
    Batch x;
    x.b = b; x.t = t;
    x.tokens = input_ids;
    x.targets.assign(size_t(b * t), kIgnoreIndex);
    x.positions.resize(size_t(b * t));
    for (int64_t i = 0; i < b; i++)
      for (int64_t j = 0; j < t; j++) {
        x.positions[size_t(i * t + j)] = int32_t(j);
        if (j + 1 < t) x.targets[size_t(i * t + j)] = labels[size_t(i * t + j + 1)];
      }
    return x;
  }
};

}  // namespace qlora
