// Safetensors: the 8-byte header length, the JSON header (dtypes, shapes, data_offsets,
// __metadata__) and the data section it describes; every float tensor is then converted.
#include "fuzz_common.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = qlora::fuzz::write_input(data, size, ".safetensors");
  qlora::fuzz::expect_clean_error([&] {
    qlora::SafetensorsArchive ar(path);
    for (const auto& name : ar.names()) {
      const auto& t = ar.get(name);
      if (t.numel() > (1 << 16)) continue;
      if (t.dtype == qlora::DType::F32 || t.dtype == qlora::DType::F16 || t.dtype == qlora::DType::BF16)
        ar.read_f32(name, t.shape);
    }
  });
  return 0;
}
