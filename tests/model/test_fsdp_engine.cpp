// sharding fsdp in one process: each decoder layer's frozen projections are one blob, split evenly
// in bytes over the ranks and all-gathered into two slots before use. With one shard the gather is
// a copy, so the engine must compute exactly what it computes on the whole base; the gathers follow
// the dequantization's schedule, which the planner counts; the plan splits each layer's blob exactly.
#include <gtest/gtest.h>

#include "core/comm.h"
#include "model_test_util.h"
#include "plan/gpu_catalog.h"
#include "plan/planner.h"
#include "train/step.h"

using namespace qlora;
using namespace qlora::testing_util;

namespace {

ModelPlanOptions opts(const std::string& precision, int64_t shards, const std::string& ckpt = "none",
                      const std::string& gemm = "bf16") {
  ModelPlanOptions po;
  po.method = parse_method(precision == "fp32" ? "lora" : "qlora", "method");
  po.base_precision = optional_base_precision(precision, "base_precision");
  po.double_quant = true;
  po.quant_blocksize = 64;
  po.micro_batch = 2;
  po.seq_len = 12;
  po.checkpointing = parse_checkpointing(ckpt, "checkpointing");
  po.base_shards = shards;
  po.gemm_dtype = parse_gemm_dtype(gemm, "gemm_dtype");
  return po;
}

struct FsdpRun {
  std::unique_ptr<Backend> be;
  std::unique_ptr<DecoderModel> model;
};

FsdpRun make_run(const LlamaConfig& cfg, const TensorSource& src, const ModelPlanOptions& po) {
  FsdpRun r;
  r.be = make_cpu_backend();
  r.model = std::make_unique<DecoderModel>(cfg, *r.be, po, fixture_lora());
  r.model->load_base(src);
  r.model->init_trainable(1);
  return r;
}

Batch fixture_batch() {
  SafetensorsArchive fx(fixtures() + "/qlora/llama_gqa_nf4.safetensors");
  return Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
}

std::vector<float> grads(DecoderModel& m) {
  std::vector<float> g;
  for (auto& p : m.trainable_params()) {
    std::vector<float> x(size_t(p.g.numel()));
    m.backend().copy_to_host(x.data(), p.g.data, x.size() * 4);
    g.insert(g.end(), x.begin(), x.end());
  }
  return g;
}

// The two-layer fixture stretched to `layers` layers (layer l reads the fixture's layer l % 2).
TensorSource folded(const TensorSource& base) {
  auto fold = [](std::string n) {
    const std::string pre = "model.layers.";
    if (n.rfind(pre, 0) == 0) {
      const size_t dot = n.find('.', pre.size());
      n = pre + std::to_string(std::stoi(n.substr(pre.size(), dot - pre.size())) % 2) + n.substr(dot);
    }
    return n;
  };
  TensorSource s = base;
  s.has = [base, fold](const std::string& n) { return base.has(fold(n)); };
  s.read_f32 = [base, fold](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    base.read_f32(fold(n), shape, dst);
  };
  return s;
}

}  // namespace

