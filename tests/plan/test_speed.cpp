// Speed model: compute, memory and communication terms against hand arithmetic; directions of change.
#include <gtest/gtest.h>

#include <algorithm>

#include "model/model_plan.h"
#include "model/quant_bytes.h"
#include "plan/planner.h"

using namespace qlora;

namespace {

PlanRequest request(const std::string& model, const std::string& gpu, const std::string& method) {
  PlanRequest r;
  r.model = preset_config(model);
  r.model_label = model;
  r.gpu = resolve_gpu(gpu);
  r.method = parse_method(method, "method");
  return r;
}

}  // namespace

// 8B LoRA, bf16 base, one H100, 1 x 2048 tokens: GEMM time = tokens x GEMM FLOPs / (989.4 T x 80%).
TEST(Speed, ComputeTermsByHand) {
  PlanRequest r = request("llama3-8b", "h100", "lora");
  PlanResult p = make_plan(r);
  const SpeedEstimate& s = p.speed;
  // Per token (perf_anchors §10): fwd 2 N_lin + 2 N_head + 2 r P_L, bwd 2 N_lin + 2 N_head + 4 r P_L,
  // with N_lin = 6,979,321,856, N_head = 525,336,576, P_L = 2,621,440, r = 16.
  const double n_lin = 6979321856.0, n_head = 525336576.0, p_l = 2621440.0;
  const double gemm_per_token = 4 * n_lin + 4 * n_head + 6 * 16 * p_l;
  const double attn_per_token = 3.5 * 4 * 4096 * 2049.0 / 2 * 32;  // fwd A + bwd 2.5 A
  const PlanAssumptions& a = plan_assumptions();
  EXPECT_NEAR(s.t_gemm, 2048 * gemm_per_token / (989.4e12 * a.gemm_efficiency), 1e-9);
  EXPECT_NEAR(s.t_attn, 2048 * attn_per_token / (989.4e12 * a.attention_efficiency), 1e-9);
  EXPECT_NEAR(s.flops_per_step, 2048 * (gemm_per_token + attn_per_token), 1e3);
  // No dequant for a bf16 base; elementwise traffic: 2 bytes x (10 C + 2 q + 2 kv + 3 F) per token
  // per layer, 3 passes: 2 x 94,208 x 32 x 3 x 2048 tokens.
  EXPECT_EQ(s.memory_bytes[0].second, 0.0);
  EXPECT_DOUBLE_EQ(s.memory_bytes[1].second, 2.0 * 94208 * 32 * 3 * 2048);
  EXPECT_DOUBLE_EQ(s.memory_bytes[2].second, 3.0 * 4 * 128256 * 2048);  // chunked CE logits
  // One GPU: no communication; step = compute + memory.
  EXPECT_EQ(s.t_comm, 0.0);
  EXPECT_NEAR(s.step_time_s, s.t_gemm + s.t_attn + s.t_memory, 1e-12);
  EXPECT_NEAR(s.tokens_per_second, 2048 / s.step_time_s, 1e-6);
  // Sanity against the physical bound (24.6K tok/s at 790 TFLOP/s): below it, above 40% of it.
  EXPECT_LT(s.tokens_per_second, 24573);
  EXPECT_GT(s.tokens_per_second, 0.4 * 24573);
}

