// config.json of a Hugging Face model: architecture, sizes, rope scaling, tied embeddings,
// quantization_config.
#include "fuzz_common.h"
#include "model/llama_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qlora::fuzz::expect_clean_error([&] {
    qlora::LlamaConfig c = qlora::parse_hf_config(std::string(qlora::fuzz::as_text(data, size)), "fuzz/config.json");
    qlora::rope_inv_freq(c);
  });
  return 0;
}
