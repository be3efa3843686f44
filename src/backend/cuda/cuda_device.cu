// CUDA device discovery, the factory, and CudaBackend's memory, copies, scratch and error plumbing.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cudnn_attention.h"

namespace qlora {

// Compiled once per -gencode target; the host pass sees none, device passes record their arch.
// One thread: it is only ever launched as <<<1, 1>>>.
__global__ void __launch_bounds__(1) arch_probe_kernel(int* out) {
#ifdef __CUDA_ARCH__
  *out = __CUDA_ARCH__;
#elif defined(QLORA_CUDA_EMU)
  *out = ::qlora::emu::arch() * 10;  // the host harness runs every architecture's code
#endif
}

CudaDeviceInfo cuda_device_info() {
  CudaDeviceInfo info;
  if (cudaGetDeviceCount(&info.count) != cudaSuccess) {
    cudaGetLastError();
    info.count = 0;
    return info;
  }
  if (info.count == 0) return info;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
    cudaGetLastError();
    info.count = 0;
    return info;
  }
  info.name = p.name;
  info.sm_major = p.major;
  info.sm_minor = p.minor;
  info.total_bytes = p.totalGlobalMem;
  return info;
}

std::string cuda_built_archs() {
#ifdef QLORA_CUDA_ARCHS
  return QLORA_CUDA_ARCHS;
#else
  return "see CMAKE_CUDA_ARCHITECTURES";
#endif
}

std::unique_ptr<Backend> make_cuda_backend(std::string* why) {
  CudaDeviceInfo info = cuda_device_info();
  if (info.count == 0) {
    if (why) *why = "no CUDA device found";
    return nullptr;
  }
  const std::string dev = info.name + " (sm_" + std::to_string(info.sm_major) + std::to_string(info.sm_minor) + ")";
  if (info.sm_major < 8) {
    if (why) *why = dev + " is older than sm_80; the bf16 tensor-core kernels need Ampere or newer";
    return nullptr;
  }
  // Check that this binary carries code the device can run before promising anything: a cubin
  // built for sm_90a or sm_100a loads only on that exact chip.
  int* d = nullptr;
  int arch = -1;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = dev + ": cannot allocate device memory";
    return nullptr;
  }
  cuda::launch(arch_probe_kernel, {1, 1}, d);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(&arch, d, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess || arch < 800) {
    cudaGetLastError();
    if (why)
      *why = dev + " cannot run this binary's kernels (built for " + cuda_built_archs() + ")" +
             (e != cudaSuccess ? std::string(": ") + cudaGetErrorString(e) : std::string()) +
             "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(info.sm_major) + std::to_string(info.sm_minor);
    return nullptr;
  }
  try {
    auto be = std::make_unique<cuda::CudaBackend>(0);
    if (why) *why = "using " + dev;
    return be;
  } catch (const Error& err) {
    if (why) *why = dev + ": " + err.message();
    return nullptr;
  }
}

void* cuda_stream_of(Backend& be) {
  auto* c = dynamic_cast<cuda::CudaBackend*>(&be);
  return c ? static_cast<void*>(c->stream()) : nullptr;
}

size_t cuda_scratch_bytes(const Backend& be) {
  auto* c = dynamic_cast<const cuda::CudaBackend*>(&be);
  return c ? c->scratch_bytes() : 0;
}

int64_t cuda_device_used_bytes() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return int64_t(total_b - free_b);
}

