// GGUF vocabulary export: a tokenizer.json's vocabulary, merges or scores, token types, special ids and
// chat template as the tokenizer.* keys llama.cpp's convert_hf_to_gguf.py writes.
#include "text/gguf_vocab_export.h"

#include <filesystem>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "io/gguf_writer.h"
#include "io/json_util.h"
#include "text/gguf_pretokenizers.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;

namespace qlora {

namespace {

// A SentencePiece vocabulary carried as BPE with byte fallback, as llama.cpp's SPM tokenizer
// ("llama" vocabulary) runs it: spaces become U+2581 by a Replace normalizer (Gemma), optionally
// after a Prepend of U+2581 (Llama 2's legacy layout: llama.cpp's add_space_prefix), and nothing
// pre-tokenizes. tokenizers' newer layout for Llama 2 and Mistral instead replaces spaces in a
// Metaspace pre-tokenizer with no normalizer; llama.cpp has no such pipeline, and its converter
// writes these models (from their tokenizer.model) with add_space_prefix, so that is written too,
// with a note naming where llama.cpp then tokenizes differently. nullopt for any other pipeline.
struct SpmLayout {
  bool add_space_prefix = false;
  std::string note;  // "" when llama.cpp tokenizes exactly as the tokenizer.json does
};

std::optional<SpmLayout> sentencepiece_layout(const json& tj) {
  const json& model = tj["model"];
  if (!model.value("byte_fallback", false)) return std::nullopt;
  const bool has_pre = tj.contains("pre_tokenizer") && !tj["pre_tokenizer"].is_null();
  const bool has_norm = tj.contains("normalizer") && !tj["normalizer"].is_null();
  auto is_space_replace = [](const json& n) {
    return n.is_object() && n.value("type", "") == "Replace" && n.contains("pattern") && n["pattern"].is_object() &&
           n["pattern"].value("String", "") == " " && n.value("content", "") == "\xe2\x96\x81";
  };
  if (!has_pre && has_norm && tj["normalizer"].is_object()) {
    const json& n = tj["normalizer"];
    if (is_space_replace(n)) return SpmLayout{false, ""};
    if (n.value("type", "") == "Sequence" && n.contains("normalizers") && n["normalizers"].size() == 2 &&
        n["normalizers"][0].value("type", "") == "Prepend" && n["normalizers"][0].value("prepend", "") == "\xe2\x96\x81" &&
        is_space_replace(n["normalizers"][1]))
      return SpmLayout{true, ""};
    return std::nullopt;
  }
  if (!has_pre || has_norm || !tj["pre_tokenizer"].is_object()) return std::nullopt;
  const json& p = tj["pre_tokenizer"];
  if (p.value("type", "") != "Metaspace" || p.value("replacement", "") != "\xe2\x96\x81") return std::nullopt;
  std::string scheme = p.value("prepend_scheme", "always");
  if (p.contains("add_prefix_space") && p["add_prefix_space"].is_boolean() && !p["add_prefix_space"].get<bool>()) scheme = "never";
  const bool split = p.value("split", true);
  SpmLayout l;
  l.add_space_prefix = scheme != "never";
  std::vector<std::string> diffs;
  if (scheme == "first") diffs.push_back("puts a space before text that follows a special token");
  if (scheme != "never") diffs.push_back("puts one before text that already begins with a space");
  if (split) diffs.push_back("merges pieces across spaces, where this tokenizer splits the text at them");
  if (!diffs.empty()) {
    std::string d;
    for (size_t i = 0; i < diffs.size(); i++) d += (i ? (i + 1 == diffs.size() ? " and " : ", ") : "") + diffs[i];
    l.note = "tokenizer.json's Metaspace pre-tokenizer (prepend_scheme " + scheme + ", split " + (split ? "true" : "false") +
             ") is written as llama.cpp's SentencePiece vocabulary with add_space_prefix " +
             (l.add_space_prefix ? "true" : "false") + ", as convert_hf_to_gguf.py writes this model; llama.cpp " + d +
             ", so those prompts tokenize differently there";
  }
  return l;
}

// llama.cpp's SPM tokenizer merges, among adjacent pieces, the pair whose concatenation has the
// highest score; transformers' BPE the pair of lowest merge rank. A piece's score is minus the rank
// of the first merge that makes it, so both pick the same pair (a SentencePiece vocabulary's merges,
// as transformers converts them, list every split of a piece into two pieces, by the piece's own
// score). Pieces no merge makes are never the result of a merge there: they score below every merge.
std::vector<float> sentencepiece_scores(const std::vector<std::string>& tokens, const std::vector<std::string>& merges) {
  std::unordered_map<std::string, size_t> first;
  for (size_t r = 0; r < merges.size(); r++) {
    const size_t sp = merges[r].find(' ');
    first.emplace(merges[r].substr(0, sp) + merges[r].substr(sp + 1), r);
  }
  std::vector<float> scores(tokens.size());
  for (size_t i = 0; i < tokens.size(); i++) {
    const auto it = first.find(tokens[i]);
    scores[i] = it != first.end() ? -float(it->second) : -float(merges.size() + i);
  }
  return scores;
}

bool looks_special(const std::string& t) {  // convert_hf_to_gguf.py does_token_look_special
  auto wrap = [&](const std::string& a, const std::string& b) {
    return t.size() >= a.size() + b.size() && t.rfind(a, 0) == 0 && t.compare(t.size() - b.size(), b.size(), b) == 0;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrap("<|", "|>") ||
         wrap("<\xef\xbd\x9c", "\xef\xbd\x9c>") || wrap("<unused", ">");
}

// tokenizer.ggml.tokens and tokenizer.ggml.token_type, by token id.
struct VocabById {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
};

// tokenizer.json's vocabulary and added tokens in vocab_size slots; a slot no token names is
// "[PADi]" of type unused (5).
VocabById vocab_by_id(const json& tj, const std::string& path, int64_t vocab_size, bool spm) {
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size), std::string());
  std::vector<int32_t> types(size_t(vocab_size), 5);  // unused until filled
  std::vector<bool> set(size_t(vocab_size), false);
  auto put = [&](int64_t id, const std::string& t, int32_t type) {
    if (id < 0 || id >= vocab_size)
      fail(ErrorKind::Format, path, "token '" + t + "' has id " + std::to_string(id) + ", past the model's vocab_size " +
                                        std::to_string(vocab_size));
    tokens[size_t(id)] = t;
    types[size_t(id)] = type;
    set[size_t(id)] = true;
  };
  const std::string unk = tj["model"].contains("unk_token") && tj["model"]["unk_token"].is_string()
                              ? tj["model"]["unk_token"].get<std::string>()
                              : std::string();
  for (const auto& [t, id] : tj["model"]["vocab"].items()) {
    // SentencePiece's byte pieces "<0xNN>" are llama.cpp's BYTE tokens (6), its unknown piece UNKNOWN (2).
    const bool byte = spm && t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>';
    put(id.get<int64_t>(), t, byte ? 6 : spm && t == unk ? 2 : 1);
  }
  if (tj.contains("added_tokens"))
    for (const json& at : tj["added_tokens"]) {
      const std::string t = at.value("content", "");
      put(at.value("id", int64_t(-1)), t, spm && t == unk ? 2 : at.value("special", false) || looks_special(t) ? 3 : 4);
    }
  for (int64_t i = 0; i < vocab_size; i++)
    if (!set[size_t(i)]) tokens[size_t(i)] = "[PAD" + std::to_string(i) + "]";
  return {std::move(tokens), std::move(types)};
}

// tokenizer.json's merges as "left right", from either of its spellings (a string or a pair).
std::vector<std::string> merges_of(const json& tj) {
  std::vector<std::string> merges;
  if (tj["model"].contains("merges"))
    for (const json& m : tj["model"]["merges"])
      merges.push_back(m.is_array() ? m[0].get<std::string>() + " " + m[1].get<std::string>() : m.get<std::string>());
  return merges;
}

// tokenizer.ggml.model and the vocabulary's own keys: llama.cpp's "llama" vocabulary for a
// SentencePiece one, else its "gpt2" one under the pre-tokenizer `pre`.
void set_vocab_keys(GgufWriter& w, const VocabById& v, const std::vector<std::string>& merges,
                    const std::optional<SpmLayout>& spm, const std::string& pre) {
  if (spm) {  // convert_hf_to_gguf.py's _set_vocab_sentencepiece: no merges, a score per token
    w.set("tokenizer.ggml.model", gguf_str("llama"));
    w.set("tokenizer.ggml.tokens", gguf_str_array(v.tokens));
    w.set("tokenizer.ggml.scores", gguf_f32_array(sentencepiece_scores(v.tokens, merges)));
    w.set("tokenizer.ggml.token_type", gguf_i32_array(v.types));
    w.set("tokenizer.ggml.add_space_prefix", gguf_bool(spm->add_space_prefix));
  } else {
    w.set("tokenizer.ggml.model", gguf_str("gpt2"));
    w.set("tokenizer.ggml.pre", gguf_str(pre));
    w.set("tokenizer.ggml.tokens", gguf_str_array(v.tokens));
    w.set("tokenizer.ggml.token_type", gguf_i32_array(v.types));
    w.set("tokenizer.ggml.merges", gguf_str_array(merges));
  }
}

// tokenizer.ggml.{bos,eos,unknown,padding}_token_id.
void set_special_ids(GgufWriter& w, const std::string& dir, int64_t vocab_size, const Tokenizer& tok) {
  // The tokenizer's special ids, else config.json's <kind>_token_id (at its top, else in its
  // text_config), as gguf-py's SpecialVocab falls back to them.
  json config;
  if (fs::exists(dir + "/config.json")) config = read_json_file(dir + "/config.json");
  auto config_id = [&](const std::string& kind) -> std::optional<int32_t> {
    for (const json* c : {&config, config.contains("text_config") ? &config["text_config"] : nullptr})
      if (c && c->is_object() && c->contains(kind + "_token_id") && (*c)[kind + "_token_id"].is_number_integer()) {
        const int64_t id = (*c)[kind + "_token_id"].get<int64_t>();
        if (id >= 0 && id < vocab_size) return int32_t(id);
        return std::nullopt;
      }
    return std::nullopt;
  };
  auto special = [&](const char* key, const std::string& kind, std::optional<int32_t> id) {
    if (!id) id = config_id(kind);
    if (id) w.set(key, gguf_u32(uint32_t(*id)));
  };
  special("tokenizer.ggml.bos_token_id", "bos", tok.bos_id());
  special("tokenizer.ggml.eos_token_id", "eos", tok.eos_id());
  special("tokenizer.ggml.unknown_token_id", "unk", tok.unk_id());
  special("tokenizer.ggml.padding_token_id", "pad", tok.pad_id());
}

}  // namespace

