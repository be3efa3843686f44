// ZeRO / FSDP sharding of a single-replica MemoryPlan into one GPU's plan, and the GPU topology.
#pragma once
#include <cstdint>
#include <string>

#include "core/memory_plan.h"
#include "model/modes.h"

namespace qlora {

// Sharding (model/modes.h): ZeRO-1 splits optimizer state, ZeRO-2 also gradients, ZeRO-3 also the
// parameters, trainable and frozen base alike (4-bit bases are sharded as their stored bytes). Fsdp
// is what the engine runs; its plan is the engine's buffer list for a rank, not shard_plan's.

struct Topology {
  int gpus_per_node = 1;
  int nodes = 1;
  int world() const { return gpus_per_node * nodes; }
};

bool shards_category(Sharding s, MemCategory c);

// Group a buffer belongs to for gathering: "layers.<l>" for decoder-layer buffers, else its own name.
std::string shard_unit(const std::string& buffer_name);

// One GPU's plan: every buffer of a sharded category becomes "<name>.shard" holding
// ceil(elements / world) elements; buffers sharding itself needs are added as workspace:
//   zero3.gather.{0,1}  two full units of parameters (the layer in use and the prefetched next)
//   zero.grad_unit      one full unit of gradients before its reduce-scatter (ZeRO-2/3)
// With world == 1, Sharding::None or Sharding::Fsdp (planned by the engine's list) the plan is
// returned unchanged.
MemoryPlan shard_plan(const MemoryPlan& replica, Sharding s, int world);

}  // namespace qlora