namespace cuda {

int64_t CudaBackend::memory_available() const {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return int64_t(free_b);
}

void fail_cuda(cudaError_t e, const char* expr, const char* file, int line) {
  cudaGetLastError();  // clear a sticky-free error so the next call can report its own
  fail(ErrorKind::Internal, std::string(file) + ":" + std::to_string(line),
       std::string(expr) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")",
       "run under compute-sanitizer to find the faulting kernel");
}

static std::string where_of(const char* op, const char* name) {
  return std::string("cuda op ") + op + ", tensor '" + name + "'";
}

void check_tensor(const char* op, const char* name, const Tensor& t, int64_t numel, bool allow_bf16, bool allow_f32) {
  if (t.data == nullptr && numel > 0)
    fail(ErrorKind::Internal, where_of(op, name), "buffer is null", "allocate the tensor before calling the op");
  const bool ok = (allow_bf16 && t.dtype == DType::BF16) || (allow_f32 && t.dtype == DType::F32);
  if (!ok)
    fail(ErrorKind::Internal, where_of(op, name),
         std::string("dtype is ") + dtype_name(t.dtype) + "; this op takes " +
             (allow_bf16 && allow_f32 ? "bf16 or f32" : allow_bf16 ? "bf16" : "f32"),
         "see docs/cuda_backend.md for the dtype combinations each CUDA op supports");
  if (t.ndim > 0 && t.numel() != numel)
    fail(ErrorKind::Shape, where_of(op, name),
         "has shape " + t.shape_str() + " (" + std::to_string(t.numel()) + " elements) but the op needs " +
             std::to_string(numel) + " elements",
         "check the op's dimension arguments against the tensor view");
}

void check_softcap(const char* op, float softcap) {
  if (!(softcap >= 0.0f) || !std::isfinite(softcap))
    fail(ErrorKind::Internal, std::string("cuda op ") + op + ", argument 'softcap'",
         "must be 0 or positive and finite, got " + std::to_string(softcap));
}

void check_dim(const char* op, const char* dim, int64_t value) {
  if (value < 0)
    fail(ErrorKind::Shape, std::string("cuda op ") + op + ", dimension '" + dim + "'",
         "is negative (" + std::to_string(value) + ")");
}

void check_ptr(const char* op, const char* what, const void* p) {
  if (p == nullptr) fail(ErrorKind::Internal, where_of(op, what), "pointer is null");
}

void unsupported(const char* op, const std::string& what, const std::string& hint) {
  fail(ErrorKind::Unsupported, std::string("cuda op ") + op, what,
       hint.empty() ? "see docs/cuda_backend.md for what the CUDA backend supports" : hint);
}

CudaBackend::CudaBackend(int device) : device_(device) {
  try {
    init();
  } catch (...) {  // a constructor that throws runs no destructor: give back what was made so far
    release();
    throw;
  }
}

void CudaBackend::init() {
  QLORA_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp p{};
  QLORA_CUDA_CHECK(cudaGetDeviceProperties(&p, device_));
  sm_count_ = p.multiProcessorCount;
  cc_ = p.major * 10 + p.minor;
  smem_optin_ = p.sharedMemPerBlockOptin;
  QLORA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (cublasLtCreate(&lt_) != CUBLAS_STATUS_SUCCESS)
    fail(ErrorKind::Internal, "cuda backend", "cublasLtCreate failed", "check the CUDA driver and cuBLAS install");
  // Exactly the sizes the memory plan lists (backend/cuda_scratch.h): 32 MiB of cuBLASLt
  // workspace and one 256-byte granule for the error record.
  static_assert(sizeof(DeviceErrorRecord) <= size_t(cuda_plan::kErrorRecordBytes), "error record outgrew its plan");
  lt_workspace_bytes_ = size_t(cuda_plan::kLtWorkspaceBytes);
  QLORA_CUDA_CHECK(cudaMalloc(&lt_workspace_, lt_workspace_bytes_));
  QLORA_CUDA_CHECK(cudaMalloc(&d_err_, size_t(cuda_plan::kErrorRecordBytes)));
  // On the compute stream: it is non-blocking, so nothing orders it after legacy-stream work.
  QLORA_CUDA_CHECK(cudaMemsetAsync(d_err_, 0, size_t(cuda_plan::kErrorRecordBytes), stream_));
  QLORA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (attention_fwd_smem_bytes(128) > smem_optin_ || attention_bwd_smem_bytes(128) > smem_optin_)
    fail(ErrorKind::Unsupported, "cuda backend",
         "the device allows " + std::to_string(smem_optin_) + " bytes of shared memory per block; attention needs " +
             std::to_string(attention_bwd_smem_bytes(128)));
  attention_set_smem_limits();
}

CudaBackend::~CudaBackend() { release(); }

// Destructors must not throw: errors here are ignored (the context is going away anyway). Safe
// on a half-built backend: every handle starts null.
void CudaBackend::release() noexcept {
  side_release(copies_);
  side_release(prefetch_);
  if (stream_) cudaStreamSynchronize(stream_);
  cudnn_attention_release(*this);  // the cuDNN handle, before the stream it runs on
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  free_events_.clear();
  for (size_t i = 0; i < scratch_.size(); i++) {
    if (scratch_[i] && !scratch_bound_[i]) cudaFree(scratch_[i]);  // a bound slot is the Arena's
    scratch_[i] = nullptr;
    scratch_size_[i] = 0;
    scratch_bound_[i] = false;
  }
  if (d_err_) cudaFree(d_err_);
  for (size_t i = 0; i < staging_.size(); i++) {
    if (staging_done_[i]) cudaEventDestroy(staging_done_[i]);
    if (staging_[i]) cudaFreeHost(staging_[i]);
    staging_done_[i] = nullptr;
    staging_[i] = nullptr;
  }
  for (auto& [key, plan] : lt_plans_) {
    if (plan.c) cublasLtMatrixLayoutDestroy(plan.c);
    if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.op) cublasLtMatmulDescDestroy(plan.op);
  }
  lt_plans_.clear();
  if (lt_workspace_) cudaFree(lt_workspace_);
  if (lt_) cublasLtDestroy(lt_);
  if (blas_) cublasDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
  d_err_ = nullptr;
  lt_workspace_ = nullptr;
  lt_ = nullptr;
  blas_ = nullptr;
  stream_ = nullptr;
}

