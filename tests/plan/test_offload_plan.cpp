// gradient_checkpointing: offload in `qlora plan`: the plan moves all but two layer inputs to pinned
// host memory (the engine's schedule, DecoderModel::forward_backward), the speed model prices each
// input's copy against the layer it runs beside, and --fit reports what offload buys in context.
#include <gtest/gtest.h>

#include "model/backend_plan.h"
#include "plan/fit.h"
#include "plan/report.h"

using namespace qlora;

namespace {

PlanRequest request(const std::string& model, const std::string& gpu, const std::string& ckpt, int64_t seq) {
  PlanRequest r;
  r.model = preset_config(model);
  r.model_label = model;
  r.gpu = resolve_gpu(gpu);
  r.method = Method::Qlora;
  r.base_precision = BasePrecision::Nf4;
  r.checkpointing = parse_checkpointing(ckpt, "checkpointing");
  r.seq_len = seq;
  return r;
}

int64_t offloaded_bytes(const MemoryPlan& p) {
  int64_t t = 0;
  for (const auto& b : p.buffers)
    if (b.host && !is_backend_buffer(b)) t += MemoryPlan::aligned(b.bytes);
  return t;
}

}  // namespace

TEST(OffloadPlan, AllButTwoLayerInputsMoveToPinnedHostMemory) {
  const PlanResult full = make_plan(request("llama3-8b", "h100-sxm", "full", 8192));
  const PlanResult off = make_plan(request("llama3-8b", "h100-sxm", "offload", 8192));
  const LlamaConfig& c = full.req.model;
  const int64_t x = MemoryPlan::aligned(8192 * c.hidden_size * 2);  // one bf16 (N,C) layer input
  EXPECT_EQ(offloaded_bytes(off.plan), (c.n_layer - 2) * x);
  EXPECT_EQ(offloaded_bytes(full.plan), 0);
  EXPECT_EQ(off.host_bytes - full.host_bytes, (c.n_layer - 2) * x);
  EXPECT_LT(off.total_bytes, full.total_bytes);
  EXPECT_EQ(full.plan.bytes_by_category().at(MemCategory::Activations) -
                off.plan.bytes_by_category().at(MemCategory::Activations),
            (c.n_layer - 2) * x);
}

// Each offloaded input crosses PCIe once each way per micro-step; a copy hides under the layer
// beside it, so only its excess over that layer's compute (x the overlap assumption) is exposed.
TEST(OffloadPlan, CopiesAreExposedOnlyBeyondTheLayerBesideThem) {
  PlanRequest r = request("llama3-8b", "h100-sxm", "offload", 8192);
  const PlanResult p = make_plan(r);
  const LlamaConfig& c = p.req.model;
  const PlanAssumptions& a = plan_assumptions();
  const double copy = double(8192 * c.hidden_size * 2) / (r.gpu.host_bw * a.comm_efficiency);
  EXPECT_NEAR(p.speed.t_offload, 2.0 * double(c.n_layer - 2) * copy, 1e-9);
  EXPECT_EQ(p.speed.t_offload_exposed, 0.0) << "a 64 MiB copy hides under an 8B layer of 8192 tokens on an H100";
  // A slow link: every copy outlasts its layer, and the excess is exactly what is exposed.
  r.gpu.host_bw = 1e9;
  const PlanResult slow = make_plan(r);
  const FlopCounts& f = slow.speed.per_token;
  const double t_compute = slow.speed.t_gemm + slow.speed.t_attn + slow.speed.t_memory + slow.speed.t_dequant_exposed;
  const double per_layer = t_compute / double(c.n_layer) / f.total();
  const double t_fwd = per_layer * (f.fwd.base + f.fwd.lora + f.fwd.attn);
  const double t_bwd = per_layer * (f.bwd.base + f.bwd.lora + f.bwd.attn + f.recompute.base + f.recompute.lora + f.recompute.attn);
  const double slow_copy = double(8192 * c.hidden_size * 2) / (1e9 * a.comm_efficiency);
  ASSERT_GT(slow_copy, t_bwd);
  const double want = double(c.n_layer - 2) * (2 * slow_copy - a.offload_overlap * (t_fwd + t_bwd));
  EXPECT_NEAR(slow.speed.t_offload_exposed, want, 1e-9 * want);
  EXPECT_NEAR(slow.speed.step_time_s, t_compute + slow.speed.t_comm_exposed + want, 1e-9 * want);
}

// Offload reaches longer contexts than full checkpointing on one GPU, --fit reports each mode's
// longest sequence, and a request too long for full checkpointing is told to offload.
TEST(OffloadPlan, FitReportsTheLongestContextPerCheckpointingAndSuggestsOffload) {
  const PlanRequest r = request("llama3-8b", "h100-sxm", "none", 2048);
  const FitReport f = fit_search(r);
  ASSERT_EQ(f.max_seq_len_by_checkpointing.size(), 3u);
  EXPECT_EQ(f.max_seq_len_by_checkpointing[0].first, Checkpointing::None);
  EXPECT_EQ(f.max_seq_len_by_checkpointing[0].second, f.max_seq_len);
  const int64_t full = f.max_seq_len_by_checkpointing[1].second, off = f.max_seq_len_by_checkpointing[2].second;
  EXPECT_GT(full, f.max_seq_len);
  EXPECT_GT(off, full);
  EXPECT_NE(fit_text(f, r).find("offload " + std::to_string(off)), std::string::npos) << fit_text(f, r);
  EXPECT_EQ(fit_json(f)["max_seq_len_by_checkpointing"]["offload"].get<int64_t>(), off);
  // A context between the two: full does not fit, offload does, and the fixes say so.
  const PlanRequest longer = request("llama3-8b", "h100-sxm", "full", (full + off) / 2 / 128 * 128);
  EXPECT_FALSE(make_plan(longer).fits);
  PlanRequest o = longer;
  o.checkpointing = Checkpointing::Offload;
  EXPECT_TRUE(make_plan(o).fits);
  bool suggested = false;
  for (const auto& s : suggest_fixes(longer)) suggested |= s.rfind("--checkpointing offload:", 0) == 0;
  EXPECT_TRUE(suggested);
}
