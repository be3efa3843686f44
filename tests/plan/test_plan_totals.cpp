// Hand-computed memory totals for the llama3-8b and llama3-70b presets, category by category.
// The arithmetic is written out from the model shape (no loops over the plan): a change in the
// engine's buffer list shows up here as a named category mismatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "plan/assumptions.h"
#include "plan/planner.h"

using namespace qlora;

namespace {

int64_t al(int64_t b) { return (b + 255) / 256 * 256; }  // every planned buffer is 256-byte aligned
constexpr int64_t GiB = int64_t(1) << 30;

PlanRequest request(const std::string& model, const std::string& gpu) {
  PlanRequest r;
  r.model = preset_config(model);
  r.model_label = model;
  r.gpu = resolve_gpu(gpu);
  return r;
}

// Overhead lines follow from the planned bytes and the device (assumptions.h).
int64_t overhead(int64_t planned, int64_t device, bool multi_gpu) {
  const PlanAssumptions& a = plan_assumptions();
  return a.cuda_context_bytes + (multi_gpu ? a.nccl_bytes : 0) +
         int64_t(std::llround(a.fragmentation_fraction * double(planned))) +
         int64_t(std::llround(a.driver_reserve_fraction * double(device)));
}

// sumsq blocks of one tensor: one per 2048 elements (256 threads x 8), 1 to 1024.
int64_t sumsq_blocks(int64_t n) { return std::clamp<int64_t>((n + 2047) / 2048, 1, 1024); }
// The LoRA tensors' sumsq blocks over all layers (r = 16, all seven projections).
int64_t lora_blocks(int64_t C, int64_t q, int64_t kv, int64_t F, int64_t L) {
  int64_t b = 0;
  for (auto [out, in] : {std::pair{q, C}, {kv, C}, {kv, C}, {C, q}, {F, C}, {F, C}, {C, F}})
    b += sumsq_blocks(16 * in) + sumsq_blocks(out * 16);
  return L * b;
}
// The CUDA backend's own device memory in a GPU plan (workspace category; model/backend_plan.cpp),
// by hand for r = 16, CE chunk 1024, head_dim 128: cuBLASLt workspace 32 MiB, the error record
// (one 256-byte granule), the LM head's dgrad operand (the f32 logits chunk as bf16, 1024 x V x 2),
// the widest LoRA operand as bf16 (16 x max(in, out) x 2), attention_bwd's f32 dq accumulator
// (N x H x 128 x 4) and delta (N x H x 4), and the sumsq partials of every LoRA weight with its
// two AdamW moments ((3 x blocks + 1) x 8).
int64_t cuda_backend(int64_t V, int64_t N, int64_t H, int64_t widest, int64_t blocks) {
  return (int64_t(32) << 20) + 256 + al(1024 * V * 2) + al(16 * widest * 2) + al(N * H * 128 * 4) + al(N * H * 4) +
         al((3 * blocks + 1) * 8);
}

}  // namespace

