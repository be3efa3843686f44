// Arena failure paths: an allocation failing half-way gives back what was taken; freeing never throws.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>

#include "core/error.h"
#include "forwarding_backend.h"
#include "model/arena.h"

using namespace qlora;

namespace {

// CPU memory that refuses the n-th allocation and counts what is live.
class FailingBackend : public testing_util::ForwardingCpu {
 public:
  explicit FailingBackend(int fail_at) : fail_at_(fail_at) {}
  void* alloc(size_t bytes) override {
    if (++allocs == fail_at_) fail(ErrorKind::Config, "test alloc", "out of memory (simulated)");
    live++;
    return cpu_->alloc(bytes);
  }
  void free(void* p) noexcept override {
    live--;
    cpu_->free(p);
  }
  int allocs = 0, live = 0;

 private:
  int fail_at_;
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
