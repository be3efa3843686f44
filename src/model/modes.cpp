#include "model/modes.h"

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

const char* gemm_dtype_name(GemmDtype g) {
  switch (g) {
    case GemmDtype::Bf16: return "bf16";
    case GemmDtype::Fp8: return "fp8";
    case GemmDtype::Fp4: return "fp4";
  }
  return "bf16";
}

GemmDtype parse_gemm_dtype(const std::string& value, const std::string& key) {
  for (GemmDtype g : {GemmDtype::Bf16, GemmDtype::Fp8, GemmDtype::Fp4})
    if (value == gemm_dtype_name(g)) return g;
  const std::vector<std::string> choices = {"bf16", "fp8", "fp4"};
  const std::string close = closest_name(choices, value, 3);
  fail(ErrorKind::Config, key + " " + value, "unknown value '" + value + "'",
       (close.empty() ? std::string() : "did you mean '" + close + "'? ") + "choose one of bf16, fp8, fp4");
}

}  // namespace qlora