void write_gguf_vocab(const std::string& dir, int64_t vocab_size, GgufWriter& w, std::vector<std::string>* notes) {
  const std::string path = dir + "/tokenizer.json";
  const json tj = read_json_file(path);
  const Tokenizer tok = Tokenizer::from_file(path);
  if (!tj.contains("model") || tj["model"].value("type", "") != "BPE")
    fail(ErrorKind::Unsupported, path + ": model.type",
         "only BPE vocabularies are exported (byte-level, or SentencePiece's carried as BPE with byte fallback)",
         "a Unigram vocabulary: export from a GGUF of the model where the engine reads one (llama, qwen2, qwen3), "
         "else `qlora merge` and llama.cpp's convert_hf_to_gguf.py");
  // SentencePiece-style (Gemma, Llama 2): llama.cpp's "llama" vocabulary with scores; else byte-level
  // BPE under one of the pre-tokenizers llama.cpp names.
  const std::optional<SpmLayout> spm = sentencepiece_layout(tj);
  if (spm && !spm->note.empty() && notes) notes->push_back(spm->note);
  const std::string pre = spm ? "" : gguf_pre_tokenizer_name(tj.contains("pre_tokenizer") ? tj["pre_tokenizer"] : json(), path);

  const VocabById vocab = vocab_by_id(tj, path, vocab_size, spm.has_value());
  const std::vector<std::string> merges = merges_of(tj);
  set_vocab_keys(w, vocab, merges, spm, pre);
  set_special_ids(w, dir, vocab_size, tok);
  const bool add_bos = tok.add_bos_token().value_or(!tok.special_prefix().empty());
  const bool add_eos = tok.add_eos_token().value_or(!tok.special_suffix().empty());
  w.set("tokenizer.ggml.add_bos_token", gguf_bool(add_bos));
  w.set("tokenizer.ggml.add_eos_token", gguf_bool(add_eos));
  if (!tok.chat_template().empty()) w.set("tokenizer.chat_template", gguf_str(tok.chat_template()));
}

}  // namespace qlora
