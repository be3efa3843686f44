// What the engine does not implement for a model, its options and a device, named in one place:
// DecoderModel's constructor refuses the first limit (Error Unsupported, before anything is
// allocated) and `qlora plan` warns with each, so the plan and the engine cannot drift apart.
#pragma once
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/model_plan.h"

namespace qlora {

enum class DeviceKind;  // backend/backend.h

struct EngineLimit {
  std::string where;  // the model and what of it: "model 'x', head_dim 256"
  std::string what;   // what is not implemented
  std::string hint;   // what to do instead
};

std::vector<EngineLimit> engine_limits(const LlamaConfig& c, const ModelPlanOptions& o, DeviceKind device);

}  // namespace qlora
