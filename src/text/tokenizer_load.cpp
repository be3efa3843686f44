// Tokenizer loaders: tokenizer.json (+ tokenizer_config.json, special_tokens_map.json,
// chat_template.jinja) and GGUF tokenizer.ggml.* metadata.
#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/strings.h"
#include "io/gguf.h"
#include "io/json_util.h"
#include "text/gguf_pretokenizers.h"
#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"
#include "text/tokenizer_json.h"

namespace qlora {
namespace {

// Token ids index dense tables (id -> token), so a lying id would allocate for every id below it.
// The largest vocabularies in use have ~1M entries.
constexpr int64_t kMaxTokenId = (int64_t(1) << 24) - 1;
int32_t checked_token_id(int64_t id, const std::string& where) {
  if (id < 0 || id > kMaxTokenId)
    fail(ErrorKind::Format, where, "token id " + std::to_string(id) + " is out of range",
         "ids go from 0 to " + std::to_string(kMaxTokenId));
  return static_cast<int32_t>(id);
}

using tokjson::json;
namespace fs = std::filesystem;

std::unique_ptr<BpeModel> parse_model(const json& j, const std::string& where) {
  tokjson::need_object(j, where);
  std::string type = tokjson::string_or(j, "type", tokjson::find(j, "merges") ? "BPE" : "", where);
  if (type != "BPE") {
    if (type.empty()) fail(ErrorKind::Format, tokjson::child(where, "type"), "missing");
    tokjson::unsupported_type(where, type, "BPE (WordPiece, Unigram and WordLevel are not implemented)");
  }
  BpeOptions opt;
  opt.unk_token = tokjson::string_or(j, "unk_token", "", where);
  opt.continuing_subword_prefix = tokjson::string_or(j, "continuing_subword_prefix", "", where);
  opt.end_of_word_suffix = tokjson::string_or(j, "end_of_word_suffix", "", where);
  opt.fuse_unk = tokjson::bool_or(j, "fuse_unk", false, where);
  opt.byte_fallback = tokjson::bool_or(j, "byte_fallback", false, where);
  opt.ignore_merges = tokjson::bool_or(j, "ignore_merges", false, where);

  std::string vw = tokjson::child(where, "vocab");
  const json& jv = tokjson::need(j, "vocab", where);
  if (!jv.is_object()) fail(ErrorKind::Format, vw, "expected an object of token -> id");
  Vocab vocab;
  vocab.reserve(jv.size());
  for (auto it = jv.begin(); it != jv.end(); ++it) {
    if (!it.value().is_number_integer())
      fail(ErrorKind::Format, vw + "['" + it.key() + "']", "expected an integer id");
    vocab.emplace(it.key(), checked_token_id(it.value().get<int64_t>(), vw + "['" + it.key() + "']"));
  }

  std::string mw = tokjson::child(where, "merges");
  std::vector<std::pair<std::string, std::string>> merges;
  if (const json* jm = tokjson::find(j, "merges")) {
    if (!jm->is_array()) fail(ErrorKind::Format, mw, "expected an array");
    merges.reserve(jm->size());
    for (size_t i = 0; i < jm->size(); ++i) {
      const json& m = (*jm)[i];
      if (m.is_string()) {  // "a b": exactly one space, as HF requires
        const std::string& s = m.get_ref<const std::string&>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail(ErrorKind::Format, tokjson::index(mw, i), "merge '" + s + "' is not two tokens");
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        fail(ErrorKind::Format, tokjson::index(mw, i), "expected \"a b\" or [\"a\", \"b\"]");
      }
    }
  }
  return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(opt), where);
}

std::vector<AddedToken> parse_added(const json* arr, const std::string& where) {
  std::vector<AddedToken> out;
  if (!arr) return out;
  if (!arr->is_array()) fail(ErrorKind::Format, where, "expected an array");
  for (size_t i = 0; i < arr->size(); ++i) {
    std::string w = tokjson::index(where, i);
    const json& a = (*arr)[i];
    AddedToken t;
    const int64_t id = tokjson::int_or(a, "id", -1, w);
    if (id < 0) fail(ErrorKind::Format, tokjson::child(w, "id"), "missing or negative");
    t.id = checked_token_id(id, tokjson::child(w, "id"));
    t.content = tokjson::need_string(a, "content", w);
    t.single_word = tokjson::bool_or(a, "single_word", false, w);
    t.lstrip = tokjson::bool_or(a, "lstrip", false, w);
    t.rstrip = tokjson::bool_or(a, "rstrip", false, w);
    t.special = tokjson::bool_or(a, "special", false, w);
    t.normalized = tokjson::bool_or(a, "normalized", !t.special, w);
    out.push_back(std::move(t));
  }
  return out;
}

// Post-processors reduce to ids before and after a single sequence.
void parse_post(const json& j, const std::string& where, std::vector<int32_t>& prefix,
                std::vector<int32_t>& suffix) {
  if (j.is_null()) return;
  tokjson::need_object(j, where);
  std::string type = tokjson::type_of(j, where);
  auto pair_id = [&](const char* key) {
    const json& v = tokjson::need(j, key, where);
    if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer())
      fail(ErrorKind::Format, tokjson::child(where, key), "expected [token, id]");
    return v[1].get<int32_t>();
  };
  if (type == "ByteLevel") return;  // offsets only
  if (type == "TemplateProcessing") {
    std::string sw = tokjson::child(where, "single");
    const json& single = tokjson::need(j, "single", where);
    const json& specials = tokjson::need(j, "special_tokens", where);
    if (!single.is_array()) fail(ErrorKind::Format, sw, "expected an array");
    std::vector<int32_t> pre, post;
    bool seen_seq = false;
    for (size_t i = 0; i < single.size(); ++i) {
      std::string iw = tokjson::index(sw, i);
      const json& item = single[i];
      if (tokjson::find(item, "Sequence")) {
        if (seen_seq) fail(ErrorKind::Unsupported, iw, "a single template with two sequences");
        seen_seq = true;
      } else if (const json* st = tokjson::find(item, "SpecialToken")) {
        std::string name = tokjson::need_string(*st, "id", tokjson::child(iw, "SpecialToken"));
        std::string spw = tokjson::child(tokjson::child(where, "special_tokens"), name);
        const json* sp = tokjson::find(specials, name);
        if (!sp) fail(ErrorKind::Format, spw, "missing: the template refers to it");
        const json& ids = tokjson::need(*sp, "ids", spw);
        if (!ids.is_array()) fail(ErrorKind::Format, tokjson::child(spw, "ids"), "expected an array");
        for (const json& id : ids) {
          if (!id.is_number_integer()) fail(ErrorKind::Format, tokjson::child(spw, "ids"), "expected integers");
          (seen_seq ? post : pre).push_back(id.get<int32_t>());
        }
      } else {
        fail(ErrorKind::Format, iw, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
    }
    prefix.insert(prefix.begin(), pre.begin(), pre.end());
    suffix.insert(suffix.end(), post.begin(), post.end());
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    int32_t cls = pair_id("cls"), sep = pair_id("sep");
    prefix.insert(prefix.begin(), cls);
    suffix.push_back(sep);
    return;
  }
  if (type == "Sequence") {
    std::string pw = tokjson::child(where, "processors");
    const json& arr = tokjson::need(j, "processors", where);
    if (!arr.is_array()) fail(ErrorKind::Format, pw, "expected an array");
    for (size_t i = 0; i < arr.size(); ++i) parse_post(arr[i], tokjson::index(pw, i), prefix, suffix);
    return;
  }
  tokjson::unsupported_type(where, type,
                            "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence");
}

// A special token named in tokenizer_config.json: "<s>" or {"content": "<s>", ...}.
std::optional<std::string> config_token(const json* cfg, const char* key) {
  if (!cfg) return std::nullopt;
  const json* v = tokjson::find(*cfg, key);
  if (!v) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object())
    if (const json* c = tokjson::find(*v, "content"); c && c->is_string()) return c->get<std::string>();
  return std::nullopt;
}

std::optional<bool> config_bool(const json* cfg, const char* key) {
  if (!cfg) return std::nullopt;
  const json* v = tokjson::find(*cfg, key);
  if (!v || !v->is_boolean()) return std::nullopt;
  return v->get<bool>();
}

std::string config_chat_template(const json* cfg, const std::string& where) {
  if (!cfg) return "";
  const json* v = tokjson::find(*cfg, "chat_template");
  if (!v) return "";
  if (v->is_string()) return v->get<std::string>();
  if (v->is_array()) {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
    std::string first;
    for (const json& e : *v) {
      std::string name = tokjson::string_or(e, "name", "", where);
      std::string tpl = tokjson::string_or(e, "template", "", where);
      if (name == "default") return tpl;
      if (first.empty()) first = tpl;
    }
    return first;
  }
  fail(ErrorKind::Format, where + ": chat_template", "expected a string or a list of {name, template}");
}

}  // namespace

