// CpuBackend: the fp32 reference backend (plain loops + OpenMP, GEMM through OpenBLAS).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace qlora {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  DeviceKind device() const override { return DeviceKind::Cpu; }
  DType compute_dtype() const override { return DType::F32; }
  std::string simd_kernels() const override;
  std::string blas_kernels() const override;
  int64_t memory_available() const override;

  void* alloc(size_t bytes) override;
  void free(void* p) noexcept override;
  void memset0(void* p, size_t bytes) override;
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void* alloc_host(size_t bytes) override { return alloc(bytes); }  // host memory is the device's
  void free_host(void* p) noexcept override { free(p); }

#define QLORA_CPU_DECLARE_OP(op, Args) void op(const Args& a) override;
  QLORA_BACKEND_OPS(QLORA_CPU_DECLARE_OP)
#undef QLORA_CPU_DECLARE_OP

 private:
  void rope_apply(const char* op, const RopeArgs& a, float sign);
  struct RopeTable {  // cos/sin (times scale) of the last positions seen, (N, R/2) each
    int64_t half = 0;
    float scale = 1.0f;
    std::vector<int32_t> positions;
    std::vector<float> inv_freq, cos, sin;
  };
  RopeTable rope_table_;
};

namespace cpu {

// Argument checks shared by the op files. A wrong dtype or a missing buffer is a bug in the
// caller (Error Internal); a size that disagrees with the op's dimensions is Error Shape.
// A tensor with ndim 0 is a bare pointer: only its dtype and data are checked.
void check_f32(const char* op, const char* tensor, const Tensor& t, int64_t numel);
void check_dim(const char* op, const char* dim, int64_t value);  // value >= 0
void check_ptr(const char* op, const char* what, const void* p);  // int32 side inputs

// The BLAS this backend runs on, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH ... (openmp threads, core Haswell)".
std::string blas_info();

// Below this many elements an OpenMP region costs more than it saves.
inline constexpr int64_t kParallelMin = 1 << 14;

}  // namespace cpu
}  // namespace qlora
