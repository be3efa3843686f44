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