void* CudaBackend::alloc(size_t bytes) {
  void* p = nullptr;
  const size_t n = bytes ? bytes : 256;  // every alloc gets a real block so free always matches
  const cudaError_t e = cudaMalloc(&p, n);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail(ErrorKind::Config, "cuda backend alloc",
         "out of GPU memory allocating " + std::to_string(bytes) + " bytes (" + std::to_string(free_b >> 20) +
             " MiB free of " + std::to_string(total_b >> 20) + " MiB)",
         "lower per_device_train_batch_size or max_length, enable gradient_checkpointing, or check `qlora plan`");
  }
  QLORA_CUDA_CHECK(e);
  QLORA_CUDA_CHECK(cudaMemsetAsync(p, 0, n, stream_));
  QLORA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return p;
}

// Errors are not raised here: after a sticky CUDA error every call fails, and the error that
// matters has already been thrown by the op that met it (this runs while that one unwinds).
void CudaBackend::free(void* p) noexcept {
  if (!p) return;
  cudaStreamSynchronize(stream_);
  cudaFree(p);
}

void CudaBackend::memset0(void* p, size_t bytes) {
  if (bytes) QLORA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
}

// Through the pinned staging buffers, 16 MiB at a time: before a buffer is refilled its previous
// DMA must be done (its event); the caller's buffer is read only by the memcpy here, so it can be
// reused or freed at once, and the upload itself stays ordered on the stream.
void CudaBackend::copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (!bytes) return;
  if (!staging_[0]) {
    for (size_t i = 0; i < staging_.size(); i++) {
      QLORA_CUDA_CHECK(cudaMallocHost(&staging_[i], kStagingBytes));
      QLORA_CUDA_CHECK(cudaEventCreateWithFlags(&staging_done_[i], cudaEventDisableTiming));
    }
  }
  const auto* src = static_cast<const unsigned char*>(host_src);
  auto* d = static_cast<unsigned char*>(dst);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(kStagingBytes, bytes - done);
    const int slot = staging_next_;
    staging_next_ = (staging_next_ + 1) % int(staging_.size());
    QLORA_CUDA_CHECK(cudaEventSynchronize(staging_done_[size_t(slot)]));  // its last DMA has finished
    std::memcpy(staging_[size_t(slot)], src + done, n);
    QLORA_CUDA_CHECK(cudaMemcpyAsync(d + done, staging_[size_t(slot)], n, cudaMemcpyHostToDevice, stream_));
    QLORA_CUDA_CHECK(cudaEventRecord(staging_done_[size_t(slot)], stream_));
    done += n;
  }
}

void CudaBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  wait_prefetched(src);
  if (bytes) QLORA_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, stream_));
  QLORA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  check_device_errors();
}

void CudaBackend::synchronize() {
  side_sync(prefetch_);
  side_sync(copies_);
  QLORA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  check_device_errors();
}

void CudaBackend::check_device_errors() {
  // The record is read and cleared on the compute stream, which the kernels that write it run on
  // (a non-blocking stream: legacy-stream copies and memsets would not be ordered with them). A
  // copy into pageable memory (`rec`) returns only when it is done: no synchronize is needed.
  DeviceErrorRecord rec{};
  QLORA_CUDA_CHECK(cudaMemcpyAsync(&rec, d_err_, sizeof(rec), cudaMemcpyDeviceToHost, stream_));
  if (rec.code == kErrNone) return;
  QLORA_CUDA_CHECK(cudaMemsetAsync(d_err_, 0, sizeof(DeviceErrorRecord), stream_));
  QLORA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (rec.code == kErrAttnDocs)
    fail(ErrorKind::Internal, "cuda op attention_fwd/attention_bwd (cuDNN path)",
         "the packed batch has " + std::to_string(rec.index) + " documents but the call said at most " +
             std::to_string(rec.value) + " (AttentionFwdArgs::n_docs); its attention output is wrong",
         "pass the batch's document count, or set QLORA_ATTENTION_KERNEL=own");
  if (rec.code == kErrTokenRange)
    fail(ErrorKind::Data, "cuda op embedding_fwd/embedding_bwd, token " + std::to_string(rec.index),
         "token id " + std::to_string(rec.value) + " is outside the vocabulary",
         "the tokenizer and the model disagree on vocab_size");
  fail(ErrorKind::Data, "cuda op cross_entropy_fwd_bwd, row " + std::to_string(rec.index),
       "label " + std::to_string(rec.value) + " is outside the vocabulary", "labels must be token ids or -100 (ignored)");
}

