#include "model/checkpointing.h"

#include "core/error.h"
#include "io/json_util.h"

namespace qlora {

const char* checkpointing_name(Checkpointing c) {
  switch (c) {
    case Checkpointing::None: return "none";
    case Checkpointing::Full: return "full";
    case Checkpointing::Offload: return "offload";
  }
  return "none";
}

Checkpointing parse_checkpointing(const std::string& value, const std::string& key) {
  for (Checkpointing c : checkpointing_modes())
    if (value == checkpointing_name(c)) return c;
  const std::vector<std::string> choices = {"none", "full", "offload"};
  const std::string close = closest_name(choices, value, 3);
  fail(ErrorKind::Config, key + " " + value, "unknown value '" + value + "'",
       (close.empty() ? std::string() : "did you mean '" + close + "'? ") +
           "choose one of none (keep every activation), full (recompute each layer), offload (full, with the "
           "layer inputs in host memory)");
}

const std::vector<Checkpointing>& checkpointing_modes() {
  static const std::vector<Checkpointing> m = {Checkpointing::None, Checkpointing::Full, Checkpointing::Offload};
  return m;
}

}  // namespace qlora
