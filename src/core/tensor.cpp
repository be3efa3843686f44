// Tensor view helpers.
#include "core/tensor.h"

namespace qlora {

std::string Tensor::shape_str() const {
  std::string s = "(";
  for (int i = 0; i < ndim; i++) s += (i ? "," : "") + std::to_string(shape[size_t(i)]);
  return s + ")";
}

}  // namespace qlora