TEST(FsdpEngine, OneShardComputesExactlyWhatTheWholeBaseComputes) {
  const ModelSource src = open_model_source(fixtures() + "/models/llama_gqa");
  const Batch batch = fixture_batch();
  // fp8 with gemm_dtype fp8: the forward reads the gathered fp8 bytes as stored (no dequantization).
  const std::pair<std::string, std::string> kBases[] = {{"nf4", "bf16"}, {"fp4", "bf16"}, {"fp8", "bf16"},
                                                        {"fp8", "fp8"},  {"fp32", "bf16"}};
  for (const auto& [precision, gemm] : kBases)
    for (const std::string ckpt : {"none", "full"}) {
      SCOPED_TRACE(precision + " / gemm " + gemm + " / " + ckpt);
      FsdpRun whole = make_run(src.config, src.tensors, opts(precision, 0, ckpt, gemm));
      FsdpRun fsdp = make_run(src.config, src.tensors, opts(precision, 1, ckpt, gemm));
      ASSERT_TRUE(fsdp.model->base_sharded());
      EXPECT_FALSE(fsdp.model->arena().has("layers.0.q_proj"));  // the projections live in the layer's blob
      const LayerBaseBlob blob = layer_base_blob(src.config, opts(precision, 1));
      EXPECT_EQ(fsdp.model->base_shard_bytes(), blob.total * src.config.n_layer);
      for (int step = 0; step < 2; step++) {
        const StepResult a = accumulate_grads(*whole.model, {batch, batch}, step, 7);
        const StepResult b = accumulate_grads(*fsdp.model, {batch, batch}, step, 7);
        EXPECT_EQ(a.loss, b.loss) << "step " << step;
        EXPECT_GT(a.loss, 0.0);
        const std::vector<float> ga = grads(*whole.model), gb = grads(*fsdp.model);
        ASSERT_EQ(ga.size(), gb.size());
        size_t differ = 0, nonzero = 0;
        for (size_t i = 0; i < ga.size(); i++) {
          differ += ga[i] != gb[i];
          nonzero += ga[i] != 0.0f;
        }
        EXPECT_EQ(differ, 0u) << "step " << step;
        EXPECT_GT(nonzero, ga.size() / 4);
      }
      EXPECT_EQ(whole.model->forward_loss(batch), fsdp.model->forward_loss(batch));
      if (precision != "fp32") {
        for (const auto& proj : all_linear_targets())
          EXPECT_EQ(fsdp.model->base_quantized(1, proj).data, whole.model->base_quantized(1, proj).data) << proj;
      }
    }
}

// Layers are gathered where the dequantization needs them (two slots, the next layer ahead): every
// layer in the first forward, all but the last two in the backward, then 2L - 4 per micro-step,
// with or without checkpointing; the planner's "all-gather base layers" is that many blobs.
TEST(FsdpEngine, GathersPerMicroStepAreWhatThePlannerCounts) {
  const ModelSource src = open_model_source(fixtures() + "/models/llama_gqa");
  LlamaConfig deep = src.config;
  deep.n_layer = 6;
  const TensorSource deep_src = folded(src.tensors);
  const Batch batch = fixture_batch();
  for (const std::string precision : {"nf4", "fp32"})
    for (const char* ckpt : {"none", "full"}) {
      SCOPED_TRACE(precision + " / " + ckpt);
      FsdpRun t = make_run(deep, deep_src, opts(precision, 1, ckpt));
      const int64_t L = deep.n_layer, blob = layer_base_blob(deep, opts(precision, 1)).total;
      accumulate_grads(*t.model, {batch}, 0, 0);
      EXPECT_EQ(t.model->gathered_base_bytes(), (L + (L - 2)) * blob);
      const int64_t before = t.model->gathered_base_bytes();
      accumulate_grads(*t.model, {batch, batch, batch}, 1, 0);
      const int64_t per_step = t.model->gathered_base_bytes() - before;
      EXPECT_EQ(per_step, 3 * dequant_layers_per_micro_step(L) * blob);

      PlanRequest req;
      req.model = deep;
      req.gpu = resolve_gpu("h100-sxm");
      req.method = parse_method(precision == "fp32" ? "lora" : "qlora", "method");
      req.base_precision = optional_base_precision(precision == "fp32" ? "bf16" : precision, "base_precision");
      if (precision == "nf4") {
        req.double_quant = true;
        req.quant_blocksize = 64;
      }
      req.micro_batch = 2;
      req.seq_len = 12;
      req.grad_accum = 3;
      req.checkpointing = parse_checkpointing(ckpt, "checkpointing");
      req.sharding = Sharding::Fsdp;
      req.topo.gpus_per_node = 2;
      const PlanResult plan = make_plan(req);
      double planned = -1;
      for (const auto& [what, bytes] : plan.speed.comm_bytes)
        if (what == "all-gather base layers (per micro-step)") planned = bytes;
      // The GPU plan's blob holds the base in its GPU dtype (bf16 for a float base): the count of
      // gathers is the engine's, the bytes per gather the plan's own blob.
      const int64_t gpu_blob = layer_base_blob(deep, model_plan_options(plan.req)).total;
      EXPECT_EQ(planned, double(3 * dequant_layers_per_micro_step(L) * gpu_blob));
      if (precision == "nf4") {
        EXPECT_EQ(gpu_blob, blob);  // packed bytes do not depend on the device
      }
    }
}

