// Sources derived from another by renaming its tensors.
#include "model/tensor_source.h"

namespace qlora {

TensorSource renamed_source(const TensorSource& src, std::function<std::string(const std::string&)> name,
                            const std::string& description) {
  TensorSource out = src;
  out.description = description;
  out.has = [name, has = src.has](const std::string& n) { return has(name(n)); };
  out.read_f32 = [name, read = src.read_f32](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    read(name(n), shape, dst);
  };
  if (src.read_quantized)
    out.read_quantized = [name, read = src.read_quantized](const std::string& n, int64_t rows, int64_t cols,
                                                           QuantizedTensor& q) { return read(name(n), rows, cols, q); };
  return out;
}

}  // namespace qlora