// The tokenizer.json part, shared by all loaders; `model`: one built already (the root's "model"
// is then not read).
static void build_impl(Tokenizer::Impl& im, const json& root, std::unique_ptr<BpeModel> model = nullptr) {
  const std::string& n = im.name;
  tokjson::need_object(root, n);
  if (model) {
    im.bpe = std::move(model);
  } else {
    const json* jm = tokjson::find(root, "model");
    if (!jm) fail(ErrorKind::Format, n + ": model", "missing", "is this a Hugging Face tokenizer.json?");
    im.bpe = parse_model(*jm, n + ": model");
  }
  im.normalizer = parse_normalizer(root.value("normalizer", json()), n + ": normalizer");
  im.pre_tokenizer = parse_pre_tokenizer(root.value("pre_tokenizer", json()), n + ": pre_tokenizer");
  im.decoder = parse_decoder(root.value("decoder", json()), n + ": decoder");
  parse_post(root.value("post_processor", json()), n + ": post_processor", im.prefix, im.suffix);
  im.set_added_tokens(parse_added(tokjson::find(root, "added_tokens"), n + ": added_tokens"));
}

static void apply_config(Tokenizer& tok, Tokenizer::Impl& im, const json* cfg,
                         const json* special_map, const std::string& jinja,
                         const std::string& cfg_name) {
  auto resolve = [&](const char* key) -> std::optional<int32_t> {
    std::optional<std::string> t = config_token(cfg, key);
    if (!t) t = config_token(special_map, key);
    if (!t) return std::nullopt;
    return tok.token_to_id(*t);
  };
  im.bos = resolve("bos_token");
  im.eos = resolve("eos_token");
  im.pad = resolve("pad_token");
  im.unk = resolve("unk_token");
  if (!im.unk && im.bpe && !im.bpe->options().unk_token.empty())
    if (int32_t u = im.bpe->token_to_id(im.bpe->options().unk_token); u >= 0) im.unk = u;
  // Without a config the template's single leading special token is the BOS.
  if (!im.bos && !config_token(cfg, "bos_token") && im.prefix.size() == 1) im.bos = im.prefix[0];
  im.add_bos = config_bool(cfg, "add_bos_token");
  im.add_eos = config_bool(cfg, "add_eos_token");
  im.clean_up_spaces = config_bool(cfg, "clean_up_tokenization_spaces").value_or(false);
  im.chat_template = jinja.empty() ? config_chat_template(cfg, cfg_name) : jinja;
}

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& name,
                               std::string_view config_json) {
  json root = parse_json(text, name);
  json cfg;
  if (!config_json.empty()) cfg = parse_json(config_json, "tokenizer_config.json");
  auto im = std::make_shared<Impl>();
  im->name = name;
  build_impl(*im, root);
  Tokenizer tok(im);
  apply_config(tok, *im, cfg.is_object() ? &cfg : nullptr, nullptr, "", "tokenizer_config.json");
  return tok;
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) p /= "tokenizer.json";
  std::string text = read_text_file(p.string());
  fs::path dir = p.parent_path();
  auto read_opt_json = [&](const char* file, json& out) -> const json* {
    fs::path f = dir / file;
    std::error_code e;
    if (!fs::exists(f, e)) return nullptr;
    out = read_json_file(f.string());
    return out.is_object() ? &out : nullptr;
  };
  json cfg_store, map_store;
  const json* cfg = read_opt_json("tokenizer_config.json", cfg_store);
  const json* special_map = read_opt_json("special_tokens_map.json", map_store);
  std::string jinja;
  if (fs::exists(dir / "chat_template.jinja", ec)) jinja = read_text_file((dir / "chat_template.jinja").string());

  json root = parse_json(text, p.string());
  auto im = std::make_shared<Impl>();
  im->name = p.string();
  build_impl(*im, root);
  Tokenizer tok(im);
  apply_config(tok, *im, cfg, special_map, jinja, (dir / "tokenizer_config.json").string());
  return tok;
}

