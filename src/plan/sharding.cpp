// Dividing a replica's buffers across data-parallel ranks (ZeRO-1/2/3, FSDP).
#include "plan/sharding.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "io/json_util.h"

namespace qlora {

bool shards_category(Sharding s, MemCategory c) {
  switch (c) {
    case MemCategory::Optimizer: return s != Sharding::None;
    case MemCategory::Grads: return s == Sharding::Zero2 || s == Sharding::Zero3;
    case MemCategory::Weights: return s == Sharding::Zero3 || s == Sharding::Fsdp;  // fsdp: decoder layers only
    case MemCategory::Lora: return s == Sharding::Zero3;
    default: return false;
  }
}

std::string shard_unit(const std::string& name) {
  if (name.rfind("layers.", 0) == 0) {
    size_t dot = name.find('.', 7);
    return dot == std::string::npos ? name : name.substr(0, dot);
  }
  size_t dot = name.find('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

MemoryPlan shard_plan(const MemoryPlan& replica, Sharding s, int world) {
  if (world < 1) fail(ErrorKind::Config, "--gpus-per-node/--nodes", "world size must be >= 1");
  if (world == 1 || s == Sharding::None || s == Sharding::Fsdp) return replica;
  MemoryPlan out;
  out.overhead = replica.overhead;
  std::map<std::string, int64_t> param_unit, grad_unit;  // full (unsharded) bytes per unit
  for (const auto& b : replica.buffers) {
    if (b.category == MemCategory::Weights || b.category == MemCategory::Lora) param_unit[shard_unit(b.name)] += b.bytes;
    if (b.category == MemCategory::Grads) grad_unit[shard_unit(b.name)] += b.bytes;
    if (!shards_category(s, b.category) || b.host) {
      out.buffers.push_back(b);
      continue;
    }
    PlannedBuffer p = b;
    p.name = b.name + ".shard";
    if (b.dtype == DType::U8 && b.shape.size() == 1 && b.shape[0] == b.bytes) {  // raw-byte buffer (quantized storage)
      p.bytes = (b.bytes + world - 1) / world;
      p.shape = {p.bytes};
    } else {
      int64_t n = 1;
      for (int64_t d : b.shape) n *= d;
      const int64_t per = (n + world - 1) / world;
      p.shape = {per};
      p.bytes = per * dtype_size(b.dtype);
    }
    out.buffers.push_back(std::move(p));
  }
  auto biggest = [](const std::map<std::string, int64_t>& m) {
    int64_t x = 0;
    for (const auto& [k, v] : m) x = std::max(x, v);
    return x;
  };
  if (s == Sharding::Zero3)
    for (int i = 0; i < 2; i++)
      out.add_bytes("zero3.gather." + std::to_string(i), MemCategory::Workspace, biggest(param_unit), Lifetime::Layer);
  if ((s == Sharding::Zero2 || s == Sharding::Zero3) && biggest(grad_unit) > 0)
    out.add_bytes("zero.grad_unit", MemCategory::Workspace, biggest(grad_unit), Lifetime::Layer);
  return out;
}

}  // namespace qlora
