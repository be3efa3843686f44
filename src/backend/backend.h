// Backend: the op table the model is written against. One list (QLORA_BACKEND_OPS) drives the
// virtual interface, the op names and the coverage check of test_backend_ops.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"

namespace qlora {

// X(op_name, ArgsStruct)
#define QLORA_BACKEND_OPS(X)            \
  X(matmul, MatmulArgs)                 \
  X(matmul_fp8, MatmulFp8Args)          \
  X(matmul_fp4, MatmulFp4Args)          \
  X(embedding_fwd, EmbeddingFwdArgs)    \
  X(embedding_bwd, EmbeddingBwdArgs)    \
  X(rmsnorm_fwd, RmsnormFwdArgs)        \
  X(rmsnorm_bwd, RmsnormBwdArgs)        \
  X(rope_fwd, RopeArgs)                 \
  X(rope_bwd, RopeArgs)                 \
  X(attention_fwd, AttentionFwdArgs)    \
  X(attention_bwd, AttentionBwdArgs)    \
  X(swiglu_fwd, SwigluFwdArgs)          \
  X(swiglu_bwd, SwigluBwdArgs)          \
  X(moe_route_fwd, MoeRouteArgs)        \
  X(moe_route_bwd, MoeRouteBwdArgs)     \
  X(moe_router_stats, MoeRouterStatsArgs) \
  X(gather_rows, GatherRowsArgs)        \
  X(combine_rows, CombineRowsArgs)      \
  X(row_dots, RowDotsArgs)              \
  X(add, AddArgs)                       \
  X(bias_add, BiasAddArgs)              \
  X(scale, ScaleArgs)                   \
  X(dropout_fwd, DropoutArgs)           \
  X(dropout_bwd, DropoutArgs)           \
  X(cross_entropy_fwd_bwd, CrossEntropyArgs) \
  X(adamw, AdamwArgs)                   \
  X(dequantize, DequantizeArgs)         \
  X(sumsq, SumsqArgs)                   \
  X(offload_copy, OffloadCopyArgs)      \
  X(offload_wait, OffloadWaitArgs)

enum class DeviceKind { Cpu, Cuda };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual DeviceKind device() const = 0;
  // Activation dtype this backend computes in (F32 on CPU, BF16 on CUDA).
  virtual DType compute_dtype() const = 0;
  // Whether matmul_fp8 runs on FP8 hardware (CUDA: sm_89 and later); the CPU computes its
  // semantics in f32. A plan asking for FP8 base GEMMs falls back to bf16 where this is false.
  virtual bool has_fp8_gemm() const { return true; }
  // Whether matmul_fp4 runs on block-scaled FP4 hardware (CUDA: compute capability 10.x); the CPU
  // computes its semantics in f32.
  virtual bool has_fp4_gemm() const { return true; }

  // Memory on the backend's device. alloc returns zeroed, 256-byte aligned memory.
  virtual void* alloc(size_t bytes) = 0;
  // Never throws: it runs from destructors while another error may be unwinding the stack, and
  // that first error is the one the user must see.
  virtual void free(void* p) noexcept = 0;
  virtual void memset0(void* p, size_t bytes) = 0;
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  // Host memory for the memory plan's host buffers (PlannedBuffer::host: offloaded activations):
  // pinned on CUDA, so offload_copy runs asynchronously at full PCIe speed; plain memory on the
  // CPU. Zeroed, 256-byte aligned. free_host never throws (as free).
  virtual void* alloc_host(size_t bytes) = 0;
  virtual void free_host(void* p) noexcept = 0;
  virtual void synchronize() {}

  // Op scratch from the memory plan (BufferOwner::ArenaScratch): the Arena hands each such buffer
  // to the backend by its planned name ("cuda.matmul_cvt_a", ...). From then on the op that uses
  // it must fit in `bytes`: needing more is an Internal error naming the op, never a new
  // allocation. A backend with no op scratch (CPU) plans none, so any name is an error here.
  virtual void bind_scratch(const std::string& name, void* p, size_t bytes) {
    (void)p;
    fail(ErrorKind::Internal, "backend " + this->name(),
         "has no op scratch, but the memory plan hands it '" + name + "' (" + std::to_string(bytes) + " bytes)",
         "plan the CUDA backend's buffers only for the CUDA backend");
  }
  // Forgets every bound scratch buffer (the Arena holding them is going away). Never throws.
  virtual void unbind_scratch() noexcept {}
  // Whether the engine's memory plan holds this backend's own memory (model/backend_plan.cpp):
  // the CUDA backend's workspace, op scratch and upload staging. A backend that only reports
  // another device kind (tests of the device path on the CPU) plans none.
  virtual bool plans_own_memory() const { return false; }
  // Bytes a run may still allocate for its memory plan: the CPU's MemAvailable, a GPU's free
  // memory; 0 when unknown. The auto MLP tile is chosen against it (model/engine_spec.h).
  virtual int64_t memory_available() const { return 0; }
  // The host kernels a CPU backend runs, for the planner's calibration (its cache key and the
  // reports): the row kernels' SIMD level and the BLAS (version, threading, core). Empty elsewhere.
  virtual std::string simd_kernels() const { return ""; }
  virtual std::string blas_kernels() const { return ""; }

#define QLORA_DECLARE_OP(op, Args) virtual void op(const Args& a) = 0;
  QLORA_BACKEND_OPS(QLORA_DECLARE_OP)
#undef QLORA_DECLARE_OP
};

// Names of all ops in table order.
const std::vector<std::string>& backend_op_names();

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace qlora
