#include "model/modes.h"

#include "core/error.h"
#include "io/json_util.h"

namespace qlora {

namespace {

// The mode of `modes` whose name is `value`; else an Error(Config) naming `key`, the value, the
// closest name and `choices` (the names, with what each does where that helps).
template <class Mode>
Mode parse_mode(const std::string& value, const std::string& key, const std::vector<Mode>& modes,
                const char* (*name)(Mode), const std::string& choices) {
  std::vector<std::string> names;
  for (Mode m : modes) {
    if (value == name(m)) return m;
    names.push_back(name(m));
  }
  const std::string close = closest_name(names, value, 3);
  fail(ErrorKind::Config, key + " " + value, "unknown value '" + value + "'",
       (close.empty() ? std::string() : "did you mean '" + close + "'? ") + "choose one of " + choices);
}

}  // namespace

const char* checkpointing_name(Checkpointing c) {
  switch (c) {
    case Checkpointing::None: return "none";
    case Checkpointing::Full: return "full";
    case Checkpointing::Offload: return "offload";
  }
  return "none";
}

Checkpointing parse_checkpointing(const std::string& value, const std::string& key) {
  return parse_mode(value, key, checkpointing_modes(), checkpointing_name,
                    "none (keep every activation), full (recompute each layer), offload (full, with the layer "
                    "inputs in host memory)");
}

const std::vector<Checkpointing>& checkpointing_modes() {
  static const std::vector<Checkpointing> m = {Checkpointing::None, Checkpointing::Full, Checkpointing::Offload};
  return m;
}

const char* gemm_dtype_name(GemmDtype g) {
  switch (g) {
    case GemmDtype::Bf16: return "bf16";
    case GemmDtype::Fp8: return "fp8";
    case GemmDtype::Fp4: return "fp4";
  }
  return "bf16";
}

GemmDtype parse_gemm_dtype(const std::string& value, const std::string& key) {
  static const std::vector<GemmDtype> all = {GemmDtype::Bf16, GemmDtype::Fp8, GemmDtype::Fp4};
  return parse_mode(value, key, all, gemm_dtype_name, "bf16, fp8, fp4");
}

}  // namespace qlora