static const char* scratch_user(Scratch slot) {
  switch (slot) {
    case Scratch::MatmulCvt:
    case Scratch::MatmulCvtB: return "matmul";
    case Scratch::AttnDq:
    case Scratch::AttnDelta: return "attention_bwd";
    case Scratch::Reduce: return "sumsq/rmsnorm_bwd";
    case Scratch::Fp8Act: return "matmul_fp8";
    case Scratch::Fp4Act: return "matmul_fp4";
    case Scratch::kCount: break;
  }
  return "?";
}

void CudaBackend::bind_scratch(const std::string& name, void* p, size_t bytes) {
  const cuda_plan::ScratchSlot s = cuda_plan::scratch_slot_of(name);
  if (s == cuda_plan::ScratchSlot::kCount)
    fail(ErrorKind::Internal, "cuda backend bind_scratch", "the memory plan's buffer '" + name + "' is no scratch slot",
         "backend/cuda_scratch.h names the slots");
  if (!p && bytes > 0) fail(ErrorKind::Internal, "cuda backend bind_scratch", "buffer '" + name + "' is null");
  const size_t i = size_t(s);
  if (scratch_[i] && !scratch_bound_[i]) {  // a slot grown before the plan came: give it back
    QLORA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    QLORA_CUDA_CHECK(cudaFree(scratch_[i]));
  }
  scratch_[i] = p;
  scratch_size_[i] = bytes;
  scratch_bound_[i] = true;
}

void CudaBackend::unbind_scratch() noexcept {
  cudaStreamSynchronize(stream_);  // kernels may still use the buffers; errors surface elsewhere
  for (size_t i = 0; i < scratch_.size(); i++)
    if (scratch_bound_[i]) {
      scratch_[i] = nullptr;
      scratch_size_[i] = 0;
      scratch_bound_[i] = false;
    }
}

void* CudaBackend::scratch(Scratch slot, size_t bytes, const char* op) {
  const size_t i = size_t(slot);
  if (scratch_bound_[i]) {  // the memory plan sized it: never grow behind the plan's back
    if (bytes > scratch_size_[i])
      fail(ErrorKind::Internal, std::string("cuda op ") + (op ? op : scratch_user(slot)),
           "needs " + std::to_string(bytes) + " bytes of scratch '" +
               cuda_plan::scratch_buffer_name(cuda_plan::ScratchSlot(i)) + "' but the memory plan gave it " +
               std::to_string(scratch_size_[i]),
           "the plan's enumeration of this op's calls (model/backend_plan.cpp) misses this one");
    return scratch_[i];
  }
  if (scratch_size_[i] < bytes) {  // no plan (op tests, kernel benchmarks): grow and keep
    QLORA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // kernels may still read the old block
    if (scratch_[i]) QLORA_CUDA_CHECK(cudaFree(scratch_[i]));
    scratch_[i] = nullptr;
    scratch_size_[i] = 0;
    const size_t n = (bytes + (size_t(2) << 20) - 1) / (size_t(2) << 20) * (size_t(2) << 20);  // 2 MiB steps
    const cudaError_t e = cudaMalloc(&scratch_[i], n);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      fail(ErrorKind::Config, "cuda backend scratch",
           "out of GPU memory allocating " + std::to_string(n >> 20) + " MiB of op scratch",
           "lower per_device_train_batch_size, max_length or the cross-entropy chunk");
    }
    QLORA_CUDA_CHECK(e);
    scratch_size_[i] = n;
  }
  return scratch_[i];
}

size_t CudaBackend::scratch_bytes() const {
  size_t s = lt_workspace_bytes_ + size_t(cuda_plan::kErrorRecordBytes);
  for (size_t i = 0; i < scratch_size_.size(); i++)
    if (!scratch_bound_[i]) s += scratch_size_[i];
  return s;
}

}  // namespace cuda
}  // namespace qlora