// ---- GGUF ----------------------------------------------------------------------------------

namespace {

// What from_gguf reads: the tokenizer.json fields (model, added_tokens, normalizer, pre_tokenizer,
// decoder) and the special ids, flags and chat template. A SentencePiece ("llama") vocabulary also
// carries its merges with their ranks (spm_*), which the JSON model cannot hold.
struct GgufVocab {
  json root;
  std::vector<std::string> tokens;
  std::optional<int32_t> bos, eos, pad, unk;
  std::optional<bool> add_bos, add_eos;
  std::string chat_template;
  // The split llama.cpp runs on collapsed text in place of the root's Split (llama_cpp_byte_level),
  // for names whose tokenizer.json regex llama.cpp rewrites; null for the others.
  const char* llama_cpp_split = nullptr;
  bool spm = false;
  bool add_space_prefix = false;
  Vocab spm_vocab;  // text -> id, the later id of a text listed twice
  std::vector<std::pair<std::string, std::string>> spm_merges;
  std::vector<uint32_t> spm_ranks;
};

const char* const kSpmSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

// llama.cpp's SPM tokenizer starts from the text's UTF-8 characters (their lengths from the lead
// byte) and repeatedly merges the adjacent pair whose concatenation is a token of the highest
// score, the leftmost among equal scores. As BPE: every split of a token into two tokens at a
// character boundary is a merge, ranked by the token's score (highest first, equal scores one
// rank). A text listed twice (llama.cpp refuses such a file) merges to its later id.
void spm_merges(const std::vector<float>& scores, GgufVocab& v) {
  const std::vector<std::string>& tokens = v.tokens;
  const Vocab& vocab = v.spm_vocab;
  std::vector<float> distinct;
  for (const auto& [text, id] : vocab) distinct.push_back(std::isnan(scores[size_t(id)]) ? -INFINITY : scores[size_t(id)]);
  std::sort(distinct.begin(), distinct.end(), std::greater<>());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  auto rank_of = [&](float s) {
    if (std::isnan(s)) s = -INFINITY;
    return uint32_t(std::lower_bound(distinct.begin(), distinct.end(), s, std::greater<>()) - distinct.begin());
  };
  auto char_len = [](unsigned char lead) -> size_t { return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; };
  for (int32_t id = 0; id < int32_t(tokens.size()); id++) {
    const std::string& t = tokens[size_t(id)];
    const auto self = vocab.find(std::string_view(t));
    if (self == vocab.end() || self->second != id) continue;  // a duplicate text: the later id merges
    const uint32_t rank = rank_of(scores[size_t(id)]);
    for (size_t k = char_len(static_cast<unsigned char>(t[0])); k < t.size(); k += char_len(static_cast<unsigned char>(t[k]))) {
      const std::string_view l(t.data(), k), r(t.data() + k, t.size() - k);
      if (vocab.find(l) != vocab.end() && vocab.find(r) != vocab.end()) {
        v.spm_merges.emplace_back(std::string(l), std::string(r));
        v.spm_ranks.push_back(rank);
      }
    }
  }
}

// The special ids and flags every GGUF vocabulary names the same way; `spm`: llama.cpp's defaults
// for a "llama" vocabulary where a key is missing (bos 1, eos 2, unk 0, add_bos).
void read_gguf_specials(const GgufFile& g, const std::vector<std::string>& tokens, bool spm, GgufVocab& v) {
  const std::string where = g.path();
  auto id_of = [&](const char* key, int32_t spm_default) -> std::optional<int32_t> {
    if (!g.has(key)) {
      if (spm && spm_default >= 0 && size_t(spm_default) < tokens.size()) return spm_default;
      return std::nullopt;
    }
    uint32_t id = g.get_u32(key);
    if (id >= tokens.size())
      fail(ErrorKind::Format, where + ": " + key, "id " + std::to_string(id) + " is past the vocab");
    return static_cast<int32_t>(id);
  };
  auto flag = [&](const char* key) -> std::optional<bool> {
    if (!g.has(key)) return std::nullopt;
    return g.get_bool(key);
  };
  v.bos = id_of("tokenizer.ggml.bos_token_id", 1);
  v.eos = id_of("tokenizer.ggml.eos_token_id", 2);
  v.pad = id_of("tokenizer.ggml.padding_token_id", -1);
  v.unk = id_of("tokenizer.ggml.unknown_token_id", 0);
  v.add_bos = flag("tokenizer.ggml.add_bos_token");
  v.add_eos = flag("tokenizer.ggml.add_eos_token");
  if (spm && !v.add_bos) v.add_bos = true;
  if (g.has("tokenizer.chat_template")) v.chat_template = g.get_string("tokenizer.chat_template");
}

// The token attributes llama.cpp sets by the model's name (llama-vocab.cpp, "set attributes by
// model/tokenizer/architecture name"), which the file does not hold: for a general.name containing
// "phi-3" or "phi3" (any case) every unknown, control and user-defined token ("</s>" among them)
// strips the whitespace after it (rstrip), as Phi-3's tokenizer.json marks its chat tokens, but
// "<unk>", "<s>" and "<|endoftext|>". `added` holds those tokens as tokenizer.json added tokens (a
// token of another type is never matched in the text, so its attribute does not matter).
void llama_cpp_name_attributes(const GgufFile& g, const std::vector<std::string>& tokens, json& added) {
  const std::string name =
      ascii_lower(g.has("general.name") && g.type_of("general.name") == GgufType::STRING ? g.get_string("general.name") : "");
  if (name.find("phi-3") == std::string::npos && name.find("phi3") == std::string::npos) return;
  for (json& a : added) {
    const std::string& text = tokens[a["id"].get<size_t>()];
    a["rstrip"] = text != "<unk>" && text != "<s>" && text != "<|endoftext|>";
  }
}

std::vector<int64_t> gguf_token_types(const GgufFile& g, size_t n_tokens) {
  std::vector<int64_t> types;
  if (g.has("tokenizer.ggml.token_type")) types = g.get_array_i64("tokenizer.ggml.token_type");
  if (!types.empty() && types.size() != n_tokens)
    fail(ErrorKind::Format, g.path() + ": tokenizer.ggml.token_type",
         std::to_string(types.size()) + " types for " + std::to_string(n_tokens) + " tokens");
  return types;
}

// A SentencePiece vocabulary ("llama": Llama 2, Mistral, Gemma, Phi-3) as llama.cpp's SPM
// tokenizer runs it: spaces become U+2581 (after one is put in front of each piece of text when
// add_space_prefix, the default), nothing pre-tokenizes, the merges come from the scores
// (spm_merges), characters no token covers fall back to the <0xNN> byte tokens. Control and
// unknown tokens are special added tokens, user-defined ones plain added tokens.
GgufVocab read_gguf_spm_vocab(const GgufFile& g) {
  const std::string where = g.path();
  GgufVocab v;
  v.spm = true;
  v.tokens = g.get_array_strings("tokenizer.ggml.tokens");
  const size_t n = v.tokens.size();
  for (size_t i = 0; i < n; i++)  // as llama.cpp names an empty token
    if (v.tokens[i].empty()) v.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";
  std::vector<float> scores(n, 0.0f);
  if (g.has("tokenizer.ggml.scores")) {
    std::vector<double> s = g.get_array_f64("tokenizer.ggml.scores");
    if (s.size() != n)
      fail(ErrorKind::Format, where + ": tokenizer.ggml.scores", std::to_string(s.size()) + " scores for " + std::to_string(n) + " tokens");
    for (size_t i = 0; i < n; i++) scores[i] = float(s[i]);
  }
  const std::vector<int64_t> types = gguf_token_types(g, n);
  v.spm_vocab.reserve(n);
  json added = json::array();
  for (size_t i = 0; i < n; i++) {
    v.spm_vocab.insert_or_assign(v.tokens[i], int32_t(i));
    const int64_t t = types.empty() ? 1 : types[i];
    if (t == 2 || t == 3 || t == 4)  // unknown, control -> special added token; user_defined -> plain added token
      added.push_back({{"id", i}, {"content", v.tokens[i]}, {"special", t != 4}, {"normalized", false}});
  }
  llama_cpp_name_attributes(g, v.tokens, added);
  spm_merges(scores, v);
  read_gguf_specials(g, v.tokens, true, v);
  v.add_space_prefix = g.has("tokenizer.ggml.add_space_prefix") ? g.get_bool("tokenizer.ggml.add_space_prefix") : true;

  const json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpmSpace}};
  json decoders = {{{"type", "Replace"}, {"pattern", {{"String", kSpmSpace}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}};
  if (v.add_space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  v.root = {{"added_tokens", std::move(added)},
            {"normalizer", v.add_space_prefix ? json{{"type", "Sequence"},
                                                     {"normalizers", {{{"type", "Prepend"}, {"prepend", kSpmSpace}}, replace}}}
                                              : replace},
            {"pre_tokenizer", nullptr},
            {"decoder", {{"type", "Sequence"}, {"decoders", std::move(decoders)}}}};
  return v;
}

// The BPE model of a SentencePiece vocabulary, built straight from the token list (takes its vocab).
std::unique_ptr<BpeModel> spm_model(GgufVocab& v, const std::string& where) {
  BpeOptions opt;
  opt.byte_fallback = true;
  opt.fuse_unk = true;
  if (v.unk) opt.unk_token = v.tokens[size_t(*v.unk)];
  return std::make_unique<BpeModel>(std::move(v.spm_vocab), v.spm_merges, v.spm_ranks, std::move(opt), where);
}

GgufVocab read_gguf_vocab(const GgufFile& g) {
  const std::string where = g.path();
  std::string model = g.get_string("tokenizer.ggml.model");
  if (model == "llama") return read_gguf_spm_vocab(g);
  if (model != "gpt2")
    fail(ErrorKind::Unsupported, where + ": tokenizer.ggml.model",
         "'" + model + "' vocabularies are not supported",
         "GGUF vocabularies load as gpt2-style BPE (Llama 3, Qwen2/3, SmolLM2) or llama (SentencePiece: Llama 2, "
         "Mistral, Gemma, Phi-3); pass the model's tokenizer.json");
  std::string pre = g.has("tokenizer.ggml.pre") ? g.get_string("tokenizer.ggml.pre") : "default";

  // The pre-tokenizer is named, not stored: llama.cpp's names map to the HF pipelines they stand for
  // (text/gguf_pretokenizers.h).
  const GgufPreTokenizer* pt = gguf_pre_tokenizer_named(pre);
  if (!pt)
    fail(ErrorKind::Unsupported, where + ": tokenizer.ggml.pre", "pre-tokenizer '" + pre + "' is not known",
         "known: " + known_gguf_pre_tokenizers() + "; pass a tokenizer.json instead");
  const json pre_json = pre_tokenizer_json(*pt);
  const char* llama_cpp_split = pt->llama_cpp_regex;
  const bool ignore_merges = pt->ignore_merges;
  const bool bos_by_default = pt->bos_by_default;  // where the file has no add_bos_token

  std::vector<std::string> tokens = g.get_array_strings("tokenizer.ggml.tokens");
  const std::vector<int64_t> types = gguf_token_types(g, tokens.size());
  json vocab = json::object();
  json added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!vocab.contains(tokens[i])) vocab[tokens[i]] = static_cast<int64_t>(i);
    int64_t t = types.empty() ? 1 : types[i];
    if (t == 3 || t == 4)  // control -> special added token; user_defined -> plain added token
      added.push_back({{"id", i}, {"content", tokens[i]}, {"special", t == 3}, {"normalized", false}});
  }
  llama_cpp_name_attributes(g, tokens, added);
  json merges = json::array();
  if (g.has("tokenizer.ggml.merges"))
    for (std::string& m : g.get_array_strings("tokenizer.ggml.merges")) merges.push_back(std::move(m));

  GgufVocab v;
  v.llama_cpp_split = llama_cpp_split;
  v.root = {{"model", {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)},
                       {"ignore_merges", ignore_merges}}},
            {"added_tokens", std::move(added)},
            {"pre_tokenizer", std::move(pre_json)},
            {"decoder", {{"type", "ByteLevel"}}}};
  read_gguf_specials(g, tokens, false, v);
  if (!v.add_bos && bos_by_default) v.add_bos = true;
  v.tokens = std::move(tokens);
  return v;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& g) {
  GgufVocab v = read_gguf_vocab(g);
  auto im = std::make_shared<Impl>();
  im->name = g.path() + ": tokenizer.ggml";
  build_impl(*im, v.root, v.spm ? spm_model(v, im->name) : nullptr);
  if (v.llama_cpp_split) im->pre_tokenizer = llama_cpp_byte_level(v.llama_cpp_split, im->name + ": pre");
  im->bos = v.bos;
  im->eos = v.eos;
  im->pad = v.pad;
  im->unk = v.unk;
  im->add_bos = v.add_bos;
  im->add_eos = v.add_eos;
  if (im->add_bos.value_or(false) && im->bos) im->prefix = {*im->bos};
  if (im->add_eos.value_or(false) && im->eos) im->suffix = {*im->eos};
  im->chat_template = v.chat_template;
  return Tokenizer(std::move(im));
}