// Each layer's blob is split exactly: rank r holds slice_of(blob, r, N) bytes, the shares add up to
// the blob and differ by at most one byte; the blob holds each projection's stored bytes.
TEST(FsdpPlan, EachLayersBlobIsSplitExactlyOverTheRanks) {
  const ModelSource src = open_model_source(fixtures() + "/models/llama_gqa");
  const LlamaConfig& c = src.config;
  for (const std::string precision : {"nf4", "fp8", "fp32"}) {
    SCOPED_TRACE(precision);
    MemoryPlan whole;
    plan_model_buffers(whole, c, opts(precision, 0));
    const LayerBaseBlob blob = layer_base_blob(c, opts(precision, 3));
    for (size_t p = 0; p < 7; p++) {
      EXPECT_EQ(blob.bytes[p], whole.find("layers.1." + all_linear_targets()[p])->bytes) << all_linear_targets()[p];
      EXPECT_EQ(blob.offset[p] % 256, 0);
    }
    for (int world : {2, 3, 7}) {
      int64_t sum = 0, lo = INT64_MAX, hi = 0;
      for (int r = 0; r < world; r++) {
        ModelPlanOptions o = opts(precision, world);
        o.base_shard_rank = r;
        MemoryPlan plan;
        plan_model_buffers(plan, c, o);
        ASSERT_EQ(plan.find("layers.0.q_proj"), nullptr);
        const int64_t share = plan.find("layers.1.base.shard")->bytes;
        EXPECT_EQ(share, int64_t(slice_of(size_t(blob.total), r, world).count)) << r << " of " << world;
        EXPECT_EQ(plan.find("fsdp.gather")->bytes, 2 * blob.total);
        sum += share;
        lo = std::min(lo, share);
        hi = std::max(hi, share);
      }
      EXPECT_EQ(sum, blob.total) << world;
      EXPECT_LE(hi - lo, 1) << world;
    }
  }
}

TEST(FsdpPlan, PerRankBytesAndFullFineTuningIsAConfigError) {
  PlanRequest req;
  req.model = open_model_source(fixtures() + "/models/llama_gqa").config;
  req.gpu = resolve_gpu("cpu");
  req.method = Method::Qlora;
  req.base_precision = BasePrecision::Nf4;
  req.micro_batch = 1;
  req.seq_len = 8;
  req.sharding = Sharding::Fsdp;
  req.topo.gpus_per_node = 3;
  const PlanResult p = make_plan(req);
  ASSERT_EQ(p.per_rank_bytes.size(), 3u);
  int64_t buffers = 0;
  for (const auto& [cat, bytes] : p.categories)
    if (cat != MemCategory::Overhead) buffers += bytes;
  EXPECT_EQ(p.per_rank_bytes.back(), buffers);  // the table is the last rank's, the largest share
  for (int64_t b : p.per_rank_bytes) EXPECT_LE(b, buffers);
  EXPECT_NE(p.plan.find("layers.0.base.shard"), nullptr);
  EXPECT_NE(p.plan.find("layers.0.q_proj.lora_A.adam_m.shard"), nullptr);  // fsdp implies ZeRO-1's moments
  req.method = Method::Full;
  req.base_precision = BasePrecision::Bf16;
  try {
    make_plan(req);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("--sharding fsdp: shards the frozen base of LoRA/QLoRA; full fine-tuning "
                                         "trains the base"),
              std::string::npos)
        << e.what();
  }
}
