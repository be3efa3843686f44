// Looking a mode enum up by name, from its values and its name function (model/modes.h,
// train/train_modes.h): the one spelling of the inverse of each mode's name.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace qlora {

template <class Mode>
std::optional<Mode> mode_by_name(const std::vector<Mode>& values, const char* (*name_of)(Mode), const std::string& name) {
  for (Mode m : values)
    if (name == name_of(m)) return m;
  return std::nullopt;
}

}  // namespace qlora