// QLoRA adds dequantization traffic: per layer dequantized, read its NF4 bytes and write bf16
// (2 B/param). The engine keeps two dequantized layers (the one in use, the next prepared ahead):
// 2L - 4 layers per micro-step, with or without recompute (a layer's recompute and gradients share
// one), i.e. 60/32 of the base for Llama-3-8B's 32 layers.
TEST(Speed, DequantTraffic) {
  PlanRequest r = request("llama3-8b", "h100", "qlora");
  r.checkpointing = Checkpointing::Full;
  PlanResult p = make_plan(r);
  double nf4_bytes = 0;
  for (const auto& b : p.replica.buffers)
    if (b.category == MemCategory::Weights && b.dtype == DType::U8) nf4_bytes += double(b.bytes);
  const double n_lin = 6979321856.0;
  // 4-bit codes + a uint8 absmax per 64 + an fp32 nested absmax per 256 blocks = 0.5159 B/param.
  EXPECT_NEAR(nf4_bytes / n_lin, 0.5 + 1.0 / 64 + 4.0 / (64 * 256), 1e-4);
  EXPECT_NEAR(p.speed.memory_bytes[0].second, 60.0 / 32.0 * (nf4_bytes + 2 * n_lin), 1.0);
  // Timed on a side stream beside the base GEMMs: hidden up to 90% of their time. At 2048 tokens
  // the GEMMs hide it; at 64 tokens they are too short and the rest is exposed in the step.
  const PlanAssumptions& a = plan_assumptions();
  const double t_dq = p.speed.memory_bytes[0].second / (p.req.gpu.mem_bw * a.memory_bw_efficiency);
  EXPECT_NEAR(p.speed.t_dequant, t_dq, 1e-12);
  EXPECT_EQ(p.speed.t_dequant_exposed, 0.0);
  PlanRequest small = r;
  small.seq_len = 64;
  const SpeedEstimate s64 = make_plan(small).speed;
  const double base_gemm = 64.0 * (s64.per_token.fwd.base + s64.per_token.bwd.base + s64.per_token.recompute.base) /
                           (p.req.gpu.bf16_tflops * 1e12 * a.gemm_efficiency);
  EXPECT_GT(s64.t_dequant_exposed, 0.0);
  EXPECT_NEAR(s64.t_dequant_exposed, s64.t_dequant - a.dequant_overlap * base_gemm, 1e-9);
  EXPECT_NEAR(s64.step_time_s, s64.t_gemm + s64.t_attn + s64.t_memory + s64.t_dequant_exposed, 1e-12);
  r.checkpointing = Checkpointing::None;
  EXPECT_DOUBLE_EQ(make_plan(r).speed.memory_bytes[0].second, p.speed.memory_bytes[0].second);
  // An FP8 base with FP8 GEMMs: the forward and its recompute read it as stored, only the
  // backward dequantizes to bf16 (dy W), each layer once per micro-step: L layers of 1 + 2 bytes.
  r.base_precision = BasePrecision::Fp8;
  r.gemm_dtype = GemmDtype::Fp8;
  const PlanResult f8 = make_plan(r);
  const LlamaConfig& cfg = f8.req.model;
  double per_layer = 0;
  for (const auto& t : all_linear_targets()) {
    const auto [out, in] = projection_shape(cfg, t);
    per_layer += double(quantized_weight_bytes(BasePrecision::Fp8, out, in, r.quant_blocksize, false)) + 2.0 * double(out * in);
  }
  EXPECT_EQ(dequant_layers_per_micro_step(cfg.n_layer, GemmDtype::Fp8), cfg.n_layer);
  EXPECT_DOUBLE_EQ(f8.speed.memory_bytes[0].second, per_layer * double(cfg.n_layer) * double(r.grad_accum));
  r.gemm_dtype = GemmDtype::Bf16;
  EXPECT_GT(make_plan(r).speed.memory_bytes[0].second, f8.speed.memory_bytes[0].second);
}

// Ring collectives: all-reduce of X bytes over G GPUs moves 2 (G-1)/G X per GPU over the link.
TEST(Speed, CollectiveByHand) {
  GpuSpec h = resolve_gpu("h100");  // 450 GB/s per direction NVLink, 50 GB/s NIC per GPU
  EXPECT_NEAR(collective_seconds(1e9, 2, {8, 1}, h, 1.0), 2 * 7.0 / 8 * 1e9 / 450e9, 1e-15);
  EXPECT_EQ(collective_seconds(1e9, 2, {1, 1}, h, 1.0), 0.0);
  // Two nodes: intra-node part plus the inter-node ring over each GPU's 1/8 share on its NIC.
  EXPECT_NEAR(collective_seconds(8e9, 1, {8, 2}, h, 0.5), 7.0 / 8 * 8e9 / 225e9 + 0.5 * 1e9 / 25e9, 1e-12);
  // DDP over 8 GPUs: one all-reduce of the fp32 LoRA gradients per step.
  PlanRequest r = request("llama3-8b", "h100", "lora");
  r.topo = {8, 1};
  PlanResult p = make_plan(r);
  const double grads = 4.0 * 41943040;
  ASSERT_EQ(p.speed.comm_bytes.size(), 1u);
  EXPECT_DOUBLE_EQ(p.speed.comm_bytes[0].second, 2 * grads);
  EXPECT_NEAR(p.speed.t_comm, collective_seconds(grads, 2, {8, 1}, h, plan_assumptions().comm_efficiency), 1e-15);
  EXPECT_NEAR(p.speed.tokens_per_second, 8 * 2048 / p.speed.step_time_s, 1e-6);
}

