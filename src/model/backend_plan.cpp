// The CUDA backend's memory in the engine's plan, from the model shape and training options.
// Each size is the largest request the engine's ops make (the decoder_*.cpp files, train/step.cpp); the
// backend refuses an op that needs more than its planned slot (Internal error), so a new call
// site with a larger request fails loudly instead of allocating behind the plan.
#include "model/backend_plan.h"

#include <algorithm>

#include "backend/cuda_scratch.h"
#include "model/experts.h"
#include "model/quant_bytes.h"

namespace qlora {

namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

}  // namespace

bool is_backend_buffer(const PlannedBuffer& b) { return b.name.rfind("cuda.", 0) == 0; }

std::string backend_buffer_description(const std::string& name) {
  namespace cp = cuda_plan;
  using S = cp::ScratchSlot;
  if (name == cp::kLtWorkspaceName) return "cuBLASLt workspace";
  if (name == cp::kErrorRecordName) return "device error record";
  if (name.rfind("cuda.upload_staging.", 0) == 0) return "upload staging (pinned host)";
  switch (cp::scratch_slot_of(name)) {
    case S::MatmulCvtA: return "f32 matmul A as bf16";
    case S::MatmulCvtB: return "f32 matmul B as bf16";
    case S::AttnDqAcc: return "attention bwd dq accumulator";
    case S::AttnDelta: return "attention bwd rowsum(dO*O)";
    case S::ReducePartials: return "sumsq partial sums";
    case S::Fp8Act: return "fp8 GEMM activation (e4m3) and its scale";
    case S::Fp4Act: return "fp4 GEMM activation (e2m1, tiled e4m3 scales) and its scales";
    case S::kCount: break;
  }
  return "";
}

