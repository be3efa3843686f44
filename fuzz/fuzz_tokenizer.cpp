// tokenizer.json: the JSON itself, the model (BPE vocab and merges), normalizers, pre-tokenizers
// (regex patterns compiled with PCRE2), post-processors, decoders and added tokens; a tokenizer
// that loads then encodes and decodes a fixed text.
#include "fuzz_common.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qlora::fuzz::expect_clean_error([&] {
    qlora::Tokenizer tok = qlora::Tokenizer::from_json(qlora::fuzz::as_text(data, size), "fuzz/tokenizer.json");
    const auto ids = tok.encode("Hello, world! 123 \xc3\xa9t\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd <s> \xff end", true);
    tok.decode(ids, false);
    tok.decode(ids, true);
  });
  return 0;
}
