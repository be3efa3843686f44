// The CUDA backend's own memory, named and sized in one place. The engine's memory plan lists
// these buffers (model/backend_plan.cpp: plan_cuda_backend_buffers) and the backend
// (backend/cuda/) allocates or binds exactly them, so `qlora plan` and the device agree.
// Host-only: no CUDA headers, usable by the planner.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

namespace qlora::cuda_plan {

// Op scratch slots. Each is a planned buffer the Arena allocates inside its workspace block and
// hands to the backend (Backend::bind_scratch); an op that needs more than its slot holds is an
// Internal error naming the op and both sizes.
enum class ScratchSlot : int {
  MatmulCvtA,      // matmul's F32 A operand rounded to bf16 (the LM head's dgrad: dlogits x W)
  MatmulCvtB,      // matmul's F32 B operand rounded to bf16 (LoRA A/B; an fp32 base's weights)
  AttnDqAcc,       // attention_bwd's f32 dq accumulator, (B,T,Hq,attention_dq_cols(D))
  AttnDelta,       // attention_bwd's f32 rowsum(dO*O), (B,Hq,T)
  ReducePartials,  // sumsq's f64 partial sums (and rmsnorm_bwd's f32 dw partials)
  Fp8Act,          // matmul_fp8's activation: amax partials, scale, e4m3 codes (fp8_act_bytes)
  Fp4Act,          // matmul_fp4's activation: amax partials, scales, e2m1 codes, tiled e4m3 (fp4_act_bytes)
  kCount
};
constexpr int kNumScratchSlots = int(ScratchSlot::kCount);

inline const char* scratch_buffer_name(ScratchSlot s) {
  switch (s) {
    case ScratchSlot::MatmulCvtA: return "cuda.matmul_cvt_a";
    case ScratchSlot::MatmulCvtB: return "cuda.matmul_cvt_b";
    case ScratchSlot::AttnDqAcc: return "cuda.attn_dq_acc";
    case ScratchSlot::AttnDelta: return "cuda.attn_delta";
    case ScratchSlot::ReducePartials: return "cuda.reduce_partials";
    case ScratchSlot::Fp8Act: return "cuda.fp8_act";
    case ScratchSlot::Fp4Act: return "cuda.fp4_act";
    case ScratchSlot::kCount: break;
  }
  return "cuda.?";
}
// The slot a planned buffer name stands for, or kCount when it names none.
inline ScratchSlot scratch_slot_of(const std::string& name) {
  for (int i = 0; i < kNumScratchSlots; i++)
    if (name == scratch_buffer_name(ScratchSlot(i))) return ScratchSlot(i);
  return ScratchSlot::kCount;
}

// Device memory the backend allocates itself when it is made (one cudaMalloc each, of exactly
// these sizes): the cuBLASLt workspace (what cuBLAS recommends on Hopper; smaller workspaces
// exclude the fastest kernels) and the device error record (the record is 16 bytes; the backend
// asks for one 256-byte cudaMalloc granule, and the plan says so).
inline constexpr const char* kLtWorkspaceName = "cuda.lt_workspace";
inline constexpr int64_t kLtWorkspaceBytes = int64_t(32) << 20;
inline constexpr const char* kErrorRecordName = "cuda.error_record";
inline constexpr int64_t kErrorRecordBytes = 256;
// Pinned host memory for uploads: two buffers used in turn (made on the first upload).
inline constexpr int kStagingBuffers = 2;
inline constexpr int64_t kStagingBytes = int64_t(16) << 20;
inline std::string staging_buffer_name(int i) { return std::string("cuda.upload_staging.") + std::to_string(i); }

// Launch geometry that decides scratch sizes, shared with the kernels' launchers.
inline constexpr int kSumsqThreads = 256;  // sumsq kernels' block; each thread reads 8 elements per step
// sumsq's partial sums for one tensor of n elements (a fixed grid per tensor: reproducible).
inline int64_t sumsq_blocks(int64_t n) {
  return n == 0 ? 0 : std::clamp<int64_t>((n + kSumsqThreads * 8 - 1) / (kSumsqThreads * 8), 1, 1024);
}
// matmul_fp8's scratch for x (tokens, in): kFp8AmaxBlocks f32 amax partials, then {amax, scale_inv}
// at kFp8StatsOffset, then the e4m3 codes at kFp8CodesOffset (256-byte aligned, as cuBLASLt's FP8
// kernels want 16).
inline constexpr int kFp8AmaxBlocks = 256;
inline constexpr int64_t kFp8StatsOffset = int64_t(kFp8AmaxBlocks) * 4;
inline constexpr int64_t kFp8CodesOffset = kFp8StatsOffset + 256;
inline int64_t fp8_act_bytes(int64_t tokens, int64_t in) { return kFp8CodesOffset + tokens * in; }
// matmul_fp4's scratch for x (tokens, in): kFp8AmaxBlocks f32 amax partials, then {amax, decode
// scale, alpha, beta} at kFp8StatsOffset, the e2m1 codes (two a byte) at kFp8CodesOffset, then the
// e4m3 block scales in cuBLASLt's tiled layout at fp4_act_scales_offset (both 256-byte aligned).
inline int64_t fp4_act_scales_offset(int64_t tokens, int64_t in) {
  return kFp8CodesOffset + (tokens * (in / 2) + 255) / 256 * 256;
}
inline int64_t fp4_act_bytes(int64_t tokens, int64_t in) {
  return fp4_act_scales_offset(tokens, in) + (tokens + 127) / 128 * 128 * ((in / 16 + 3) / 4 * 4);
}
// The cuDNN attention path (sm_90/sm_100) keeps its ragged offsets and sequence lengths (int32:
// entries + 3 (entries+1)) in the AttnDelta slot, which it does not otherwise use; entries is a
// power of two >= the documents of the call, at most kAttnMaxEntries.
inline constexpr int64_t kAttnMaxEntries = 2048;
inline int64_t attention_ragged_bytes(int64_t entries) { return 4 * (entries + 3 * (entries + 1)); }
// Columns of one (row, head) of attention_bwd's dq accumulator: the backward kernel's tile width.
inline int64_t attention_dq_cols(int64_t head_dim) { return head_dim <= 64 ? 64 : 128; }
// Whether the key-major backward splits dK/dV over two warps per 16 keys (its 256-column tile,
// BwdTraits<256>::kDSplit), each computing S^T and dP^T: head dims over 128.
inline bool attention_dkv_split(int64_t head_dim) { return head_dim > 128; }
// Whether the own kernels take dQ in its own query-major pass whatever AttnDq asks, with no
// accumulator: soft-capped scores (Gemma 2) and a split key-major kernel (which has no dQ part).
inline bool attention_dq_own_pass(int64_t head_dim, bool softcapped) { return softcapped || attention_dkv_split(head_dim); }

}  // namespace qlora::cuda_plan
