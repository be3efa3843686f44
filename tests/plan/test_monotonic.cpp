// Monotonicity: longer sequences and bigger micro-batches never need less memory; more GPUs under
// ZeRO never need more per GPU. Swept over models, methods and checkpointing modes.
#include <gtest/gtest.h>

#include "plan/planner.h"

using namespace qlora;

namespace {

struct Case {
  const char* model;
  const char* method;
  const char* ckpt;
};

const Case kCases[] = {
    {"llama3-8b", "lora", "none"},    {"llama3-8b", "qlora", "full"},   {"llama3-70b", "qlora", "offload"},
    {"llama3-70b", "full", "full"},   {"smollm2-135m", "lora", "none"}, {"qwen2.5-7b", "qlora", "none"},
    {"llama3.2-1b", "full", "offload"},
};

PlanRequest request(const Case& c) {
  PlanRequest r;
  r.model = preset_config(c.model);
  r.model_label = c.model;
  r.gpu = resolve_gpu("h100");
  r.method = parse_method(c.method, "method");
  r.checkpointing = parse_checkpointing(c.ckpt, "checkpointing");
  return r;
}

std::string name(const Case& c) { return std::string(c.model) + "/" + c.method + "/" + c.ckpt; }

}  // namespace

TEST(PlanMonotonic, LongerSequencesNeverNeedLess) {
  for (const Case& c : kCases) {
    PlanRequest r = request(c);
    int64_t prev = 0, prev_act = 0;
    for (int64_t T : {1, 2, 100, 128, 129, 1000, 1023, 1024, 1025, 2048, 3000, 4096, 8192, 16384, 65536}) {
      r.seq_len = T;
      PlanResult p = make_plan(r);
      EXPECT_GE(p.total_bytes, prev) << name(c) << " T=" << T;
      EXPECT_GE(p.categories.at(MemCategory::Activations), prev_act) << name(c) << " T=" << T;
      prev = p.total_bytes;
      prev_act = p.categories.at(MemCategory::Activations);
    }
    // And it strictly grows over a real range: activations scale with tokens.
    r.seq_len = 1024;
    const int64_t a = make_plan(r).total_bytes;
    r.seq_len = 8192;
    EXPECT_GT(make_plan(r).total_bytes, a) << name(c);
  }
}

TEST(PlanMonotonic, BiggerMicroBatchNeverNeedsLess) {
  for (const Case& c : kCases) {
    PlanRequest r = request(c);
    int64_t prev = 0;
    for (int64_t b : {1, 2, 3, 4, 8, 16}) {
      r.micro_batch = b;
      PlanResult p = make_plan(r);
      EXPECT_GE(p.total_bytes, prev) << name(c) << " b=" << b;
      prev = p.total_bytes;
    }
  }
}

// From 2 GPUs on, ZeRO-1/2/3 per-GPU memory never grows with the world size. (From 1 to 2 it can
// for a tiny model: sharding adds NCCL buffers and gather slots that outweigh halving 135M params.)
TEST(PlanMonotonic, MoreGpusNeverNeedMorePerGpu) {
  for (const Case& c : kCases)
    for (Sharding s : {Sharding::Zero1, Sharding::Zero2, Sharding::Zero3}) {
      PlanRequest r = request(c);
      r.sharding = s;
      int64_t prev = INT64_MAX;
      for (Topology t : {Topology{2, 1}, Topology{4, 1}, Topology{8, 1}, Topology{8, 2}, Topology{8, 4}, Topology{8, 16}}) {
        r.topo = t;
        PlanResult p = make_plan(r);
        EXPECT_LE(p.total_bytes, prev) << name(c) << " " << sharding_name(s) << " world=" << t.world();
        prev = p.total_bytes;
      }
    }
  // For the big models it also holds from one GPU.
  for (const char* m : {"llama3-8b", "llama3-70b", "llama3.1-405b"}) {
    PlanRequest r = request({m, "qlora", "full"});
    const int64_t one = make_plan(r).total_bytes;
    r.sharding = Sharding::Zero3;
    r.topo = {2, 1};
    EXPECT_LT(make_plan(r).total_bytes, one) << m;
  }
}

// ZeRO stages split exactly the categories they name and leave activations alone.
TEST(PlanSharding, StagesSplitTheirCategories) {
  PlanRequest r = request({"llama3-8b", "full", "full"});
  const PlanResult one = make_plan(r);
  r.topo = {4, 1};
  auto cat = [](const PlanResult& p, MemCategory c) { return p.categories.at(c); };
  r.sharding = Sharding::None;
  const PlanResult ddp = make_plan(r);
  EXPECT_EQ(cat(ddp, MemCategory::Optimizer), cat(one, MemCategory::Optimizer));
  r.sharding = Sharding::Zero1;
  const PlanResult z1 = make_plan(r);
  EXPECT_NEAR(double(cat(z1, MemCategory::Optimizer)), cat(one, MemCategory::Optimizer) / 4.0, 256.0 * 3000);
  EXPECT_EQ(cat(z1, MemCategory::Grads), cat(one, MemCategory::Grads));
  r.sharding = Sharding::Zero2;
  const PlanResult z2 = make_plan(r);
  EXPECT_NEAR(double(cat(z2, MemCategory::Grads)), cat(one, MemCategory::Grads) / 4.0, 256.0 * 1000);
  EXPECT_EQ(cat(z2, MemCategory::Weights), cat(one, MemCategory::Weights));
  r.sharding = Sharding::Zero3;
  const PlanResult z3 = make_plan(r);
  EXPECT_NEAR(double(cat(z3, MemCategory::Weights)), cat(one, MemCategory::Weights) / 4.0, 256.0 * 1000);
  for (const PlanResult* p : {&ddp, &z1, &z2, &z3})
    EXPECT_EQ(cat(*p, MemCategory::Activations), cat(one, MemCategory::Activations));
  // Every sharded buffer is named as a shard; nothing else changes name.
  size_t shards = 0;
  for (const auto& b : z3.plan.buffers) shards += b.name.size() > 6 && b.name.ends_with(".shard");
  size_t params = 0;
  for (const auto& b : one.plan.buffers)
    params += b.category == MemCategory::Weights || b.category == MemCategory::Grads || b.category == MemCategory::Optimizer;
  EXPECT_EQ(shards, params);
}
