// Arena failure paths: an allocation failing half-way gives back what was taken; freeing never throws.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>

#include "core/error.h"
#include "model/arena.h"

using namespace qlora;

namespace {

// CPU memory that refuses the n-th allocation and counts what is live.
class FailingBackend : public Backend {
 public:
  explicit FailingBackend(int fail_at) : fail_at_(fail_at) {}
  std::string name() const override { return "failing"; }
  DeviceKind device() const override { return DeviceKind::Cpu; }
  DType compute_dtype() const override { return DType::F32; }
  void* alloc(size_t bytes) override {
    if (++allocs == fail_at_) fail(ErrorKind::Config, "test alloc", "out of memory (simulated)");
    live++;
    return cpu_->alloc(bytes);
  }
  void free(void* p) noexcept override {
    live--;
    cpu_->free(p);
  }
  void memset0(void* p, size_t bytes) override { cpu_->memset0(p, bytes); }
  void copy_to_device(void* d, const void* s, size_t n) override { cpu_->copy_to_device(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { cpu_->copy_to_host(d, s, n); }
#define QLORA_FORWARD_OP(op, Args) \
  void op(const Args& a) override { cpu_->op(a); }
  QLORA_BACKEND_OPS(QLORA_FORWARD_OP)
#undef QLORA_FORWARD_OP
  int allocs = 0, live = 0;

 private:
  int fail_at_;
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
};

MemoryPlan three_categories() {
  MemoryPlan p;
  p.add("w", MemCategory::Weights, DType::F32, {64});
  p.add("a", MemCategory::Activations, DType::F32, {64});
  p.add("g", MemCategory::Grads, DType::F32, {64});
  return p;
}

}  // namespace

TEST(Arena, AllocationFailingHalfWayFreesWhatWasTaken) {
  const MemoryPlan plan = three_categories();
  FailingBackend be(3);
  EXPECT_THROW(Arena(be, plan), Error);
  EXPECT_EQ(be.allocs, 3);
  EXPECT_EQ(be.live, 0);
}

TEST(Arena, BufferPlannedTwiceFreesItsBlocks) {
  MemoryPlan plan = three_categories();
  plan.buffers.push_back(plan.buffers[0]);  // the same name again
  FailingBackend be(0);
  EXPECT_THROW(Arena(be, plan), Error);
  EXPECT_GT(be.allocs, 0);
  EXPECT_EQ(be.live, 0);
}

TEST(Arena, DestructorFreesEveryBlock) {
  const MemoryPlan plan = three_categories();
  FailingBackend be(0);
  {
    Arena a(be, plan);
    EXPECT_EQ(be.live, 3);
  }
  EXPECT_EQ(be.live, 0);
}
