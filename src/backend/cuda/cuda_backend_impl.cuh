// CudaBackend: the op table on one GPU (one stream, cuBLASLt GEMMs, own kernels). Internal header.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <vector>
#include <set>
#include <tuple>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda_scratch.h"

namespace qlora::cuda {

// Op scratch slots (backend/cuda_scratch.h names and sizes them). With a model, each slot is a
// buffer of the memory plan that the Arena binds (bind_scratch): an op needing more than that is
// an Internal error. Without a bound buffer (op tests and kernel benchmarks, which plan no model)
// a slot grows on demand (synchronize, free, allocate) and is kept.
enum class Scratch : int {
  MatmulCvt = int(cuda_plan::ScratchSlot::MatmulCvtA),   // matmul's F32 A rounded to BF16 (mixed-dtype matmul)
  MatmulCvtB = int(cuda_plan::ScratchSlot::MatmulCvtB),  // matmul's F32 B rounded to BF16
  AttnDq = int(cuda_plan::ScratchSlot::AttnDqAcc),       // (B,T,Hq,Dp) F32 dq accumulator of attention_bwd
  AttnDelta = int(cuda_plan::ScratchSlot::AttnDelta),    // (B,Hq,T) F32 rowsum(dO*O) of attention_bwd
  Reduce = int(cuda_plan::ScratchSlot::ReducePartials),  // partial sums (sumsq, rmsnorm dw)
  Fp8Act = int(cuda_plan::ScratchSlot::Fp8Act),          // matmul_fp8's activation amax, scale and e4m3 codes
  Fp4Act = int(cuda_plan::ScratchSlot::Fp4Act),          // matmul_fp4's activation scales, e2m1 codes, tiles
  kCount = cuda_plan::kNumScratchSlots
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  DeviceKind device() const override { return DeviceKind::Cuda; }
  DType compute_dtype() const override { return DType::BF16; }
  bool has_fp8_gemm() const override { return cc_ >= 89; }     // compute capability 8.9 or later
  bool has_fp4_gemm() const override { return cc_ / 10 == 10; }  // block-scaled FP4: 10.x (sm_100/103)

  void* alloc(size_t bytes) override;
  void free(void* p) noexcept override;
  void memset0(void* p, size_t bytes) override;
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void* alloc_host(size_t bytes) override;  // pinned (cudaMallocHost)
  void free_host(void* p) noexcept override;
  void synchronize() override;
  void bind_scratch(const std::string& name, void* p, size_t bytes) override;
  void unbind_scratch() noexcept override;
  bool plans_own_memory() const override { return true; }
  int64_t memory_available() const override;  // cudaMemGetInfo's free bytes

#define QLORA_CUDA_DECLARE_OP(op, Args) void op(const Args& a) override;
  QLORA_BACKEND_OPS(QLORA_CUDA_DECLARE_OP)
#undef QLORA_CUDA_DECLARE_OP

  cudaStream_t stream() const { return stream_; }
  int sm_count() const { return sm_count_; }
  // `op` names the caller in the error when a bound slot is too small (by default, the slot's op).
  void* scratch(Scratch slot, size_t bytes, const char* op = nullptr);
  // Device bytes this backend allocated itself: cuBLASLt workspace, error record, unbound slots.
  size_t scratch_bytes() const;
  DeviceErrorRecord* device_errors() const { return d_err_; }
  // The main stream waits for a prefetched dequantization (DequantizeArgs::prefetch) that wrote
  // the memory at p, if one is pending; matmul calls it for its operands.
  void wait_prefetched(const void* p);

 private:
  void init();              // the constructor's work; on a throw the constructor calls release()
  void release() noexcept;  // frees every handle made so far
  void check_device_errors();

