// MemoryPlan: every buffer the engine allocates (name, bytes, category, lifetime). The engine
// allocates exactly from it and `qlora plan` prints it, so prediction and allocation cannot differ.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qlora {

enum class MemCategory { Weights, Lora, Grads, Optimizer, Activations, Logits, Workspace, Overhead };
const char* mem_category_name(MemCategory c);
constexpr int kNumMemCategories = 8;

enum class Lifetime { Persistent, Step, Layer };  // whole run | one training step | one layer's use

// Who allocates a buffer. Arena: the model's Arena. ArenaScratch: the Arena, which then hands it
// to the backend as op scratch (Backend::bind_scratch). Backend: the backend itself, when it is
// made (CUDA: the cuBLASLt workspace, the error record, the pinned upload staging); the Arena
// skips it, and the backend allocates exactly the planned bytes.
enum class BufferOwner { Arena, ArenaScratch, Backend };

struct PlannedBuffer {
  std::string name;      // "layers.3.attn.q_proj.lora_A", "act.layers.3.qkv", ...
  int64_t bytes = 0;     // exact bytes requested (before 256-byte alignment)
  MemCategory category = MemCategory::Workspace;
  Lifetime lifetime = Lifetime::Persistent;
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  bool host = false;     // lives in pinned host memory (activation offload), not on the device
  BufferOwner owner = BufferOwner::Arena;
};

struct MemoryPlan {
  std::vector<PlannedBuffer> buffers;
  // Library/runtime overhead that is estimated, not planned (CUDA context, cuBLAS workspace, ...).
  std::vector<std::pair<std::string, int64_t>> overhead;

  static int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }
  void add(std::string name, MemCategory cat, DType dt, std::vector<int64_t> shape,
           Lifetime life = Lifetime::Persistent);
  void add_bytes(std::string name, MemCategory cat, int64_t bytes, Lifetime life = Lifetime::Persistent);
  // Aligned device bytes per category (sum over non-host buffers), overhead under MemCategory::Overhead.
  std::map<MemCategory, int64_t> bytes_by_category() const;
  int64_t total_bytes() const;       // device bytes: all categories incl. overhead
  int64_t host_bytes() const;        // pinned host bytes (offloaded activations)
  const PlannedBuffer* find(const std::string& name) const;
};

}  // namespace qlora