TEST(Speed, DirectionsOfChange) {
  PlanRequest r = request("llama3-70b", "h100", "qlora");
  r.checkpointing = Checkpointing::Full;
  const PlanResult base = make_plan(r);
  // Recompute costs time.
  r.checkpointing = Checkpointing::None;
  EXPECT_LT(make_plan(r).speed.step_time_s, base.speed.step_time_s);
  r.checkpointing = Checkpointing::Full;
  // Same compute, more bandwidth (H200 vs H100): faster, memory term exactly scaled.
  r.gpu = resolve_gpu("h200");
  const PlanResult h200 = make_plan(r);
  EXPECT_LT(h200.speed.step_time_s, base.speed.step_time_s);
  EXPECT_NEAR(h200.speed.t_memory * 4.8, base.speed.t_memory * 3.35, 1e-9);
  EXPECT_NEAR(h200.speed.t_gemm, base.speed.t_gemm, 1e-12);
  // FP8 GEMMs for an fp8 base on Hopper: faster GEMMs (the forward and recompute at the FP8 rate).
  r.gpu = resolve_gpu("h100");
  r.base_precision = BasePrecision::Fp8;
  const PlanResult fp8_bf16 = make_plan(r);
  r.gemm_dtype = GemmDtype::Fp8;
  EXPECT_LT(make_plan(r).speed.t_gemm, fp8_bf16.speed.t_gemm);
  r.gemm_dtype = GemmDtype::Bf16;
  r.base_precision = base.req.base_precision;
  // ZeRO-3 across 2 nodes adds all-gathers of the 4-bit base every micro-step.
  r.sharding = Sharding::Zero3;
  r.topo = {8, 2};
  const PlanResult z3 = make_plan(r);
  EXPECT_GT(z3.speed.t_comm, 0.0);
  EXPECT_NEAR(z3.speed.t_gemm, base.speed.t_gemm, 1e-12);  // each GPU still runs its whole micro-batch
  const double hidden = plan_assumptions().comm_overlap * (z3.speed.t_gemm + z3.speed.t_attn + z3.speed.t_memory);
  EXPECT_NEAR(z3.speed.t_comm_exposed, std::max(0.0, z3.speed.t_comm - hidden), 1e-12);
  // Padding without packing: same compute, fewer useful tokens.
  r = request("llama3-8b", "h100", "lora");
  r.avg_doc_len = 512;
  const double packed = make_plan(r).speed.tokens_per_second;
  r.packing = false;
  const PlanResult padded = make_plan(r);
  EXPECT_LT(padded.speed.tokens_per_second, 0.3 * packed);
  EXPECT_EQ(padded.speed.useful_tokens_per_step, 512.0);
}

// Preference objectives: rows of two documents attend within each half, and DPO/KTO add the
// reference forward (decoder, LM head and attention, no LoRA) to every token: by hand on 8B LoRA.
TEST(Speed, PreferenceObjectivesCountTheReferenceForward) {
  PlanRequest sft = request("llama3-8b", "h100", "lora");
  sft.seq_len = 2048;
  PlanRequest dpo = sft, orpo = sft;
  dpo.objective = Objective::Dpo;
  orpo.objective = Objective::Orpo;
  const SpeedEstimate s = make_plan(sft).speed, d = make_plan(dpo).speed, o = make_plan(orpo).speed;
  const double n_lin = 6979321856.0, n_head = 525336576.0;
  const double half_attn = 4 * 4096 * 1025.0 / 2 * 32;  // A over 1024-token documents
  EXPECT_EQ(s.per_token.reference.total(), 0.0);
  EXPECT_EQ(o.per_token.reference.total(), 0.0);  // ORPO and SimPO have no reference
  EXPECT_NEAR(o.per_token.fwd.attn, half_attn, 1e-3);
  EXPECT_NEAR(d.per_token.reference.total(), 2 * n_lin + 2 * n_head + half_attn, 1e3);
  EXPECT_EQ(d.per_token.reference.lora, 0.0);
  EXPECT_GT(d.step_time_s, o.step_time_s);
  EXPECT_LT(o.step_time_s, s.step_time_s);  // same tokens, shorter attention spans
  // The reference keeps nothing: the memory plan is the same.
  EXPECT_EQ(make_plan(dpo).total_bytes, make_plan(sft).total_bytes);
  // precompute_ref_log_probs: no reference forward in the step.
  PlanRequest pre = dpo;
  pre.reference_precomputed = true;
  EXPECT_EQ(make_plan(pre).speed.per_token.reference.total(), 0.0);
  EXPECT_EQ(make_plan(pre).speed.step_time_s, o.step_time_s);
}
