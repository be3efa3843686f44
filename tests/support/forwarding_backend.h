// A test backend that forwards everything to the CPU backend; tests override what they watch.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace qlora::testing_util {

class ForwardingCpu : public Backend {
 public:
  std::string name() const override { return "forwarding-cpu"; }
  DeviceKind device() const override { return DeviceKind::Cpu; }
  DType compute_dtype() const override { return DType::F32; }
  void* alloc(size_t bytes) override { return cpu_->alloc(bytes); }
  void free(void* p) noexcept override { cpu_->free(p); }
  void memset0(void* p, size_t bytes) override { cpu_->memset0(p, bytes); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { cpu_->copy_to_device(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { cpu_->copy_to_host(dst, src, bytes); }
  void* alloc_host(size_t bytes) override { return cpu_->alloc_host(bytes); }
  void free_host(void* p) noexcept override { cpu_->free_host(p); }
#define QLORA_FORWARD_OP(op, Args) \
  void op(const Args& a) override { cpu_->op(a); }
  QLORA_BACKEND_OPS(QLORA_FORWARD_OP)
#undef QLORA_FORWARD_OP

 protected:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
};

}  // namespace qlora::testing_util
