// The engine's whole buffer list on a backend: the model's buffers (model_plan.h) plus, on the
// CUDA backend, the backend's own memory, sized from the model shape and training options.
// DecoderModel allocates from this list and `qlora plan` reports it, so on a GPU the plan equals
// what the engine allocates, scratch included.
#pragma once
#include "backend/backend.h"
#include "core/memory_plan.h"
#include "model/model_plan.h"

namespace qlora {

// plan_model_buffers, then plan_cuda_backend_buffers when `device` is the CUDA backend.
void plan_engine_buffers(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o, DeviceKind device);

// Appends the CUDA backend's memory (names in backend/cuda_scratch.h), all MemCategory::Workspace:
//   cuda.lt_workspace        cuBLASLt workspace, allocated by the backend when it is made
//   cuda.error_record        the device error record, allocated by the backend when it is made
//   cuda.upload_staging.0/1  pinned host upload buffers (host, not device)
//   cuda.matmul_cvt_a/_b     the largest F32 operand of a mixed-dtype matmul of the model, as bf16
//   cuda.attn_dq_acc         attention_bwd's f32 dq accumulator for micro_batch x seq_len tokens
//                            (empty when dq has its own pass, ModelPlanOptions::attn_dq Recompute)
//   cuda.attn_delta          attention_bwd's rowsum(dO*O)
//   cuda.reduce_partials     the largest sumsq the trainer issues
// The op scratch (the last five) is allocated by the Arena and bound to the backend. Must follow
// plan_model_buffers on the same plan: it reads the LoRA buffers from it.
void plan_cuda_backend_buffers(MemoryPlan& plan, const LlamaConfig& c, const ModelPlanOptions& o);

// True for the buffers plan_cuda_backend_buffers adds (their names start with "cuda.").
bool is_backend_buffer(const PlannedBuffer& b);
// What one of those buffers holds, for reports ("cuBLASLt workspace", ...).
std::string backend_buffer_description(const std::string& name);

}  // namespace qlora