void plan_cuda_backend_buffers(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o) {
  using MC = MemCategory;
  namespace cp = cuda_plan;
  const DType cd = o.compute_dtype;
  const int64_t N = o.micro_batch * o.seq_len, V = c.vocab_size, r = o.lora.r;
  const bool f32_base = base_of(o) == BasePrecision::Fp32 && cd != DType::F32;
  const bool lora = o.method != Method::Full;
  // Rows a projection's GEMM takes at once: the MLP's run over tiles (mlp_rows), the rest over N.
  auto rows_of = [&](const std::string& proj) {
    return proj == "gate_proj" || proj == "up_proj" || proj == "down_proj" ? mlp_rows(o, c) : N;
  };

  // Made by the backend itself when it is constructed.
  plan.add_bytes(cp::kLtWorkspaceName, MC::Workspace, cp::kLtWorkspaceBytes);
  plan.buffers.back().owner = BufferOwner::Backend;
  plan.add_bytes(cp::kErrorRecordName, MC::Workspace, cp::kErrorRecordBytes);
  plan.buffers.back().owner = BufferOwner::Backend;
  for (int i = 0; i < cp::kStagingBuffers; i++) {
    plan.add_bytes(cp::staging_buffer_name(i), MC::Workspace, cp::kStagingBytes);
    plan.buffers.back().owner = BufferOwner::Backend;
    plan.buffers.back().host = true;
  }

  // Mixed-dtype matmuls: the CUDA matmul rounds an F32 operand to bf16 in scratch (A and B each
  // their own slot) before a bf16 GEMM; C's dtype needs no copy. The model's matmuls (compute
  // dtype bf16, LoRA parameters f32, logits chunk f32):
  //   base projection fwd/dgrad   x W^T, dy W           W bf16 (quantized: dequantized to bf16);
  //                                                      an fp32 base keeps W f32: B = out*in
  //   LoRA fwd                    x A^T, h B^T          B = r*in, out*r
  //   LoRA bwd                    dy B, dh A            B = out*r, r*in
  //                               dy^T h, dh^T x        both bf16 (the f32 grads are C)
  //   LM head fwd                 x W^T                 both bf16, C = the f32 logits chunk
  //   LM head dgrad               dlogits W             A = chunk*V (the f32 logits chunk)
  //   MoE router fwd / dgrad      ln2 Wr^T (C f32), dlogits Wr   A = N*experts (the f32 router gradient)
  const int64_t chunk = std::min(o.ce_chunk, N);
  // A mixture of experts' router backward, d(logits) W_r: d(logits) is f32 (N x experts).
  const int64_t cvt_a = std::max(chunk * V, c.moe() ? N * c.n_experts : 0);
  int64_t cvt_b = 0;
  for (const auto& t : dense_projections(c)) {
    const auto [out, in] = projection_shape(c, t);
    if (f32_base) cvt_b = std::max(cvt_b, out * in);
  }
  if (f32_base && c.moe())  // one expert's weight at a time
    for (const auto& k : expert_kinds()) cvt_b = std::max(cvt_b, expert_shape(c, k).first * expert_shape(c, k).second);
  if (lora) {  // per LoRA module (a fused module's B whole: its projections use parts of it)
    for (const auto& t : lora_targets_for(c, o.lora.targets)) {
      const auto [out, in] = projection_shape(c, t);
      cvt_b = std::max(cvt_b, r * std::max(in, out));
    }
    for (const auto& k : o.lora.expert_targets) {  // one expert's A or its rows of B at a time
      const auto [out, in] = expert_lora_shape(c, k);
      cvt_b = std::max(cvt_b, r * std::max(in, k == "gate_up_proj" ? out / 2 : out));
    }
  }
  plan.add(cp::scratch_buffer_name(cp::ScratchSlot::MatmulCvtA), MC::Workspace, DType::BF16, {cvt_a}, Lifetime::Layer);
  plan.buffers.back().owner = BufferOwner::ArenaScratch;
  plan.add(cp::scratch_buffer_name(cp::ScratchSlot::MatmulCvtB), MC::Workspace, DType::BF16, {cvt_b}, Lifetime::Layer);
  plan.buffers.back().owner = BufferOwner::ArenaScratch;

  // matmul_fp8 (FP8 base GEMMs): amax partials, scale and the e4m3 codes of the widest input.
  if (o.gemm_dtype == GemmDtype::Fp8) {
    int64_t bytes = 0;
    for (const auto& t : dense_projections(c)) bytes = std::max(bytes, cp::fp8_act_bytes(rows_of(t), projection_shape(c, t).second));
    plan.add_bytes(cp::scratch_buffer_name(cp::ScratchSlot::Fp8Act), MC::Workspace, bytes, Lifetime::Layer);
    plan.buffers.back().owner = BufferOwner::ArenaScratch;
  }
  // matmul_fp4 (FP4 base GEMMs): amax partials, scales, e2m1 codes and tiled e4m3 of the widest input.
  if (o.gemm_dtype == GemmDtype::Fp4) {
    int64_t bytes = 0;
    for (const auto& t : dense_projections(c)) bytes = std::max(bytes, cp::fp4_act_bytes(rows_of(t), projection_shape(c, t).second));
    plan.add_bytes(cp::scratch_buffer_name(cp::ScratchSlot::Fp4Act), MC::Workspace, bytes, Lifetime::Layer);
    plan.buffers.back().owner = BufferOwner::ArenaScratch;
  }

  // attention_bwd on micro_batch x seq_len tokens: dq accumulated in f32 at the kernel's tile
  // width (none when dq has its own pass: AttnDq::Recompute, soft-capped scores, head dims over
  // 128), and delta per (token, query head).
  const bool dq_acc = o.attn_dq == AttnDq::Accumulate && !cp::attention_dq_own_pass(c.head_dim, c.attn_logit_softcapping > 0);
  plan.add(cp::scratch_buffer_name(cp::ScratchSlot::AttnDqAcc), MC::Workspace, DType::F32,
           {dq_acc ? N : 0, c.n_head, cp::attention_dq_cols(c.head_dim)}, Lifetime::Layer);
  plan.buffers.back().owner = BufferOwner::ArenaScratch;
  // On sm_90/sm_100 the cuDNN path runs instead (no plan knows the device): its workspace goes
  // to the dq slot (a larger request is an Internal error) and its ragged offsets to the delta slot.
  plan.add(cp::scratch_buffer_name(cp::ScratchSlot::AttnDelta), MC::Workspace, DType::F32,
           {std::max(c.n_head * N, cp::attention_ragged_bytes(cp::kAttnMaxEntries) / 4)}, Lifetime::Layer);
  plan.buffers.back().owner = BufferOwner::ArenaScratch;

  // sumsq: one f64 partial per block of each tensor plus the total. The largest call of the
  // trainer is optimizer_state_finite over every LoRA parameter and its two AdamW moments (the
  // gradient norm covers the gradients once); rmsnorm_bwd's dw partials are unused (norms are
  // frozen).
  int64_t blocks = 0;
  for (const auto& b : plan.buffers)
    if (b.category == MC::Lora) blocks += cp::sumsq_blocks(numel(b.shape));
  plan.add(cp::scratch_buffer_name(cp::ScratchSlot::ReducePartials), MC::Workspace, DType::F64,
           {blocks == 0 ? 0 : 3 * blocks + 1}, Lifetime::Layer);
  plan.buffers.back().owner = BufferOwner::ArenaScratch;
}

void plan_engine_buffers(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o, DeviceKind device) {
  plan_model_buffers(plan, c, o);
  if (device == DeviceKind::Cuda) plan_cuda_backend_buffers(plan, c, o);
}

}  // namespace qlora
