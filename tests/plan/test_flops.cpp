// FLOP counts against the independently derived table in reference/perf_anchors.md §10 and hand sums.
#include <gtest/gtest.h>

#include "model/model_plan.h"
#include "plan/flops.h"

using namespace qlora;

namespace {

double gflop(const LlamaConfig& c, int64_t T, int64_t r, bool rec, const char* method = "lora") {
  FlopOptions o;
  o.method = parse_method(method, "method");
  o.lora_r = r;
  o.targets = all_linear_targets();
  o.attn_len = T;
  o.recompute = rec;
  return flops_per_token(c, o).total() / 1e9;
}

}  // namespace

// perf_anchors §10: N_lin = 6.979B, N_head = 0.525B, P_L = 2.621M (8B); 68.45B, 1.051B, 12.94M (70B).
TEST(Flops, ShapeSumsMatchAnchors) {
  ShapeSums s8 = shape_sums(preset_config("llama3-8b"), all_linear_targets());
  EXPECT_NEAR(s8.n_lin / 1e9, 6.979, 0.0005);
  EXPECT_NEAR(s8.n_head / 1e9, 0.525, 0.0005);
  EXPECT_NEAR(s8.p_l / 1e6, 2.621, 0.0005);
  // by hand: per layer 4096*4096*2 + 1024*4096*2 + 14336*4096*3 = 218,103,808 x 32
  EXPECT_EQ(s8.n_lin, 218103808.0 * 32);
  ShapeSums s70 = shape_sums(preset_config("llama3-70b"), all_linear_targets());
  EXPECT_NEAR(s70.n_lin / 1e9, 68.45, 0.005);
  EXPECT_NEAR(s70.n_head / 1e9, 1.051, 0.0005);
  EXPECT_NEAR(s70.p_l / 1e6, 12.94, 0.005);
}

// The anchor table rounds to 0.01 GFLOP and counts T/2 keys per query (we count (T+1)/2: +0.03%
// of attention, below that rounding).
TEST(Flops, PerTokenMatchesAnchorTable) {
  const LlamaConfig c8 = preset_config("llama3-8b"), c70 = preset_config("llama3-70b");
  const double tol = 0.011;
  EXPECT_NEAR(gflop(c8, 2048, 16, false), 32.15, tol);
  EXPECT_NEAR(gflop(c8, 2048, 16, true), 46.73, tol);
  EXPECT_NEAR(gflop(c8, 2048, 64, false), 32.90, tol);
  EXPECT_NEAR(gflop(c8, 2048, 64, true), 47.74, tol);
  EXPECT_NEAR(gflop(c8, 4096, 16, false), 34.03, tol);
  EXPECT_NEAR(gflop(c8, 4096, 16, true), 49.14, tol);
  EXPECT_NEAR(gflop(c70, 2048, 16, false), 288.64, tol);
  EXPECT_NEAR(gflop(c70, 2048, 16, true), 428.65, tol);
  EXPECT_NEAR(gflop(c70, 4096, 16, false), 298.04, tol);
  EXPECT_NEAR(gflop(c70, 4096, 64, true), 445.70, tol);
  FlopOptions o;
  o.targets = all_linear_targets();
  o.attn_len = 2048;
  FlopCounts f = flops_per_token(c8, o);
  EXPECT_NEAR(f.fwd.total() / 1e9, 15.63, tol);
  EXPECT_NEAR(f.bwd.total() / 1e9, 16.52, tol);
}

// Attention term by hand for a 4-token document on a toy shape: 4*q_dim*(D+1)/2*L.
TEST(Flops, ExactCausalAttentionCount) {
  LlamaConfig c = preset_config("smollm2-135m");  // q_dim 576, 30 layers
  FlopOptions o;
  o.targets = {"q_proj"};
  o.attn_len = 4;  // pairs: 1+2+3+4 = 10 = 4*(4+1)/2 -> 2.5 keys per token
  FlopCounts f = flops_per_token(c, o);
  EXPECT_DOUBLE_EQ(f.fwd.attn, 4.0 * 576 * 2.5 * 30);
  EXPECT_DOUBLE_EQ(f.bwd.attn, 2.5 * f.fwd.attn);
  EXPECT_EQ(f.recompute.total(), 0.0);
  // LoRA on q only: 2 r (in + out) = 2 * 16 * (576 + 576) per layer forward, twice that backward.
  EXPECT_DOUBLE_EQ(f.fwd.lora, 2.0 * 16 * 1152 * 30);
  EXPECT_DOUBLE_EQ(f.bwd.lora, 2 * f.fwd.lora);
}

// A sliding window W caps the keys per query at W: over a span of 6 with W = 2 the pairs are
// 1+2+2+2+2+2 = 11 (not 21); on a model whose window covers only some layers, those layers alone.
TEST(Flops, SlidingWindowCapsTheKeysPerQuery) {
  LlamaConfig c = preset_config("smollm2-135m");
  FlopOptions o;
  o.targets = {"q_proj"};
  o.attn_len = 6;
  const double full = flops_per_token(c, o).fwd.attn;
  EXPECT_DOUBLE_EQ(full, 4.0 * 576 * (21.0 / 6) * 30);
  c.sliding_window = 2;
  EXPECT_DOUBLE_EQ(flops_per_token(c, o).fwd.attn, 4.0 * 576 * (11.0 / 6) * 30);
  c.sliding_layers.assign(30, false);
  c.sliding_layers[3] = c.sliding_layers[7] = true;
  EXPECT_DOUBLE_EQ(flops_per_token(c, o).fwd.attn, 4.0 * 576 * ((11.0 / 6) * 2 + (21.0 / 6) * 28));
  c.sliding_window = 6;  // as long as the span: no change
  EXPECT_DOUBLE_EQ(flops_per_token(c, o).fwd.attn, full);
}

// Full fine-tuning: backward computes weight gradients too (2x forward matmuls), no LoRA terms;
// total = 6 (N_lin + N_head) + 3.5 A without recompute.
TEST(Flops, FullFineTuneIsSixN) {
  const LlamaConfig c = preset_config("llama3-8b");
  FlopOptions o;
  o.method = Method::Full;
  o.targets = all_linear_targets();  // ignored for full
  o.attn_len = 2048;
  FlopCounts f = flops_per_token(c, o);
  ShapeSums s = shape_sums(c, {});
  const double A = 4.0 * 4096 * 2049 / 2 * 32;
  EXPECT_DOUBLE_EQ(f.fwd.lora + f.bwd.lora, 0.0);
  EXPECT_NEAR(f.total(), 6 * (s.n_lin + s.n_head) + 3.5 * A, 1e3);
  // perf_anchors rule of thumb: frozen-base LoRA costs about 2/3 of full fine-tuning.
  EXPECT_NEAR(gflop(c, 2048, 16, false) / (f.total() / 1e9), 2.0 / 3, 0.025);
}
