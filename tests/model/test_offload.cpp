// gradient_checkpointing: offload on the CPU backend. The model runs the GPU's code path (host
// buffers from alloc_host, offload_copy out in the forward and back a layer ahead in the backward,
// offload_wait before a slot is reused or read), so it must compute exactly what `full`
// checkpointing computes; the arena allocates the plan's host buffers apart from the device ones.
#include <gtest/gtest.h>

#include <cstring>

#include "forwarding_backend.h"
#include "model_test_util.h"
#include "tasks/bench_run.h"
#include "train/step.h"

namespace qlora {
namespace {

using testing_util::fixtures;
using testing_util::host_copy;

// Counts the offload copies (by direction, and their bytes) and waits the model issues.
class CountingCpu : public testing_util::ForwardingCpu {
 public:
  int to_host = 0, to_device = 0, waits = 0;
  int64_t bytes = 0;
  void offload_copy(const OffloadCopyArgs& a) override {
    (a.to_host ? to_host : to_device)++;
    bytes += a.bytes;
    cpu_->offload_copy(a);
  }
  void offload_wait(const OffloadWaitArgs& a) override {
    waits++;
    cpu_->offload_wait(a);
  }
};

// llama_gqa's shape with 5 layers and seeded random weights: three layer inputs go to the host.
constexpr int64_t kLayers = 5;
LlamaConfig with_layers(int64_t n_layer) {
  LlamaConfig c = open_model_source(fixtures() + "/models/llama_gqa").config;
  c.n_layer = n_layer;
  return c;
}

std::unique_ptr<DecoderModel> build(Backend& be, const std::string& ckpt, int64_t n_layer = kLayers) {
  ModelPlanOptions po;
  po.micro_batch = 2;
  po.seq_len = 12;
  po.checkpointing = parse_checkpointing(ckpt, "checkpointing");
  po.ce_chunk = 8;
  LoraSpec lora = testing_util::fixture_lora();
  lora.dropout = 0.1;  // the recompute regenerates the masks: offload must too
  auto m = std::make_unique<DecoderModel>(with_layers(n_layer), be, po, lora);
  m->load_base(random_tensor_source(7));
  m->init_trainable(1);
  return m;
}

// Three AdamW steps of two micro-batches each: the losses, gradient norms and every adapter
// weight and moment are bit-identical to full checkpointing.
TEST(ActivationOffload, CpuStepsEqualFullCheckpointingExactly) {
  auto be_full = make_cpu_backend(), be_off = make_cpu_backend();
  auto full = build(*be_full, "full"), off = build(*be_off, "offload");
  const auto mbs = testing_util::small_micro_batches(full->config().vocab_size);
  OptimHyper h;
  for (int s = 0; s < 3; s++) {
    const StepResult rf = train_step(*full, mbs, h, 1e-2, s, 5);
    const StepResult ro = train_step(*off, mbs, h, 1e-2, s, 5);
    ASSERT_TRUE(std::isfinite(rf.loss)) << "step " << s;
    EXPECT_EQ(ro.loss, rf.loss) << "step " << s;
    EXPECT_EQ(ro.grad_norm, rf.grad_norm) << "step " << s;
  }
  auto& pf = full->trainable_params();
  auto& po = off->trainable_params();
  ASSERT_EQ(pf.size(), po.size());
  for (size_t i = 0; i < pf.size(); i++)
    for (auto member : {&TrainParam::w, &TrainParam::m, &TrainParam::v}) {
      const auto a = host_copy(*full, pf[i].*member), b = host_copy(*off, po[i].*member);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << pf[i].name;
    }
  EXPECT_EQ(off->forward_loss(mbs[0]), full->forward_loss(mbs[0]));
  EXPECT_TRUE(off->logits(mbs[1]) == full->logits(mbs[1])) << "the eval forward through the two slots";
}

// The schedule: per micro-batch each of layers 0 .. L-3 sends its input to the host once and gets
// it back once (the last two inputs stay in the slots); an eval forward copies nothing.
TEST(ActivationOffload, EachOffloadedLayerInputCrossesOnceEachWay) {
  CountingCpu be;
  auto m = build(be, "offload");
  const auto mbs = testing_util::small_micro_batches(m->config().vocab_size);
  accumulate_grads(*m, mbs, 0, 5);
  const int64_t per_layer = 2 * 12 * m->config().hidden_size * 4;  // N x C f32
  EXPECT_EQ(be.to_host, 2 * (kLayers - 2));
  EXPECT_EQ(be.to_device, 2 * (kLayers - 2));
  EXPECT_EQ(be.bytes, 4 * (kLayers - 2) * per_layer);
  EXPECT_EQ(be.waits, 2 * 2 * kLayers);  // one per layer in the forward and one in the backward
  const int copies = be.to_host + be.to_device;
  m->forward_loss(mbs[0]);
  EXPECT_EQ(be.to_host + be.to_device, copies) << "an eval forward offloads nothing";
  // full checkpointing issues no offload op at all
  CountingCpu be_full;
  auto f = build(be_full, "full");
  accumulate_grads(*f, mbs, 0, 5);
  EXPECT_EQ(be_full.to_host + be_full.to_device + be_full.waits, 0);
}

// The plan's host buffers are the offloaded layer inputs; the arena allocates them with
// alloc_host, and its device blocks hold exactly the plan's device bytes, category by category.
TEST(ActivationOffload, ArenaAllocatesThePlansHostBuffersOnTheHost) {
  auto be = make_cpu_backend();
  auto m = build(*be, "offload");
  const MemoryPlan& plan = m->plan();
  const int64_t per_layer = MemoryPlan::aligned(2 * 12 * m->config().hidden_size * 4);
  for (int64_t l = 0; l < kLayers; l++) {
    const PlannedBuffer* b = plan.find("act.layers." + std::to_string(l) + ".x");
    if (l < kLayers - 2) {
      ASSERT_TRUE(b) << l;
      EXPECT_TRUE(b->host) << l;
    } else {
      EXPECT_FALSE(b) << "layer " << l << "'s input never leaves its slot";
    }
  }
  for (const char* s : {"act.offload_slot.0", "act.offload_slot.1"}) {
    ASSERT_TRUE(plan.find(s)) << s;
    EXPECT_FALSE(plan.find(s)->host) << s;
  }
  EXPECT_EQ(plan.host_bytes(), (kLayers - 2) * per_layer);
  EXPECT_EQ(m->arena().host_allocated(), plan.host_bytes());
  const auto planned = plan.bytes_by_category();
  const auto& alloc = m->arena().allocated();
  EXPECT_EQ(planned.size(), alloc.size());
  for (const auto& [cat, bytes] : planned) {
    ASSERT_TRUE(alloc.count(cat)) << mem_category_name(cat);
    EXPECT_EQ(alloc.at(cat), bytes) << mem_category_name(cat);
  }
  // Against full checkpointing: the L layer inputs leave the device, two slots take their place.
  auto f = build(*be, "full");
  EXPECT_EQ(f->plan().bytes_by_category().at(MemCategory::Activations) - planned.at(MemCategory::Activations),
            (kLayers - 2) * per_layer);
  EXPECT_EQ(f->plan().host_bytes(), 0);
  EXPECT_EQ(f->arena().host_allocated(), 0);
}

// One or two layers: both inputs stay in the slots, nothing is planned on the host or copied, and
// the steps still equal full checkpointing.
TEST(ActivationOffload, OneOrTwoLayersOffloadNothing) {
  for (int64_t layers : {1, 2}) {
    SCOPED_TRACE(layers);
    CountingCpu be;
    auto be_full = make_cpu_backend();
    auto off = build(be, "offload", layers), full = build(*be_full, "full", layers);
    EXPECT_EQ(off->plan().host_bytes(), 0);
    EXPECT_EQ(off->arena().host_allocated(), 0);
    const auto mbs = testing_util::small_micro_batches(off->config().vocab_size);
    OptimHyper h;
    for (int s = 0; s < 2; s++) {
      const StepResult ro = train_step(*off, mbs, h, 1e-2, s, 5), rf = train_step(*full, mbs, h, 1e-2, s, 5);
      EXPECT_EQ(ro.loss, rf.loss) << "step " << s;
    }
    EXPECT_EQ(be.to_host + be.to_device, 0);
    auto& pf = full->trainable_params();
    auto& po = off->trainable_params();
    for (size_t i = 0; i < pf.size(); i++) {
      const auto a = host_copy(*full, pf[i].w), b = host_copy(*off, po[i].w);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << pf[i].name;
    }
  }
}

}  // namespace
}  // namespace qlora
