// The attention path the planner assumes per GPU (plan/attention_path.h): cuDNN's fused attention
// on compute capability 9.x/10.x catalog parts, the own kernel elsewhere, each at its own
// efficiency, reported in the plan.
#include <gtest/gtest.h>

#include "plan/attention_path.h"
#include "plan/planner.h"

using namespace qlora;

namespace {

PlanRequest request(const std::string& gpu) {
  PlanRequest r;
  r.model = preset_config("llama3-8b");
  r.model_label = "llama3-8b";
  r.gpu = resolve_gpu(gpu);
  r.method = Method::Lora;
  return r;
}

}  // namespace

TEST(AttentionPath, CudnnOnSm90AndSm100OwnKernelElsewhere) {
  const PlanAssumptions& a = plan_assumptions();
  for (const char* g : {"h100", "h200", "b200", "gb200"}) {
    const AttentionPath p = attention_path(resolve_gpu(g), a);
    EXPECT_EQ(p.name, "cudnn") << g;
    EXPECT_EQ(p.efficiency, a.attention_efficiency) << g;
  }
  for (const char* g : {"a100", "rtx4090", "custom:mem=80GB,bw=3TB/s,bf16=900"}) {
    const AttentionPath p = attention_path(resolve_gpu(g), a);
    EXPECT_EQ(p.name, "own") << g;
    EXPECT_EQ(p.efficiency, a.own_attention_efficiency) << g;
  }
}

// The speed model divides attention FLOPs by the path's efficiency: changing the own kernel's
// assumption moves the A100 estimate and leaves the H100 one; the plan names the path.
TEST(AttentionPath, SpeedModelUsesThePathsEfficiency) {
  PlanAssumptions slow_own = plan_assumptions();
  slow_own.own_attention_efficiency = plan_assumptions().own_attention_efficiency / 2;
  for (const char* g : {"a100", "h100"}) {
    PlanRequest r = request(g);
    const PlanResult p = make_plan(r);
    const SpeedEstimate s = estimate_speed(p.req, p.options, p.replica, slow_own);
    const bool own = std::string(g) == "a100";
    EXPECT_NEAR(s.t_attn / p.speed.t_attn, own ? 2.0 : 1.0, 1e-9) << g;
    EXPECT_EQ(p.speed.attention_path, own ? "own flash-attention kernel (mma.sync)" : "cuDNN fused attention (sm_90/sm_100)");
  }
}

// What cuDNN's graphs lack runs on the own kernels on every GPU: gpt-oss's sinks, and Gemma 2's
// soft-capping, whose dq also takes its own pass (priced as such: more backward attention FLOPs).
TEST(AttentionPath, SinksAndSoftCappingArePlannedOnTheOwnKernels) {
  const PlanAssumptions& a = plan_assumptions();
  EXPECT_EQ(attention_path(resolve_gpu("h100"), a, AttnDq::Accumulate, true).name, "own");
  for (const char* model : {"gemma-2-27b", "gpt-oss-20b"}) {
    PlanRequest r = request("h100");
    r.model = preset_config(model);
    r.model_label = model;
    const PlanResult p = make_plan(r);
    EXPECT_EQ(p.speed.attention_path.rfind("own flash-attention kernel", 0), 0u) << model << ": " << p.speed.attention_path;
  }
  PlanRequest r = request("h100");
  r.model = preset_config("gemma-2-27b");
  r.method = Method::Qlora;  // room for the dq accumulator: the uncapped run below keeps it
  r.seq_len = 1024;
  const PlanResult capped = make_plan(r);
  EXPECT_NE(capped.speed.attention_path.find("dq in its own pass"), std::string::npos) << capped.speed.attention_path;
  r.model.attn_logit_softcapping = 0;  // the same shape uncapped: cuDNN, fewer backward FLOPs
  const PlanResult plain = make_plan(r);
  EXPECT_EQ(plain.speed.attention_path.rfind("cuDNN", 0), 0u) << plain.speed.attention_path << " / " << capped.speed.attention_path;
  EXPECT_GT(capped.speed.per_token.bwd.attn, plain.speed.per_token.bwd.attn);
}