Tokenizer::HfFiles Tokenizer::hf_files_from_gguf(const GgufFile& g) {
  GgufVocab v = read_gguf_vocab(g);
  json root = std::move(v.root);
  if (v.spm) {  // the merges in rank order; merges of one rank by their pieces' ids
    std::vector<size_t> order(v.spm_merges.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    json vocab = json::object();
    for (const auto& [text, i] : v.spm_vocab) vocab[text] = int64_t(i);
    auto id = [&](const std::string& t) { return v.spm_vocab.find(std::string_view(t))->second; };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (v.spm_ranks[a] != v.spm_ranks[b]) return v.spm_ranks[a] < v.spm_ranks[b];
      const auto& [la, ra] = v.spm_merges[a];
      const auto& [lb, rb] = v.spm_merges[b];
      return std::pair(id(la), id(ra)) < std::pair(id(lb), id(rb));
    });
    json merges = json::array();
    for (size_t i : order) merges.push_back({v.spm_merges[i].first, v.spm_merges[i].second});
    root["model"] = {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}, {"ignore_merges", false}};
  }
  // The fields `tokenizers` writes, so the file reads like one it saved.
  json& model = root["model"];
  for (const char* k : {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"}) model[k] = nullptr;
  model["fuse_unk"] = v.spm;
  model["byte_fallback"] = v.spm;
  if (v.unk) model["unk_token"] = v.tokens[size_t(*v.unk)];
  for (json& a : root["added_tokens"]) a["single_word"] = false, a["lstrip"] = false, a["rstrip"] = a.value("rstrip", false);
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  if (!v.spm) {
    root["normalizer"] = nullptr;
    root["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  }
  // What encode(text, add_special_tokens) puts around the text: bos / eos as the GGUF says.
  std::vector<std::pair<std::string, int32_t>> prefix, suffix;
  if (v.add_bos.value_or(false) && v.bos) prefix.push_back({v.tokens[size_t(*v.bos)], *v.bos});
  if (v.add_eos.value_or(false) && v.eos) suffix.push_back({v.tokens[size_t(*v.eos)], *v.eos});
  if (prefix.empty() && suffix.empty()) {
    root["post_processor"] = v.spm ? json(nullptr)
                                   : json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                                          {"use_regex", false}};
  } else {
    json single = json::array(), pair = json::array(), specials = json::object();
    auto special = [&](const std::pair<std::string, int32_t>& t, int type_id) {
      specials[t.first] = {{"id", t.first}, {"ids", {t.second}}, {"tokens", {t.first}}};
      return json{{"SpecialToken", {{"id", t.first}, {"type_id", type_id}}}};
    };
    for (const auto& t : prefix) single.push_back(special(t, 0)), pair.push_back(special(t, 0));
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    pair.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    for (const auto& t : suffix) single.push_back(special(t, 0)), pair.push_back(special(t, 0));
    for (const auto& t : prefix) pair.push_back(special(t, 1));
    pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
    for (const auto& t : suffix) pair.push_back(special(t, 1));
    root["post_processor"] = {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair},
                              {"special_tokens", specials}};
  }
  json cfg = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"clean_up_tokenization_spaces", false},
              {"add_bos_token", v.add_bos.value_or(false)}, {"add_eos_token", v.add_eos.value_or(false)}};
  auto name = [&](const char* key, const std::optional<int32_t>& id) {
    if (id) cfg[key] = v.tokens[size_t(*id)];
  };
  name("bos_token", v.bos);
  name("eos_token", v.eos);
  name("pad_token", v.pad);
  name("unk_token", v.unk);
  if (!v.chat_template.empty()) cfg["chat_template"] = v.chat_template;
  return {root.dump(2) + "\n", cfg.dump(2) + "\n"};
}

}  // namespace qlora
