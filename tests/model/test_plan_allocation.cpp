// The engine allocates exactly what the memory plan says, category by category.
#include <gtest/gtest.h>

#include "model_test_util.h"
#include "plan/planner.h"

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
  o.lora = lora;
  o.lora.r = 4;
  o.seq_len = 512;
  LlamaConfig c = open_model_source(fixtures() + "/models/llama_gqa").config;
  c.n_layer = 8;
  plan_model_buffers(none, c, o);
  o.checkpointing = Checkpointing::Full;
  plan_model_buffers(full, c, o);
  EXPECT_LT(full.bytes_by_category().at(MemCategory::Activations), none.bytes_by_category().at(MemCategory::Activations));
}

// A quantized base: each projection's buffer holds exactly quant_storage_bytes (packed codes and
// scales together), and the arena still allocates exactly the plan, category by category.
TEST(PlanAllocation, QuantizedBaseAllocatesThePlan) {
  struct Case { std::string precision; bool dq; int64_t bs; std::string ckpt; };
  const std::vector<Case> cases = {{"nf4", true, 64, "none"}, {"nf4", false, 32, "full"}, {"fp4", true, 4096, "none"},
                                   {"nvfp4", false, 64, "none"}, {"mxfp4", false, 64, "full"}, {"fp8", false, 64, "none"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.precision + " dq=" + std::to_string(c.dq) + " bs=" + std::to_string(c.bs));
    auto be = make_cpu_backend();
    ModelSource src = open_model_source(fixtures() + "/models/qwen2");  // with q/k/v biases
    ModelPlanOptions po;
    po.method = Method::Qlora;
    po.base_precision = optional_base_precision(c.precision, "base_precision");
    po.double_quant = c.dq;
    po.quant_blocksize = c.bs;
    po.micro_batch = 2;
    po.seq_len = 9;
    po.checkpointing = parse_checkpointing(c.ckpt, "checkpointing");
    DecoderModel m(src.config, *be, po, fixture_lora());
    m.load_base(src.tensors);
    const auto planned = m.plan().bytes_by_category();
    const auto& alloc = m.arena().allocated();
    EXPECT_EQ(planned.size(), alloc.size());
    for (const auto& [cat, bytes] : planned) {
      ASSERT_TRUE(alloc.count(cat)) << mem_category_name(cat);
      EXPECT_EQ(alloc.at(cat), bytes) << mem_category_name(cat);
    }
    // Weights by hand: floats for embeddings, head, norms and biases; quantized projections.
    const LlamaConfig& cfg = m.config();
    QuantParams qp;
    qp.format = c.precision == "fp8" ? QuantFormat::FP8_E4M3 : *quant_format_from_name(c.precision);
    const bool bnb = c.precision == "nf4" || c.precision == "fp4";
    qp.blocksize = bnb ? int(c.bs) : 0;
    qp.double_quant = bnb && c.dq;
    const int64_t C = cfg.hidden_size;
    int64_t weights = 2 * MemoryPlan::aligned(cfg.vocab_size * C * 4) + MemoryPlan::aligned(C * 4);
    for (int64_t l = 0; l < cfg.n_layer; l++) {
      weights += 2 * MemoryPlan::aligned(C * 4);
      weights += MemoryPlan::aligned(cfg.q_dim() * 4) + 2 * MemoryPlan::aligned(cfg.kv_dim() * 4);  // biases
      for (const auto& t : all_linear_targets()) {
        const auto [out, in] = projection_shape(cfg, t);
        weights += MemoryPlan::aligned(quant_storage_bytes(qp, out, in));
      }
    }
    EXPECT_EQ(planned.at(MemCategory::Weights), weights);
  }
}

// `qlora plan --gpu cpu` plans the CPU engine exactly: f32 compute, the same buffers, one overhead
// line for the program itself (this process's resident memory), and the calibrated rates in the
// speed model.
TEST(PlanAllocation, CpuDevicePlanEqualsTheCpuEngine) {
  LoraSpec lora = fixture_lora();
  TestModel t = make_model("llama_gqa", lora, 2, 12, "none", 1024);
  PlanRequest r;
  r.model = t.model->config();
  r.gpu = resolve_gpu("cpu");
  ASSERT_TRUE(r.gpu.is_cpu);
  EXPECT_GT(r.gpu.bf16_tflops, 0);
  EXPECT_GT(r.gpu.attn_tflops, 0);
  EXPECT_GT(r.gpu.lora_tflops, 0);
  EXPECT_GT(r.gpu.ce_elems_per_s, 0);
  EXPECT_GT(r.gpu.dequant_elems_per_s, 0);
  r.method = Method::Lora;
  r.lora.r = lora.r;
  r.lora.targets = lora.targets;
  r.micro_batch = 2;
  r.seq_len = 12;
  r.ce_chunk = 1024;
  const PlanResult p = make_plan(r);
  EXPECT_EQ(p.req.base_precision, BasePrecision::Fp32);
  ASSERT_EQ(p.plan.overhead.size(), 1u);
  const int64_t program = p.plan.overhead[0].second;
  EXPECT_EQ(program, r.gpu.program_bytes);
  EXPECT_GT(program, 1 << 20);  // at least the code of this test binary
  EXPECT_LT(program, r.gpu.mem_bytes);
  EXPECT_EQ(p.plan.total_bytes() - program, t.model->plan().total_bytes());
  EXPECT_GT(p.speed.step_time_s, 0);
  // The speed model prices each part with its own calibrated rate.
  const double tok = 2.0 * 12.0;
  const FlopCounts& f = p.speed.per_token;
  EXPECT_NEAR(p.speed.t_attn, tok * (f.fwd.attn + f.bwd.attn) / (r.gpu.attn_tflops * 1e12), 1e-12);
}

// Full fine-tuning: the engine allocates what `qlora plan --method full --gpu cpu` plans, and per
// weight an fp32 gradient and AdamW m, v (the CPU's fp32 weights are their own master copy).
TEST(PlanAllocation, FullFineTuningAllocatesThePlan) {
  for (const std::string variant : {"llama_gqa", "qwen2", "llama_tied"}) {
    ModelPlanOptions po;
    po.micro_batch = 2;
    po.seq_len = 12;
    po.method = Method::Full;
    TestModel t = make_model_on(make_cpu_backend(), variant, po, LoraSpec{});
    const auto planned = t.model->plan().bytes_by_category();
    const auto& alloc = t.model->arena().allocated();
    for (const auto& [cat, bytes] : planned) {
      ASSERT_TRUE(alloc.count(cat)) << mem_category_name(cat);
      EXPECT_EQ(alloc.at(cat), bytes) << variant << " " << mem_category_name(cat);
    }
    EXPECT_EQ(planned.count(MemCategory::Lora), 0u) << variant;
    EXPECT_EQ(planned.at(MemCategory::Grads), planned.at(MemCategory::Weights)) << variant;
    EXPECT_EQ(planned.at(MemCategory::Optimizer), 2 * planned.at(MemCategory::Weights)) << variant;
    int64_t trained = 0;
    for (const auto& p : t.model->trainable_params()) trained += p.w.numel();
    EXPECT_EQ(trained, t.model->config().n_params()) << variant;
    PlanRequest r;
    r.model = t.model->config();
    r.gpu = resolve_gpu("cpu");
    r.method = Method::Full;
    r.micro_batch = 2;
    r.seq_len = 12;
    r.ce_chunk = po.ce_chunk;
    const PlanResult p = make_plan(r);
    EXPECT_EQ(p.plan.total_bytes() - p.plan.overhead[0].second, t.model->plan().total_bytes()) << variant;
  }
}
