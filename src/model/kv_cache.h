// Generation state of the decoder: the planned KV cache (ModelPlanOptions::kv_cache_tokens
// positions per layer, "kv.layers.<l>.k" / ".v") and the logits after the last decoded token.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace qlora {

struct KvCache {
  std::vector<Tensor> k, v;   // per layer (kv_cache_tokens, kv_dim); empty without a cache
  int64_t pos = 0;            // positions filled
  std::vector<float> logits;  // (V) after the last decoded token
};

}  // namespace qlora
