// CpuBackend memory (aligned host allocations), argument checks and the factory.
#include "backend/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_simd.h"
#include "core/error.h"
#include "core/host_memory.h"

namespace qlora {

static constexpr size_t kAlign = 256;

void* CpuBackend::alloc(size_t bytes) {
  // aligned_alloc wants a size that is a multiple of the alignment; a zero-byte request still
  // gets a real block so every alloc has a matching free.
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded == 0) rounded = kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p)
    fail(ErrorKind::Config, "cpu backend alloc",
         "out of host memory allocating " + std::to_string(bytes) + " bytes",
         "lower per_device_train_batch_size or max_length, or check `qlora plan`");
  std::memset(p, 0, rounded);
  return p;
}

void CpuBackend::free(void* p) noexcept { std::free(p); }

std::string CpuBackend::simd_kernels() const { return cpu::simd_level(); }

int64_t CpuBackend::memory_available() const { return available_host_bytes(); }

std::string CpuBackend::blas_kernels() const { return cpu::blas_info(); }

void CpuBackend::memset0(void* p, size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}

void CpuBackend::copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes) std::memcpy(dst, host_src, bytes);
}

void CpuBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(host_dst, src, bytes);
}

namespace cpu {

static std::string where_of(const char* op, const char* tensor) {
  return std::string("cpu op ") + op + ", tensor '" + tensor + "'";
}

void check_f32(const char* op, const char* tensor, const Tensor& t, int64_t numel) {
  if (t.data == nullptr && numel > 0)
    fail(ErrorKind::Internal, where_of(op, tensor), "buffer is null",
         "allocate the tensor before calling the op");
  if (t.dtype != DType::F32)
    fail(ErrorKind::Internal, where_of(op, tensor),
         std::string("dtype is ") + dtype_name(t.dtype) + ", the CPU backend computes in f32",
         "convert the tensor to f32 before handing it to the cpu backend");
  if (t.ndim > 0 && t.numel() != numel)
    fail(ErrorKind::Shape, where_of(op, tensor),
         "has shape " + t.shape_str() + " (" + std::to_string(t.numel()) + " elements) but the op needs " +
             std::to_string(numel) + " elements",
         "check the op's dimension arguments against the tensor view");
}

void check_dim(const char* op, const char* dim, int64_t value) {
  if (value < 0)
    fail(ErrorKind::Shape, std::string("cpu op ") + op + ", dimension '" + dim + "'",
         "is negative (" + std::to_string(value) + ")");
}

void check_ptr(const char* op, const char* what, const void* p) {
  if (p == nullptr)
    fail(ErrorKind::Internal, where_of(op, what), "pointer is null");
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace qlora
