// llama.cpp's pre-tokenizer names (a GGUF's tokenizer.ggml.pre) and the tokenizer.json pipelines
// they stand for: the one table GGUF import (text/tokenizer_load.cpp) and GGUF export
// (text/gguf_vocab_export.cpp) read. llama.cpp stores the name, not the pipeline; each name here
// stands for exactly the split llama.cpp's llama-vocab.cpp implements under it.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qlora {

struct GgufPreTokenizer {
  enum class Split { ByteLevel, DigitsThenByteLevel, Regex };
  const char* name;                  // the name export writes for this pipeline
  std::vector<const char*> aliases;  // other names llama.cpp runs as the same split
  Split split;
  const char* regex = nullptr;            // Split::Regex: the pattern, as tokenizer.json writes it
  const char* llama_cpp_regex = nullptr;  // llama.cpp's own spelling, run on collapsed text (null: regex)
  bool ignore_merges = false;             // a pre-token that is a vocabulary entry is taken whole
  bool bos_by_default = false;            // llama.cpp adds BOS for the name where the file has no add_bos_token
  bool written = true;                    // export names a matching pipeline by this row (false: read only)
};

const std::vector<GgufPreTokenizer>& gguf_pre_tokenizers();
// The row for a tokenizer.ggml.pre value (its name or an alias), or null.
const GgufPreTokenizer* gguf_pre_tokenizer_named(const std::string& name);
// The tokenizer.json pre_tokenizer of a row.
nlohmann::json pre_tokenizer_json(const GgufPreTokenizer& p);
// The name llama.cpp knows a tokenizer.json pre_tokenizer by (export); Error(Unsupported) naming
// `where` when none matches.
std::string gguf_pre_tokenizer_name(const nlohmann::json& pre, const std::string& where);
// "gpt-2 (default, ...), smollm (...), ..." for messages.
std::string known_gguf_pre_tokenizers();

}  // namespace qlora