// Llama-3-8B, LoRA r=16 on all seven projections, bf16 base, micro-batch 1 x 2048, no checkpointing.
TEST(PlanTotals, Llama3_8B_Lora_Bf16) {
  PlanRequest r = request("llama3-8b", "h100");
  r.method = Method::Lora;
  PlanResult p = make_plan(r);

  const int64_t V = 128256, C = 4096, F = 14336, L = 32, q = 4096, kv = 1024, H = 32, N = 2048, R = 16;
  // weights, bf16: embed + lm_head 2*V*C*2 = 2,101,346,304; per layer two norms 2*C*2 = 16,384 and
  // projections (q C + 2 kv C + C q + 3 F C)*2 = 436,207,616 -> 436,224,000 x 32 = 13,959,168,000;
  // final norm 8,192.  Total 16,060,522,496 (8.03B params x 2).
  const int64_t weights = 2 * V * C * 2 + L * (2 * C * 2 + (q * C + 2 * kv * C + C * q + 3 * F * C) * 2) + C * 2;
  EXPECT_EQ(weights, 16060522496LL);
  EXPECT_EQ(p.categories.at(MemCategory::Weights), weights);
  // LoRA, fp32: r * sum(in + out) = 16 * (8192 + 5120 + 5120 + 8192 + 3 * 18432) = 1,310,720 params
  // per layer x 32 = 41,943,040 params (perf_anchors §10: 41.9M) x 4 bytes = 167,772,160.
  const int64_t lora = 4 * R * L * ((C + q) + 2 * (C + kv) + (q + C) + 3 * (C + F));
  EXPECT_EQ(lora, 167772160LL);
  EXPECT_EQ(p.categories.at(MemCategory::Lora), lora);
  EXPECT_EQ(p.categories.at(MemCategory::Grads), lora);          // fp32 gradient per adapter
  EXPECT_EQ(p.categories.at(MemCategory::Optimizer), 2 * lora);  // AdamW m and v, fp32
  // activations, bf16 unless noted, per layer (N tokens): x, ln1, q, att, xmid, ln2 (N*C or N*q each:
  // 6 x 16,777,216), k, v (2 x 4,194,304), gate, up, h (3 x 58,720,256), rstd1, rstd2 (fp32 N: 2 x 8,192),
  // lse (fp32 H*N: 262,144), lora_h per target (7 x N*r*2 = 7 x 65,536) = 285,949,952 per layer;
  // + final_x 16,777,216 (the final norm's output lives in ws.datt), final_rstd 8,192, six int32
  // batch arrays 6 x 8,192.
  const int64_t per_layer = (6 * N * C + 2 * N * kv + 3 * N * F) * 2 + 2 * N * 4 + H * N * 4 + 7 * N * R * 2;
  EXPECT_EQ(per_layer, 285949952LL);
  const int64_t acts = L * per_layer + N * C * 2 + N * 4 + 6 * N * 4;  // 6 int32 batch arrays
  EXPECT_EQ(p.categories.at(MemCategory::Activations), acts);  // 9,167,216,640 = 4.48 MB/token
  // logits: one fp32 chunk of 1024 tokens x V = 525,336,576, plus fp32 per-token losses 8,192.
  EXPECT_EQ(p.categories.at(MemCategory::Logits), 1024 * V * 4 + N * 4);
  // workspace: dres, dln, datt, dq (4 x N*C*2), tmp, dgate, dup (3 x N*F*2), dk, dv (2 x N*kv*2),
  // lora_dh N*r*2, rope inv_freq 64 fp32 = 251,724,032.
  // + the CUDA backend's own buffers: 20,480 LoRA sumsq blocks, widest LoRA operand F = 14336;
  // 330,990,080 bytes (the 262.7 MB logits-chunk copy is most of it).
  EXPECT_EQ(lora_blocks(C, q, kv, F, L), 20480);
  const int64_t cuda = cuda_backend(V, N, H, F, 20480);
  EXPECT_EQ(cuda, 330990080LL);
  const int64_t ws = 4 * N * C * 2 + 3 * N * F * 2 + 2 * N * kv * 2 + N * R * 2 + 64 * 4 + cuda;
  EXPECT_EQ(p.categories.at(MemCategory::Workspace), ws);
  const int64_t planned = weights + 4 * lora + acts + 1024 * V * 4 + N * 4 + ws;  // lora + grads + m + v = 4 x lora
  EXPECT_EQ(planned, 26675912960LL + 330990080LL);
  EXPECT_EQ(p.categories.at(MemCategory::Overhead), overhead(planned, 80 * GiB, false));
  EXPECT_EQ(p.total_bytes, planned + overhead(planned, 80 * GiB, false));
  EXPECT_TRUE(p.fits);  // ~25.9 GiB of 80
}

