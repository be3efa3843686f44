// qlora plan --fit's longest context per checkpointing mode for Llama-3-8B and 70B (QLoRA NF4) on
// one H100 and one B200, the numbers docs/planning.md section 5 lists: each is the planner's own
// answer, tight against make_plan (fits at T, not at T + 128), not a figure kept anywhere.
#include <gtest/gtest.h>

#include "plan/fit.h"
#include "plan/planner.h"

using namespace qlora;

TEST(FitContext, LongestContextPerCheckpointingIsThePlannersAnswer) {
  for (const char* model : {"llama3-8b", "llama3-70b"})
    for (const char* gpu : {"h100-sxm", "b200"}) {
      PlanRequest r;
      r.model = preset_config(model);
      r.model_label = model;
      r.gpu = resolve_gpu(gpu);
      r.method = Method::Qlora;
      r.base_precision = BasePrecision::Nf4;
      r.micro_batch = 1;
      const FitReport f = fit_search(r);
      ASSERT_EQ(f.max_seq_len_by_checkpointing.size(), 3u);
      int64_t prev = 0;
      for (const auto& [ckpt, T] : f.max_seq_len_by_checkpointing) {
        SCOPED_TRACE(std::string(model) + " on " + gpu + ", checkpointing " + checkpointing_name(ckpt));
        PlanRequest q = r;
        q.checkpointing = ckpt;
        EXPECT_EQ(T, max_seq_len_that_fits(q));
        ASSERT_GT(T, 0);
        EXPECT_EQ(T % 128, 0);
        q.seq_len = T;
        EXPECT_TRUE(make_plan(q).fits);
        q.seq_len = T + 128;
        EXPECT_FALSE(make_plan(q).fits);
        EXPECT_GT(T, prev) << "none < full < offload";
        prev = T;
      }
    }
}

// The auto MLP tile is the engine's choice against the device: where tiles of 8,192 tokens no
// longer fit, the plan runs smaller ones, so --fit reaches further than with the tile forced.
TEST(FitContext, AutoMlpTileShrinksWhereTheDefaultNoLongerFits) {
  PlanRequest r;
  r.model = preset_config("llama3-70b");
  r.model_label = "llama3-70b";
  r.gpu = resolve_gpu("h100-sxm");
  r.method = Method::Qlora;
  r.base_precision = BasePrecision::Nf4;
  r.checkpointing = Checkpointing::Offload;
  r.attn_dq = AttnDq::Accumulate;  // the MLP tile alone (the attention's dq has its own test below)
  PlanRequest forced = r;
  forced.mlp_tile = kAutoMlpTileTokens;
  const int64_t t_forced = max_seq_len_that_fits(forced), t_auto = max_seq_len_that_fits(r);
  ASSERT_GT(t_forced, kAutoMlpTileTokens);
  EXPECT_GT(t_auto, t_forced);
  r.seq_len = forced.seq_len = t_auto;
  const PlanResult p = make_plan(r);
  EXPECT_TRUE(p.fits);
  EXPECT_FALSE(make_plan(forced).fits);
  const int64_t tile = p.options.mlp_tile;
  EXPECT_LT(tile, kAutoMlpTileTokens);
  EXPECT_GE(tile, kMinAutoMlpTileTokens);
  EXPECT_LE(p.plan.find("act.cur.gate")->shape[0], tile);
  // At the length the forced tile still fits, auto keeps the default.
  r.seq_len = t_forced;
  EXPECT_EQ(model_plan_options(r).mlp_tile, kAutoMlpTileTokens);
}

// Past the smallest MLP tile, the auto plan gives the attention backward's dq its own pass: no f32
// accumulator of (tokens x heads x 128) is planned, so --fit reaches further than with dq
// accumulated, and the speed estimate counts the recomputed products on the own kernels.
TEST(FitContext, AutoAttentionDqIsRecomputedWhereTheAccumulatorNoLongerFits) {
  for (const char* model : {"llama3-8b", "llama3-70b"}) {
    SCOPED_TRACE(model);
    PlanRequest r;
    r.model = preset_config(model);
    r.model_label = model;
    r.gpu = resolve_gpu("h100-sxm");
    r.method = Method::Qlora;
    r.base_precision = BasePrecision::Nf4;
    r.checkpointing = Checkpointing::Offload;
    PlanRequest acc = r;
    acc.attn_dq = AttnDq::Accumulate;
    const int64_t t_acc = max_seq_len_that_fits(acc), t_auto = max_seq_len_that_fits(r);
    EXPECT_GT(t_auto, t_acc);
    r.seq_len = acc.seq_len = t_auto;
    const PlanResult p = make_plan(r), pa = make_plan(acc);
    EXPECT_TRUE(p.fits);
    EXPECT_FALSE(pa.fits);
    EXPECT_EQ(p.options.attn_dq, AttnDq::Recompute);
    EXPECT_EQ(p.options.mlp_tile, kMinAutoMlpTileTokens);
    EXPECT_EQ(p.plan.find("cuda.attn_dq_acc")->bytes, 0);
    EXPECT_EQ(pa.plan.find("cuda.attn_dq_acc")->bytes, t_auto * r.model.n_head * 128 * 4);
    EXPECT_NEAR(p.speed.per_token.bwd.attn / pa.speed.per_token.bwd.attn, 3.5 / 2.5, 1e-12);
    EXPECT_NE(p.speed.attention_path.find("dq in its own pass"), std::string::npos) << p.speed.attention_path;
    // Where the accumulator fits, auto keeps it.
    r.seq_len = t_acc;
    EXPECT_EQ(model_plan_options(r).attn_dq, AttnDq::Accumulate);
  }
}
