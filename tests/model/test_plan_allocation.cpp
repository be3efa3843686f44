// The engine allocates exactly what the memory plan says, category by category.
#include <gtest/gtest.h>

#include "model_test_util.h"

using namespace qlora;
using namespace qlora::testing_util;

TEST(PlanAllocation, AllocatedBytesEqualThePlanPerCategory) {
  struct Case { std::string variant, ckpt; int64_t mb, seq, chunk; double dropout; std::vector<std::string> targets; };
  const std::vector<Case> cases = {
      {"llama_gqa", "none", 2, 12, 1024, 0.0, {"all-linear"}},
      {"qwen2", "full", 1, 16, 5, 0.1, {"q_proj", "v_proj"}},
      {"llama_tied", "none", 3, 7, 4, 0.05, {"down_proj", "o_proj"}},
  };
  for (const auto& c : cases) {
    LoraSpec lora = fixture_lora();
    lora.dropout = c.dropout;
    lora.targets = LoraSpec::resolve_targets(c.targets);
    TestModel t = make_model(c.variant, lora, c.mb, c.seq, c.ckpt, c.chunk);
    const auto planned = t.model->plan().bytes_by_category();
    const auto& alloc = t.model->arena().allocated();
    EXPECT_EQ(planned.size(), alloc.size()) << c.variant;
    for (const auto& [cat, bytes] : planned) {
      ASSERT_TRUE(alloc.count(cat)) << mem_category_name(cat);
      EXPECT_EQ(alloc.at(cat), bytes) << c.variant << " " << mem_category_name(cat);
    }
    // LoRA bytes by hand: per layer and target, A (r,in) + B (out,r) in fp32.
    int64_t lora_bytes = 0;
    for (const auto& tgt : lora.targets) {
      auto [out, in] = projection_shape(t.model->config(), tgt);
      lora_bytes += MemoryPlan::aligned(lora.r * in * 4) + MemoryPlan::aligned(out * lora.r * 4);
    }
    EXPECT_EQ(planned.at(MemCategory::Lora), lora_bytes * t.model->config().n_layer);
    EXPECT_EQ(planned.at(MemCategory::Optimizer), 2 * planned.at(MemCategory::Lora));
  }
}

TEST(PlanAllocation, CheckpointingShrinksActivations) {
  LoraSpec lora = fixture_lora();
  MemoryPlan none, full;
  ModelPlanOptions o;
  o.targets = lora.targets;
  o.lora_r = 4;
  o.seq_len = 512;
  LlamaConfig c = open_model_source(fixtures() + "/models/llama_gqa").config;
  c.n_layer = 8;
  plan_model_buffers(none, c, o);
  o.checkpointing = "full";
  plan_model_buffers(full, c, o);
  EXPECT_LT(full.bytes_by_category().at(MemCategory::Activations), none.bytes_by_category().at(MemCategory::Activations));
}