// Llama-3-70B full fine-tune on one B200 192GB: 18 bytes per parameter of fixed state alone.
// Sample answers plan a KV cache (the trainer's kv_cache_tokens): 2 x L x tokens x kv_dim in bf16,
// on top of the same plan without it.
TEST(PlanTotals, SampleAnswersKvCacheIsPlanned) {
  PlanRequest r = request("llama3-8b", "h100");
  r.method = Method::Lora;
  const PlanResult without = make_plan(r);
  r.kv_cache_tokens = 2048 + 128;
  const PlanResult with = make_plan(r);
  const int64_t per_layer = al(2176 * 1024 * 2);
  EXPECT_EQ(with.categories.at(MemCategory::Activations) - without.categories.at(MemCategory::Activations),
            2 * 32 * per_layer);
  ASSERT_NE(with.replica.find("kv.layers.31.v"), nullptr);
  EXPECT_EQ(without.replica.find("kv.layers.0.k"), nullptr);
}

TEST(PlanTotals, Llama3_70B_Full_DoesNotFitB200) {
  PlanRequest r = request("llama3-70b", "b200");
  r.method = Method::Full;
  PlanResult p = make_plan(r);
  const int64_t V = 128256, C = 8192, F = 28672, L = 80, kv = 1024;
  // params: embed + lm_head 2*V*C = 2,101,346,304; per layer 2C + C*C (q) + 2*kv*C + C*C (o) + 3*F*C
  // = 855,654,400 x 80 = 68,452,352,000; final norm 8,192 -> 70,553,706,496.
  const int64_t params = 2 * V * C + L * (2 * C + 2 * C * C + 2 * kv * C + 3 * F * C) + C;
  EXPECT_EQ(params, 70553706496LL);
  EXPECT_EQ(p.req.model.n_params(), params);
  // Every buffer is a multiple of 256 bytes here, so per-category bytes are exact multiples of params.
  EXPECT_EQ(p.categories.at(MemCategory::Weights), 2 * params);     // bf16 working weights
  EXPECT_EQ(p.categories.at(MemCategory::Grads), 4 * params);       // fp32 gradients
  EXPECT_EQ(p.categories.at(MemCategory::Optimizer), 12 * params);  // fp32 master + AdamW m + v
  EXPECT_EQ(p.categories.at(MemCategory::Lora), 0);
  // 18 x 70.55B = 1,269,966,716,928 bytes = 1,182.75 GiB before activations: far beyond 192 GiB.
  EXPECT_GT(18 * params, 6 * 192 * GiB);
  EXPECT_FALSE(p.fits);
  EXPECT_LT(p.headroom_bytes, 0);
  ASSERT_GE(p.why.size(), 3u);
  std::string why;
  for (const auto& w : p.why) why += w + "\n";
  EXPECT_NE(why.find("optimizer"), std::string::npos) << why;
  EXPECT_NE(why.find("18 bytes per parameter"), std::string::npos) << why;
}

