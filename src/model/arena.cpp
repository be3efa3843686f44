// Arena implementation: sums aligned sizes per category, allocates once, slices, and hands the
// planned op scratch to the backend.
#include "model/arena.h"

#include "core/error.h"

namespace qlora {

Arena::Arena(Backend& be, const MemoryPlan& plan) : be_(be), plan_(plan) {
  std::map<MemCategory, int64_t> sizes;
  int64_t host = 0;
  for (const auto& b : plan_.buffers)
    if (b.owner != BufferOwner::Backend) (b.host ? host : sizes[b.category]) += MemoryPlan::aligned(b.bytes);
  std::map<MemCategory, char*> base, cursor;
  char* host_cursor = nullptr;
  try {
    if (host > 0) {
      host_block_ = be_.alloc_host(size_t(host));
      if (!host_block_) fail(ErrorKind::Io, "memory", "host allocation of " + std::to_string(host) + " bytes failed");
      host_cursor = static_cast<char*>(host_block_);
      host_allocated_ = host;
    }
    for (const auto& [cat, bytes] : sizes) {
      void* p = be_.alloc(size_t(bytes));
      if (!p) fail(ErrorKind::Io, "memory", std::string("allocation of ") + std::to_string(bytes) +
                                                " bytes for " + mem_category_name(cat) + " failed");
      blocks_.push_back(p);
      base[cat] = cursor[cat] = static_cast<char*>(p);
      allocated_[cat] = bytes;
    }
    for (const auto& b : plan_.buffers) {
      if (slots_.count(b.name)) fail(ErrorKind::Internal, "memory plan", "buffer '" + b.name + "' planned twice");
      if (b.owner == BufferOwner::Backend) continue;  // the backend allocated it when it was made
      char*& at = b.host ? host_cursor : cursor[b.category];
      slots_[b.name] = Slot{at, &b};
      at += MemoryPlan::aligned(b.bytes);
    }
    // Op scratch is the backend's to use, sized by the plan (Backend::bind_scratch).
    for (const auto& b : plan_.buffers)
      if (b.owner == BufferOwner::ArenaScratch) {
        bound_scratch_ = true;
        be_.bind_scratch(b.name, slots_.at(b.name).ptr, size_t(b.bytes));
      }
  } catch (...) {  // a failure half-way: the blocks already taken go back before the error does
    if (bound_scratch_) be_.unbind_scratch();
    for (void* p : blocks_) be_.free(p);
    if (host_block_) be_.free_host(host_block_);
    throw;
  }
}

Arena::~Arena() {
  if (bound_scratch_) be_.unbind_scratch();
  for (void* p : blocks_) be_.free(p);
  if (host_block_) be_.free_host(host_block_);
}

void* Arena::raw(const std::string& name) const {
  auto it = slots_.find(name);
  if (it == slots_.end()) fail(ErrorKind::Internal, "arena", "buffer '" + name + "' is not in the memory plan");
  return it->second.ptr;
}

Tensor Arena::get(const std::string& name) const {
  auto it = slots_.find(name);
  if (it == slots_.end()) fail(ErrorKind::Internal, "arena", "buffer '" + name + "' is not in the memory plan");
  const PlannedBuffer& b = *it->second.buf;
  Tensor t;
  t.data = it->second.ptr;
  t.dtype = b.dtype;
  t.ndim = int(b.shape.size() > 4 ? 4 : b.shape.size());
  for (int i = 0; i < t.ndim; i++) t.shape[size_t(i)] = b.shape[size_t(i)];
  return t;
}

}  // namespace qlora
