// On the CUDA backend the memory plan equals the device allocation, the backend's scratch
// included: the harness counts every cudaMalloc (emu::device_bytes_in_use / _peak) and
// cudaMallocHost (emu::pinned_bytes_in_use).
//
// Alignment rule: the plan counts every buffer rounded up to 256 bytes (MemoryPlan::aligned), and
// that is exactly what the engine asks cudaMalloc for: the Arena one block per category, the sum
// of its buffers' rounded sizes (op scratch included), the backend its cuBLASLt workspace (32 MiB)
// and one 256-byte granule for the error record. So the harness's byte count equals
// MemoryPlan::total_bytes() with no slack, and its pinned count equals MemoryPlan::host_bytes().
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_emu/emu_runtime.h"
#include "backend/cuda_scratch.h"
#include "io/safetensors.h"
#include "model/backend_plan.h"
#include "model/decoder_model.h"
#include "plan/planner.h"
#include "train/model_source.h"
#include "train/step.h"
#include "model_test_util.h"

namespace qlora {
namespace {

using testing_util::fixtures;
using testing_util::ints;

struct Case {
  std::string method, precision, ckpt;
  bool label_subset;  // SFT labels (the LM head runs on the labeled rows) or every position labeled
  int64_t mlp_tile = 0;  // the MLP over tiles of this many rows (checkpointing only)
  AttnDq attn_dq = AttnDq::Accumulate;
};

ModelPlanOptions plan_options(const Case& c) {
  ModelPlanOptions po;
  po.method = parse_method(c.method, "method");
  po.base_precision = optional_base_precision(c.precision, "base_precision");
  po.double_quant = true;
  po.quant_blocksize = 64;
  po.micro_batch = 2;
  po.seq_len = 12;
  po.checkpointing = parse_checkpointing(c.ckpt, "checkpointing");
  po.ce_chunk = 8;  // several chunks per step, the last one partial
  po.mlp_tile = c.mlp_tile;
  po.attn_dq = c.attn_dq;
  return po;
}

std::string name(const Case& c) {
  return c.method + "/" + (c.precision.empty() ? "bf16" : c.precision) + " ckpt=" + c.ckpt +
         (c.label_subset ? " label subset" : " all labeled") + (c.mlp_tile ? " mlp tile " + std::to_string(c.mlp_tile) : "") +
         (c.attn_dq == AttnDq::Recompute ? " dq recomputed" : "");
}

// Builds the model on a fresh CUDA backend, trains a few steps, and checks the harness's counts
// against the model's plan at each point.
void check_allocation_equals_plan(const Case& c) {
  SCOPED_TRACE(name(c));
  const size_t base = emu::device_bytes_in_use(), pinned_base = emu::pinned_bytes_in_use();
  emu::reset_device_peak();
  std::string why;
  std::unique_ptr<Backend> be = make_cuda_backend(&why);
  ASSERT_TRUE(be) << why;
  ModelSource src = open_model_source(fixtures() + "/models/llama_gqa");
  auto model = std::make_unique<DecoderModel>(src.config, *be, plan_options(c), testing_util::fixture_lora());
  model->load_base(src.tensors);
  model->init_trainable(1);
  const MemoryPlan& plan = model->plan();

  // The plan holds the backend's buffers, each op scratch slot bound (none grown by the backend).
  for (const char* n : {"cuda.lt_workspace", "cuda.error_record", "cuda.upload_staging.0", "cuda.upload_staging.1",
                        "cuda.matmul_cvt_a", "cuda.matmul_cvt_b", "cuda.attn_dq_acc", "cuda.attn_delta",
                        "cuda.reduce_partials"})
    EXPECT_TRUE(plan.find(n)) << n;
  EXPECT_GT(plan.find("cuda.matmul_cvt_b")->bytes, 0);
  EXPECT_GT(plan.find("cuda.reduce_partials")->bytes, 0);
  const int64_t planned = plan.total_bytes();
  EXPECT_EQ(int64_t(emu::device_bytes_in_use() - base), planned) << "after building the model";
  EXPECT_EQ(int64_t(emu::device_bytes_peak() - base), planned) << "a transient allocation while building";

  SafetensorsArchive fx(fixtures() + "/qlora/llama_gqa_nf4.safetensors");
  Batch batch = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
  if (!c.label_subset)  // every position carries a target: the head runs on all rows
    for (size_t i = 0; i < batch.targets.size(); i++)
      batch.targets[i] = batch.tokens[(i + 1) % batch.tokens.size()];
  size_t labeled = 0;
  for (int32_t t : batch.targets) labeled += t != -100;
  if (c.label_subset) {
    ASSERT_LT(labeled, batch.targets.size());
    ASSERT_GT(labeled, 0u);
  } else {
    ASSERT_EQ(labeled, batch.targets.size());
  }

  OptimHyper h;
  for (int s = 0; s < 3; s++) {
    const StepResult r = train_step(*model, {batch}, h, 5e-3, s, 0);
    ASSERT_TRUE(std::isfinite(r.loss)) << "step " << s;
  }
  // The trainer's other reductions (the largest sumsq the plan sizes the partials for).
  EXPECT_TRUE(optimizer_state_finite(*model));
  EXPECT_EQ(first_non_finite(*model, 1.0), "");
  EXPECT_TRUE(std::isfinite(model->forward_loss(batch)));
  be->synchronize();
  EXPECT_EQ(int64_t(emu::device_bytes_in_use() - base), planned) << "after the steps";
  EXPECT_EQ(int64_t(emu::device_bytes_peak() - base), planned) << "the steps allocated beyond the plan";
  EXPECT_EQ(int64_t(emu::pinned_bytes_in_use() - pinned_base), plan.host_bytes()) << "pinned upload staging";
  // What the backend allocated itself is exactly its planned part.
  int64_t own = 0;
  for (const auto& b : plan.buffers)
    if (b.owner == BufferOwner::Backend && !b.host) own += MemoryPlan::aligned(b.bytes);
  EXPECT_EQ(int64_t(cuda_scratch_bytes(*be)), own);

  model.reset();
  be.reset();
  EXPECT_EQ(emu::device_bytes_in_use(), base) << "memory left behind";
  EXPECT_EQ(emu::pinned_bytes_in_use(), pinned_base) << "pinned memory left behind";
}

TEST(CudaEmuMemoryPlan, LoraBf16AllocationEqualsThePlan) {
  for (const char* ckpt : {"none", "full"})
    for (bool subset : {true, false}) check_allocation_equals_plan({"lora", "", ckpt, subset});
}

TEST(CudaEmuMemoryPlan, QloraNf4AllocationEqualsThePlan) {
  for (const char* ckpt : {"none", "full"})
    for (bool subset : {true, false}) check_allocation_equals_plan({"qlora", "nf4", ckpt, subset});
}

// The MLP over tiles of 7 rows (7, 7, 7, 3 of 24 tokens), the buffers one tile long: the steps stay
// inside the plan.
TEST(CudaEmuMemoryPlan, TiledMlpAllocationEqualsThePlan) {
  for (const char* ckpt : {"full", "offload"})
    check_allocation_equals_plan({"qlora", "nf4", ckpt, true, 7});
}

// dq in its own pass: no accumulator is planned (an empty slot), and the steps need none.
TEST(CudaEmuMemoryPlan, RecomputedAttentionDqAllocationEqualsThePlan) {
  for (const char* ckpt : {"none", "full"}) check_allocation_equals_plan({"qlora", "nf4", ckpt, true, 0, AttnDq::Recompute});
  ModelPlanOptions a = plan_options({"qlora", "nf4", "full", true}), r = a;
  r.attn_dq = AttnDq::Recompute;
  const LlamaConfig c = open_model_source(fixtures() + "/models/llama_gqa").config;
  MemoryPlan pa, pr;
  plan_engine_buffers(pa, c, a, DeviceKind::Cuda);
  plan_engine_buffers(pr, c, r, DeviceKind::Cuda);
  EXPECT_GT(pa.find("cuda.attn_dq_acc")->bytes, 0);
  EXPECT_EQ(pr.find("cuda.attn_dq_acc")->bytes, 0);
  EXPECT_LT(pr.total_bytes(), pa.total_bytes());
}

// `qlora plan --gpu h100-sxm` plans the CUDA engine exactly: its buffer list (the backend's own
// memory included) is the one the model allocates from, buffer by buffer.
TEST(CudaEmuMemoryPlan, PlannerEqualsTheCudaEngine) {
  for (const Case& c : {Case{"lora", "", "none", true}, Case{"qlora", "nf4", "full", true}}) {
    SCOPED_TRACE(name(c));
    std::string why;
    std::unique_ptr<Backend> be = make_cuda_backend(&why);
    ASSERT_TRUE(be) << why;
    ModelSource src = open_model_source(fixtures() + "/models/llama_gqa");
    const ModelPlanOptions po = plan_options(c);
    DecoderModel model(src.config, *be, po, testing_util::fixture_lora());
    PlanRequest r;
    r.model = src.config;
    r.gpu = resolve_gpu("h100-sxm");
    r.method = parse_method(c.method, "method");
    r.base_precision = optional_base_precision(c.precision.empty() ? "bf16" : c.precision, "base_precision");
    if (!c.precision.empty()) r.double_quant = po.double_quant;  // a bnb format's option only
    r.quant_blocksize = po.quant_blocksize;
    r.lora.r = testing_util::fixture_lora().r;
    r.lora.targets = testing_util::fixture_lora().targets;
    r.micro_batch = po.micro_batch;
    r.seq_len = po.seq_len;
    r.checkpointing = po.checkpointing;
    r.ce_chunk = po.ce_chunk;
    const PlanResult p = make_plan(r);
    const MemoryPlan& engine = model.plan();
    ASSERT_EQ(p.plan.buffers.size(), engine.buffers.size());
    for (size_t i = 0; i < engine.buffers.size(); i++) {
      EXPECT_EQ(p.plan.buffers[i].name, engine.buffers[i].name) << i;
      EXPECT_EQ(p.plan.buffers[i].bytes, engine.buffers[i].bytes) << engine.buffers[i].name;
      EXPECT_EQ(p.plan.buffers[i].host, engine.buffers[i].host) << engine.buffers[i].name;
      EXPECT_EQ(p.plan.buffers[i].owner, engine.buffers[i].owner) << engine.buffers[i].name;
    }
    // The planner's device total is the engine's plan plus only the estimated overhead lines.
    int64_t overhead = 0;
    for (const auto& [n, b] : p.plan.overhead) overhead += b;
    EXPECT_EQ(p.total_bytes - overhead, engine.total_bytes());
    EXPECT_EQ(p.host_bytes, engine.host_bytes());
  }
}

// A bound slot never grows: an op that needs more than the plan gave is an Internal error naming
// the op, the slot and both sizes. Unbound (no model), the slot grows as op tests need.
TEST(CudaEmuMemoryPlan, AnOpNeedingMoreScratchThanPlannedIsAnInternalError) {
  std::string why;
  std::unique_ptr<Backend> be = make_cuda_backend(&why);
  ASSERT_TRUE(be) << why;
  const int64_t m = 4, n = 8, k = 16;  // B (k,n) f32: 256 bytes as bf16
  void* a = be->alloc(size_t(m * k * 2));
  void* b = be->alloc(size_t(k * n * 4));
  void* c = be->alloc(size_t(m * n * 4));
  void* slot = be->alloc(1024);
  const MatmulArgs mm{Tensor(c, DType::F32, {m, n}), Tensor(a, DType::BF16, {m, k}), Tensor(b, DType::F32, {k, n}),
                      m, n, k, false, false, 1.0f, 0.0f};
  be->bind_scratch("cuda.matmul_cvt_b", slot, 255);
  try {
    be->matmul(mm);
    ADD_FAILURE() << "a matmul needing 256 bytes ran in a 255-byte slot";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    const std::string msg = e.where() + " " + e.message();
    for (const char* part : {"matmul", "cuda.matmul_cvt_b", "256", "255"})
      EXPECT_NE(msg.find(part), std::string::npos) << part << " in: " << msg;
  }
  be->bind_scratch("cuda.matmul_cvt_b", slot, 256);  // exactly enough
  EXPECT_NO_THROW(be->matmul(mm));
  const size_t before = emu::device_bytes_in_use();
  be->unbind_scratch();
  EXPECT_NO_THROW(be->matmul(mm));  // no plan: the slot grows (2 MiB steps)
  EXPECT_EQ(emu::device_bytes_in_use() - before, size_t(2) << 20);
  try {
    be->bind_scratch("cuda.no_such_slot", slot, 16);
    ADD_FAILURE() << "an unknown slot name was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    EXPECT_NE(e.message().find("cuda.no_such_slot"), std::string::npos) << e.message();
  }
  for (void* p : {a, b, c, slot}) be->free(p);
  // The CPU backend has no scratch: a plan handing it some is a bug.
  EXPECT_THROW(make_cpu_backend()->bind_scratch("cuda.matmul_cvt_a", nullptr, 0), Error);
}

}  // namespace
}  // namespace qlora
