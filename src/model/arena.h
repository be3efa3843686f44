// Arena: allocates every planned buffer, one device allocation per memory category and one host
// allocation (Backend::alloc_host, pinned on CUDA) for the host buffers, and hands out views by
// name. A name that is not in the plan is an internal error. Buffers the backend
// allocates itself (BufferOwner::Backend) are skipped; op scratch (BufferOwner::ArenaScratch) is
// allocated here and bound to the backend until the Arena goes.
#pragma once
#include <map>
#include <string>
#include <unordered_map>

#include "backend/backend.h"
#include "core/memory_plan.h"

namespace qlora {

class Arena {
 public:
  Arena(Backend& be, const MemoryPlan& plan);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  bool has(const std::string& name) const { return slots_.count(name) != 0; }
  // View of a planned buffer with its planned dtype and shape (up to 4 dims).
  Tensor get(const std::string& name) const;
  void* raw(const std::string& name) const;
  // Bytes allocated per category, as handed to the backend (for the plan-equals-allocation test).
  const std::map<MemCategory, int64_t>& allocated() const { return allocated_; }
  // Host bytes allocated for the plan's host buffers (offloaded activations; not the backend's own).
  int64_t host_allocated() const { return host_allocated_; }

 private:
  struct Slot { void* ptr; const PlannedBuffer* buf; };
  Backend& be_;
  MemoryPlan plan_;
  std::unordered_map<std::string, Slot> slots_;
  std::map<MemCategory, int64_t> allocated_;
  std::vector<void*> blocks_;
  void* host_block_ = nullptr;
  int64_t host_allocated_ = 0;
  bool bound_scratch_ = false;
};

}  // namespace qlora
