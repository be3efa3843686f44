// GGUF: header, metadata key/values (every type, nested arrays), tensor infos and offsets; then
// what the loader derives from them: the Llama config, the tokenizer and small tensors' values.
#include <vector>

#include "fuzz_common.h"
#include "io/gguf.h"
#include "model/gguf_model.h"
#include "text/tokenizer.h"

using namespace qlora;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::expect_clean_error([&] {
    GgufFile f = GgufFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
    for (const auto& key : f.keys()) {
      fuzz::expect_clean_error([&] {
        switch (f.type_of(key)) {
          case GgufType::STRING: f.get_string(key); break;
          case GgufType::BOOL: f.get_bool(key); break;
          case GgufType::F32: case GgufType::F64: f.get_f64(key); break;
          case GgufType::ARRAY:
            if (f.get_array_type(key) == GgufType::STRING) f.get_array_strings(key);
            else if (f.get_array_type(key) == GgufType::F32 || f.get_array_type(key) == GgufType::F64) f.get_array_f64(key);
            else f.get_array_i64(key);
            break;
          default: f.get_i64(key); break;
        }
      });
    }
    for (const auto& t : f.tensors())
      if (t.n_elements() <= (1 << 16)) fuzz::expect_clean_error([&] { f.read_tensor_f32(t.name); });
    fuzz::expect_clean_error([&] { gguf_llama_config(f); });
    fuzz::expect_clean_error([&] {
      Tokenizer tok = Tokenizer::from_gguf(f);
      tok.decode(tok.encode("Hello world <|im_end|>", true));
    });
  });
  return 0;
}