  int device_ = 0;
  int sm_count_ = 0;
  int cc_ = 0;  // compute capability major * 10 + minor, read once when the backend is made
  size_t smem_optin_ = 0;  // largest dynamic shared memory a block may opt in to
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  size_t lt_workspace_bytes_ = 0;
  DeviceErrorRecord* d_err_ = nullptr;
  // Uploads go through two pinned host buffers in turn (made on first use): the host copy into
  // one overlaps the DMA out of the other, the DMA runs at pinned-memory speed, and the caller's
  // buffer is free as soon as copy_to_device returns.
  static constexpr size_t kStagingBytes = size_t(cuda_plan::kStagingBytes);
  std::array<void*, size_t(cuda_plan::kStagingBuffers)> staging_{};
  std::array<cudaEvent_t, size_t(cuda_plan::kStagingBuffers)> staging_done_{};
  int staging_next_ = 0;
  // Work beside the main stream (cuda_side_stream.cu): a stream made on first use, after an event
  // on stream_, and the device ranges its work writes or reads, pending until stream_ waits for
  // them (side_wait). prefetch_: dequantizations (DequantizeArgs::prefetch), waited for by the
  // first matmul reading them; copies_: activation offload copies, waited for by offload_wait.
  struct SideStream {
    struct Pending {
      const char *begin, *end;
      cudaEvent_t ready;
    };
    cudaStream_t s = nullptr;
    std::vector<Pending> pending;
  };
  SideStream prefetch_, copies_;
  std::vector<cudaEvent_t> free_events_;
  cudaEvent_t take_event();  // from free_events_, or a new one
  cudaStream_t side_begin(SideStream& side);  // the stream to issue on, after stream_'s work so far
  void side_end(SideStream& side, const void* p, int64_t bytes);  // [p, p+bytes) pending until waited for
  void side_wait(SideStream& side, const void* p, int64_t bytes);  // stream_ waits for pending overlaps
  void side_sync(SideStream& side);                 // the host waits for what is still pending
  void side_release(SideStream& side) noexcept;
  std::array<void*, size_t(Scratch::kCount)> scratch_{};
  std::array<size_t, size_t(Scratch::kCount)> scratch_size_{};
  std::array<bool, size_t(Scratch::kCount)> scratch_bound_{};  // the memory plan's buffer (not ours to free)

  // cuBLASLt heuristic results by problem; querying the heuristic costs tens of microseconds.
  struct GemmKey {
    int64_t m, n, k;
    int ta, tb, a_t, b_t, c_t, align_a, align_b, align_c, beta_zero;
    auto tie() const { return std::tie(m, n, k, ta, tb, a_t, b_t, c_t, align_a, align_b, align_c, beta_zero); }
    bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
  };
  // Everything cuBLASLt needs for one problem, made once (descriptors, layouts, the heuristic's
  // algorithm) and kept until release(): a repeated shape costs only the cublasLtMatmul call.
  struct LtPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<GemmKey, LtPlan> lt_plans_;
  // The low-precision GEMMs' (matmul_fp8, matmul_fp4) last step of making a plan: the preference
  // (the workspace, 16-byte alignment of every operand) and the heuristic's algorithm. Where
  // cuBLASLt has none, the plan's descriptors are destroyed and `op` fails as Unsupported naming
  // the problem; `kind` says which kernel is missing ("FP8", "block-scaled FP4").
  void lt_choose_lowp_algo(LtPlan& plan, const char* op, const char* kind, int64_t m, int64_t in, int64_t out);
  // cuDNN fused attention (cudnn_attention.cu): the device's compute capability, the cuDNN handle
  // and the built graphs by shape, made on the first attention call.
  std::shared_ptr<struct CudnnAttnState> cudnn_attn_;
  friend struct CudnnAttnAccess;
  std::set<GemmKey> no_lt_algo_;     // problems cuBLASLt has no kernel for: cublasGemmEx instead
  cublasHandle_t blas_ = nullptr;    // created on first use of that fallback
  friend void lt_matmul(CudaBackend& be, const MatmulArgs& a, const void* a_ptr, DType a_t, const void* b_ptr,
                        DType b_t);
  friend void gemm_ex_fallback(CudaBackend& be, const MatmulArgs& a, const void* a_ptr, DType a_t, const void* b_ptr,
                               DType b_t);
};

// dequantize_bf16 (dequant.h) ordered on stream s of `be`.
struct QuantDeviceView;
void dequantize_bf16_on(CudaBackend& be, const QuantDeviceView& q, void* out, cudaStream_t s);

// Launchers implemented in the per-family .cu files (host functions, stream-ordered).
void lt_matmul(CudaBackend& be, const MatmulArgs& a, const void* a_ptr, DType a_t, const void* b_ptr, DType b_t);
void convert_to_bf16(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t s);
// Attention kernels need more than 48 KiB of shared memory; this raises their limits once.
void attention_set_smem_limits();
size_t attention_fwd_smem_bytes(int64_t head_dim);
size_t attention_bwd_smem_bytes(int64_t head_dim);

}  // namespace qlora::cuda