// Llama-3-70B QLoRA, NF4 with double quant (bitsandbytes layout, block 64), r=16, 4096 tokens,
// full checkpointing, on one B200: fits.
TEST(PlanTotals, Llama3_70B_QLoRA_Nf4_FitsB200) {
  PlanRequest r = request("llama3-70b", "b200");
  r.method = Method::Qlora;
  r.base_precision = BasePrecision::Nf4;
  r.seq_len = 4096;
  r.checkpointing = Checkpointing::Full;
  PlanResult p = make_plan(r);
  const int64_t V = 128256, C = 8192, F = 28672, L = 80, kv = 1024, N = 4096, H = 64, R = 16;
  // bnb NF4 + double quant for n weights: n/2 packed codes + 16 fp32 code-table entries + n/64 uint8
  // absmax + fp32 nested absmax per 256 blocks + 256-entry fp32 nested code + fp32 offset.
  auto nf4 = [](int64_t n) {
    const int64_t blocks = n / 64;
    return al(n / 2 + 16 * 4 + blocks + (blocks + 255) / 256 * 4 + 256 * 4 + 4);
  };
  // q, o: 8192 x 8192 -> 33,554,432 + 64 + 1,048,576 + 16,384 + 1,028 = 34,620,484 -> aligned 34,620,672.
  EXPECT_EQ(nf4(C * C), 34620672);
  const int64_t layer = 2 * al(C * 2) + 2 * nf4(C * C) + 2 * nf4(kv * C) + 3 * nf4(F * C);
  const int64_t weights = 2 * V * C * 2 + L * layer + C * 2;  // embed + lm_head stay bf16
  EXPECT_EQ(p.categories.at(MemCategory::Weights), weights);   // ~36.8 GiB: 0.53 B/param + bf16 embed/head
  const int64_t lora = 4 * R * L * ((C + C) + 2 * (C + kv) + (C + C) + 3 * (C + F));  // 828 MB
  EXPECT_EQ(p.categories.at(MemCategory::Lora), lora);
  EXPECT_EQ(p.categories.at(MemCategory::Grads), lora);
  EXPECT_EQ(p.categories.at(MemCategory::Optimizer), 2 * lora);
  // Checkpointing keeps each layer's input (80 x N*C*2) and one layer's working set (as in the
  // LoRA case above, without x), + final_x (the final norm's output lives in ws.datt), final_rstd
  // and the batch arrays.
  const int64_t work = (5 * N * C + 2 * N * kv + 3 * N * F) * 2 + 2 * N * 4 + H * N * 4 + 7 * N * R * 2;
  const int64_t acts = L * N * C * 2 + work + N * C * 2 + N * 4 + 6 * N * 4;
  EXPECT_EQ(p.categories.at(MemCategory::Activations), acts);
  EXPECT_EQ(p.categories.at(MemCategory::Logits), 1024 * V * 4 + N * 4);
  // workspace as for 8B (C = q here) + two dequantized layers (q, k, v, o, gate, up, down), bf16.
  // + the CUDA backend's own buffers (434,833,920 bytes: dq accumulator 134 MB at 4096 tokens x 64 heads).
  EXPECT_EQ(lora_blocks(C, C, kv, F, L), 101120);
  const int64_t cuda = cuda_backend(V, N, H, F, 101120);
  EXPECT_EQ(cuda, 434833920LL);
  const int64_t ws = 4 * N * C * 2 + 3 * N * F * 2 + 2 * N * kv * 2 + N * R * 2 + 64 * 4 + 2 * (2 * C * C + 2 * kv * C + 3 * F * C) * 2 + cuda;
  EXPECT_EQ(p.categories.at(MemCategory::Workspace), ws);
  const int64_t planned = weights + 4 * lora + acts + 1024 * V * 4 + N * 4 + ws;
  EXPECT_EQ(p.total_bytes, planned + overhead(planned, 192 * GiB, false));
  EXPECT_TRUE(p.fits);
  EXPECT_LT(p.total_bytes, 100 * GiB);
}

// ZeRO-3 over 8 GPUs divides every parameter buffer by 8 (all dims of llama3-8b divide evenly) and
// adds two gathered units (the largest is the bf16 embedding) plus one unit of LoRA gradients.
TEST(PlanTotals, Llama3_8B_Lora_Zero3_Over8) {
  PlanRequest r = request("llama3-8b", "h100");
  r.method = Method::Lora;
  r.sharding = Sharding::Zero3;
  r.topo = {8, 1};
  PlanResult p = make_plan(r);
  const int64_t V = 128256, C = 4096, F = 14336, L = 32, kv = 1024, N = 2048, R = 16, H = 32;
  const int64_t weights = 16060522496LL, lora = 167772160LL;  // single-replica values (test above)
  EXPECT_EQ(p.categories.at(MemCategory::Weights), weights / 8);
  EXPECT_EQ(p.categories.at(MemCategory::Lora), lora / 8);
  EXPECT_EQ(p.categories.at(MemCategory::Grads), lora / 8);
  EXPECT_EQ(p.categories.at(MemCategory::Optimizer), 2 * lora / 8);
  const int64_t ws = 4 * N * C * 2 + 3 * N * F * 2 + 2 * N * kv * 2 + N * R * 2 + 64 * 4 +
                     cuda_backend(V, N, H, F, lora_blocks(C, C, kv, F, L));  // the backend's own: not sharded
  const int64_t embed = V * C * 2;                 // 1,050,673,152 > one layer (436,224,000 + LoRA 5,242,880)
  const int64_t grad_unit = lora / L;              // one layer's LoRA gradients, fp32
  EXPECT_EQ(p.categories.at(MemCategory::Workspace), ws + 2 * embed + grad_unit);
}
