// Backend: the op table the model is written against. One list (QLORA_BACKEND_OPS) drives the
// virtual interface, the op names and the coverage check of test_backend_ops.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "backend/ops.h"

namespace qlora {

// X(op_name, ArgsStruct)
#define QLORA_BACKEND_OPS(X)            \
  X(matmul, MatmulArgs)                 \
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
  X(add, AddArgs)                       \
  X(bias_add, BiasAddArgs)              \
  X(scale, ScaleArgs)                   \
  X(dropout_fwd, DropoutArgs)           \
  X(dropout_bwd, DropoutArgs)           \
  X(cross_entropy_fwd_bwd, CrossEntropyArgs) \
  X(adamw, AdamwArgs)                   \
  X(dequantize, DequantizeArgs)         \
  X(sumsq, SumsqArgs)

enum class DeviceKind { Cpu, Cuda };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual DeviceKind device() const = 0;
  // Activation dtype this backend computes in (F32 on CPU, BF16 on CUDA).
  virtual DType compute_dtype() const = 0;

  // Memory on the backend's device. alloc returns zeroed, 256-byte aligned memory.
  virtual void* alloc(size_t bytes) = 0;
  // Never throws: it runs from destructors while another error may be unwinding the stack, and
  // that first error is the one the user must see.
  virtual void free(void* p) noexcept = 0;
  virtual void memset0(void* p, size_t bytes) = 0;
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() {}

#define QLORA_DECLARE_OP(op, Args) virtual void op(const Args& a) = 0;
  QLORA_BACKEND_OPS(QLORA_DECLARE_OP)
#undef QLORA_DECLARE_OP
};

// Names of all ops in table order.
const std::vector<std::string>& backend_op_names();

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace qlora
