// bitsandbytes 4-bit checkpoints: the quantized weight, absmax (plain or double-quantized), code
// tables and the quant_state JSON blob, checked against each other and against the shape the
// model expects; a weight that passes is dequantized.
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "model/bnb_checkpoint.h"

using namespace qlora;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const json config = json::parse(R"({"quantization_config": {
    "quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": true, "bnb_4bit_quant_storage": "uint8",
    "bnb_4bit_compute_dtype": "float32"}})");
  const std::string path = fuzz::write_input(data, size, ".safetensors");
  fuzz::expect_clean_error([&] {
    SafetensorsArchive ar(path);
    auto cq = read_checkpoint_quant(config, ar, "fuzz/config.json");
    if (!cq) return;
    for (const auto& name : ar.names()) {
      if (!name.ends_with(".weight") || !is_quantized_weight(ar, *cq, name)) continue;
      // The model's expected shape: 64x64 (the seed's q_proj); a fuzzed quant_state must agree.
      fuzz::expect_clean_error([&] {
        QuantizedTensor q = read_quantized_weight(ar, *cq, name, 64, 64);
        std::vector<float> w(size_t(q.numel()));
        dequantize_ref(q, w.data());
      });
    }
  });
  return 0;
}
