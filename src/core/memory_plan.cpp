// MemoryPlan bookkeeping: adding buffers and summing them per category.
#include "core/memory_plan.h"

#include "core/error.h"

namespace qlora {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Weights: return "weights";
    case MemCategory::Lora: return "lora";
    case MemCategory::Grads: return "grads";
    case MemCategory::Optimizer: return "optimizer";
    case MemCategory::Activations: return "activations";
    case MemCategory::Logits: return "logits";
    case MemCategory::Workspace: return "workspace";
    case MemCategory::Overhead: return "overhead";
  }
  return "?";
}

void MemoryPlan::add(std::string name, MemCategory cat, DType dt, std::vector<int64_t> shape, Lifetime life) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  PlannedBuffer b;
  b.name = std::move(name);
  b.bytes = n * dtype_size(dt);
  b.category = cat;
  b.lifetime = life;
  b.shape = std::move(shape);
  b.dtype = dt;
  buffers.push_back(std::move(b));
}

void MemoryPlan::add_bytes(std::string name, MemCategory cat, int64_t bytes, Lifetime life) {
  PlannedBuffer b;
  b.name = std::move(name);
  b.bytes = bytes;
  b.category = cat;
  b.lifetime = life;
  b.shape = {bytes};
  b.dtype = DType::U8;
  buffers.push_back(std::move(b));
}

std::map<MemCategory, int64_t> MemoryPlan::bytes_by_category() const {
  std::map<MemCategory, int64_t> m;
  for (const auto& b : buffers)
    if (!b.host) m[b.category] += aligned(b.bytes);
  for (const auto& [name, bytes] : overhead) m[MemCategory::Overhead] += bytes;
  return m;
}

int64_t MemoryPlan::total_bytes() const {
  int64_t t = 0;
  for (const auto& [c, b] : bytes_by_category()) t += b;
  return t;
}

int64_t MemoryPlan::host_bytes() const {
  int64_t t = 0;
  for (const auto& b : buffers)
    if (b.host) t += aligned(b.bytes);
  return t;
}

const PlannedBuffer* MemoryPlan::find(const std::string& name) const {
  for (const auto& b : buffers)
    if (b.name == name) return &b;
  return nullptr;
}

}  // namespace qlora
