#include "text/gguf_pretokenizers.h"

#include "core/error.h"
#include "text/tokenizer_pretok.h"

namespace qlora {

using json = nlohmann::json;
using Split = GgufPreTokenizer::Split;

const std::vector<GgufPreTokenizer>& gguf_pre_tokenizers() {
  static const std::vector<GgufPreTokenizer> rows = {
      {.name = "gpt-2", .aliases = {"default", "gpt2", "olmo", "phi-2"}, .split = Split::ByteLevel},
      // SmolLM / StarCoder: digits split one by one, then GPT-2's regex.
      {.name = "smollm", .aliases = {"starcoder", "refact", "codeshell"}, .split = Split::DigitsThenByteLevel},
      {.name = "llama-bpe",
       .aliases = {"llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"},
       .split = Split::Regex,
       .regex = kLlama3Pattern,
       .ignore_merges = true,
       .bos_by_default = true},
      // Llama 3's split merging by rank: cl100k vocabularies (DBRX; Phi-4 14B's GGUFs carry this name
      // too, as far as we know). Export names Llama 3's split llama-bpe.
      {.name = "dbrx", .aliases = {}, .split = Split::Regex, .regex = kLlama3Pattern, .written = false},
      {.name = "qwen2", .aliases = {"deepseek-r1-qwen", "kormo", "f2llmv2"}, .split = Split::Regex, .regex = kQwen2Pattern},
      // o200k (Phi-4-mini, gpt-oss): the pipeline holds o200k's regex, as their tokenizer.json does;
      // llama.cpp runs its own spelling on collapsed text, where a non-ASCII letter is both upper and
      // lower case and a combining mark no letter ("ÉCOLE", "helloМосква", "e" + U+0301 split
      // otherwise than transformers splits them).
      {.name = "gpt-4o",
       .aliases = {"llama4", "kanana2", "talkie"},
       .split = Split::Regex,
       .regex = kO200kPattern,
       .llama_cpp_regex = kO200kLlamaCppPattern},
      // Mistral's Tekken (NeMo, Small 3, Ministral): run as gpt-4o is, ignoring merges for a
      // pre-token that is a vocabulary entry.
      {.name = "tekken",
       .aliases = {},
       .split = Split::Regex,
       .regex = kTekkenPattern,
       .llama_cpp_regex = kTekkenLlamaCppPattern,
       .ignore_merges = true,
       .bos_by_default = true},
  };
  return rows;
}

const GgufPreTokenizer* gguf_pre_tokenizer_named(const std::string& name) {
  for (const GgufPreTokenizer& p : gguf_pre_tokenizers()) {
    if (name == p.name) return &p;
    for (const char* a : p.aliases)
      if (name == a) return &p;
  }
  return nullptr;
}

namespace {

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

bool is_byte_level(const json& p, bool use_regex) {
  return p.is_object() && p.value("type", "") == "ByteLevel" && p.value("use_regex", true) == use_regex &&
         !p.value("add_prefix_space", false);
}

std::string split_regex(const json& p) {
  if (!p.is_object() || p.value("type", "") != "Split" || !p.contains("pattern") || !p["pattern"].is_object()) return "";
  return p["pattern"].value("Regex", "");
}

// Which split a tokenizer.json pre_tokenizer is, with its regex for Split::Regex; false: none of them.
bool split_of(const json& pre, Split* split, std::string* regex) {
  if (is_byte_level(pre, true)) return *split = Split::ByteLevel, true;
  if (!pre.is_object() || pre.value("type", "") != "Sequence" || !pre.contains("pretokenizers")) return false;
  const json& s = pre["pretokenizers"];
  if (s.size() != 2) return false;
  if (s[0].value("type", "") == "Digits" && s[0].value("individual_digits", false) && is_byte_level(s[1], true))
    return *split = Split::DigitsThenByteLevel, true;
  if (!is_byte_level(s[1], false)) return false;
  *regex = split_regex(s[0]);
  return *split = Split::Regex, !regex->empty();
}

}  // namespace

json pre_tokenizer_json(const GgufPreTokenizer& p) {
  switch (p.split) {
    case Split::ByteLevel: return byte_level(true);
    case Split::DigitsThenByteLevel:
      return {{"type", "Sequence"},
              {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}};
    case Split::Regex:
      return {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"}, {"pattern", {{"Regex", p.regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                byte_level(false)}}};
  }
  return byte_level(true);
}

std::string gguf_pre_tokenizer_name(const json& pre, const std::string& where) {
  Split split;
  std::string regex;
  if (split_of(pre, &split, &regex))
    for (const GgufPreTokenizer& p : gguf_pre_tokenizers())
      if (p.written && p.split == split && (split != Split::Regex || regex == p.regex)) return p.name;
  fail(ErrorKind::Unsupported, where + ": pre_tokenizer", "this pre-tokenizer has no known llama.cpp name",
       "known: GPT-2 byte level (gpt-2), SmolLM digits + byte level (smollm), Llama 3 (llama-bpe), Qwen2 (qwen2), "
       "o200k (gpt-4o), Tekken (tekken); "
       "export from a GGUF of the model where the engine reads one (llama, qwen2, qwen3), which names its "
       "pre-tokenizer, else `qlora merge` and llama.cpp's convert_hf_to_gguf.py");
}

std::string known_gguf_pre_tokenizers() {
  std::string s;
  for (const GgufPreTokenizer& p : gguf_pre_tokenizers()) {
    s += (s.empty() ? "" : ", ") + std::string(p.name);
    if (!p.aliases.empty()) {
      std::string a;
      for (const char* x : p.aliases) a += (a.empty() ? "" : ", ") + std::string(x);
      s += " (" + a + ")";
    }
  }
  return s;
}

}  // namespace qlora
