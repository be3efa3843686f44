// Pre-tokenizers, mirroring HF `tokenizers`: split semantics, ByteLevel mapping, Metaspace.
#include "text/tokenizer_pretok.h"

#include <algorithm>

#include "core/error.h"
#include "text/tokenizer_collapsed.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_regex.h"
#include "text/unicode.h"

namespace qlora {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kO200kLlamaCppPattern =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kTekkenPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kTekkenLlamaCppPattern =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|)"
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Rust's char::is_ascii_punctuation || is_punctuation, as a class body.
static const char* const kPunctClass = R"(\p{P}\x{21}-\x{2F}\x{3A}-\x{40}\x{5B}-\x{60}\x{7B}-\x{7E})";

void matches_to_spans(const std::vector<std::pair<size_t, size_t>>& m, size_t n, bool invert,
                      std::vector<Span>& out) {
  out.clear();
  if (n == 0) {
    out.push_back({0, 0, invert});
    return;
  }
  size_t prev = 0;
  for (auto [a, b] : m) {
    if (prev != a) out.push_back({prev, a, invert});
    out.push_back({a, b, !invert});
    prev = b;
  }
  if (prev != n) out.push_back({prev, n, invert});
}

void split_piece(const Piece& p, const std::vector<Span>& spans, SplitBehavior behavior,
                 std::vector<Piece>& out) {
  // (begin, end, removed) after applying the behaviour, exactly as HF folds the matches.
  std::vector<Span> cut;
  cut.reserve(spans.size());
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const Span& s : spans) cut.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::Removed:
      cut = spans;
      break;
    case SplitBehavior::Contiguous: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.match == prev_match && !cut.empty()) cut.back().end = s.end;
        else cut.push_back({s.begin, s.end, false});
        prev_match = s.match;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.match && !prev_match && !cut.empty()) cut.back().end = s.end;
        else cut.push_back({s.begin, s.end, false});
        prev_match = s.match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool prev_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.match && !prev_match && !cut.empty()) cut.back().begin = s.begin;
        else cut.push_back({s.begin, s.end, false});
        prev_match = s.match;
      }
      std::reverse(cut.begin(), cut.end());
      break;
    }
  }
  for (const Span& c : cut) {
    if (c.match || c.end == c.begin) continue;  // removed, or empty
    Piece q;
    q.text = p.text.substr(c.begin, c.end - c.begin);
    q.at_origin = p.at_origin && c.begin == 0;
    out.push_back(std::move(q));
  }
}

namespace {

using tokjson::json;

// Applies f(piece, out) to every piece still to be tokenized; added-token pieces pass through.
template <typename F>
void for_each_split(std::vector<Piece>& pieces, F&& f) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (Piece& p : pieces) {
    if (p.id >= 0) out.push_back(std::move(p));
    else f(p, out);
  }
  pieces = std::move(out);
}

// Splits on a pattern with a behaviour (Split, Digits, Whitespace, ...).
class PatternSplit : public PreTokenizer {
 public:
  PatternSplit(Pattern pat, SplitBehavior b, bool inv) : pattern(std::move(pat)), behavior(b), invert(inv) {}
  Pattern pattern;
  SplitBehavior behavior;
  bool invert;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<std::pair<size_t, size_t>> m;
    std::vector<Span> spans;
    for_each_split(pieces, [&](Piece& p, std::vector<Piece>& out) {
      pattern.find_all(p.text, m);
      matches_to_spans(m, p.text.size(), invert, spans);
      split_piece(p, spans, behavior, out);
    });
  }
};

class SequencePre : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts) p->pre_tokenize(pieces);
  }
};

class ByteLevelPre : public PreTokenizer {
 public:
  bool add_prefix_space = true;
  std::unique_ptr<PatternSplit> split;  // null when use_regex is false
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space)
      for (Piece& p : pieces)
        if (p.id < 0 && p.text[0] != ' ') p.text.insert(0, 1, ' ');
    if (split) split->pre_tokenize(pieces);
    // HF maps every split still without tokens, including ones made by earlier pre-tokenizers.
    for (Piece& p : pieces)
      if (p.id < 0) p.text = unicode::bytes_to_alphabet(p.text);
  }
};

enum class Prepend { Always, First, Never };

class MetaspacePre : public PreTokenizer {
 public:
  std::string replacement;
  Prepend scheme = Prepend::Always;
  bool split = true;
  Pattern each_replacement;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<std::pair<size_t, size_t>> m;
    std::vector<Span> spans;
    for_each_split(pieces, [&](Piece& p, std::vector<Piece>& out) {
      std::string t;
      t.reserve(p.text.size() + replacement.size());
      bool starts = p.text.compare(0, replacement.size(), replacement) == 0 || p.text[0] == ' ';
      if (!starts && (scheme == Prepend::Always || (scheme == Prepend::First && p.at_origin)))
        t = replacement;
      for (char c : p.text) {
        if (c == ' ') t += replacement;
        else t += c;
      }
      p.text = std::move(t);
      if (!split) {
        out.push_back(std::move(p));
        return;
      }
      each_replacement.find_all(p.text, m);
      matches_to_spans(m, p.text.size(), false, spans);
      split_piece(p, spans, SplitBehavior::MergedWithNext, out);
    });
  }
};

SplitBehavior parse_behavior(const json& j, const std::string& where) {
  std::string b = tokjson::need_string(j, "behavior", where);
  // HF serializes the enum as "Isolated"; Python-side spellings are snake_case.
  if (b == "Removed" || b == "removed") return SplitBehavior::Removed;
  if (b == "Isolated" || b == "isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious" || b == "merged_with_previous") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext" || b == "merged_with_next") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous" || b == "contiguous") return SplitBehavior::Contiguous;
  fail(ErrorKind::Unsupported, tokjson::child(where, "behavior"), "'" + b + "' is not a split behavior",
       "one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

std::unique_ptr<PatternSplit> class_split(const std::string& cls, SplitBehavior b, bool invert,
                                          const std::string& where) {
  return std::make_unique<PatternSplit>(Pattern(true, cls, where), b, invert);
}

}  // namespace

std::unique_ptr<PreTokenizer> llama_cpp_byte_level(std::string_view pattern, const std::string& where) {
  auto seq = std::make_unique<SequencePre>();
  seq->parts.push_back(collapsed_split(pattern, where));
  auto bytes = std::make_unique<ByteLevelPre>();
  bytes->add_prefix_space = false;
  seq->parts.push_back(std::move(bytes));
  return seq;
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  tokjson::need_object(j, where);
  std::string type = tokjson::type_of(j, where);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequencePre>();
    std::string w = tokjson::child(where, "pretokenizers");
    const json& arr = tokjson::need(j, "pretokenizers", where);
    if (!arr.is_array()) fail(ErrorKind::Format, w, "expected an array");
    for (size_t i = 0; i < arr.size(); ++i) {
      auto p = parse_pre_tokenizer(arr[i], tokjson::index(w, i));
      if (p) seq->parts.push_back(std::move(p));
    }
    return seq;
  }
  if (type == "ByteLevel") {
    auto b = std::make_unique<ByteLevelPre>();
    b->add_prefix_space = tokjson::bool_or(j, "add_prefix_space", true, where);
    if (tokjson::bool_or(j, "use_regex", true, where))
      b->split = class_split(kGpt2Pattern, SplitBehavior::Isolated, false, where);
    return b;
  }
  if (type == "Split") {
    Pattern pat = tokjson::need_pattern(j, "pattern", where);
    return std::make_unique<PatternSplit>(std::move(pat), parse_behavior(j, where),
                                          tokjson::bool_or(j, "invert", false, where));
  }
  if (type == "Metaspace") {
    auto m = std::make_unique<MetaspacePre>();
    uint32_t rep = tokjson::need_char(j, "replacement", where);
    unicode::append_utf8(m->replacement, rep);
    m->split = tokjson::bool_or(j, "split", true, where);
    std::string scheme = tokjson::string_or(j, "prepend_scheme", "always", where);
    if (scheme == "always") m->scheme = Prepend::Always;
    else if (scheme == "first") m->scheme = Prepend::First;
    else if (scheme == "never") m->scheme = Prepend::Never;
    else
      fail(ErrorKind::Unsupported, tokjson::child(where, "prepend_scheme"),
           "'" + scheme + "' is not a prepend scheme", "one of always, first, never");
    // Older files carry add_prefix_space instead; false there means never.
    if (const json* a = tokjson::find(j, "add_prefix_space"); a && a->is_boolean() && !a->get<bool>())
      m->scheme = Prepend::Never;
    m->each_replacement = Pattern(false, m->replacement, where);
    return m;
  }
  if (type == "Digits") {
    bool individual = tokjson::bool_or(j, "individual_digits", false, where);
    return class_split(R"(\p{N})", individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous,
                       false, where);
  }
  if (type == "Whitespace") {
    return class_split(R"(\w+|[^\w\s]+)", SplitBehavior::Removed, true, where);
  }
  if (type == "WhitespaceSplit") return class_split(R"(\s)", SplitBehavior::Removed, false, where);
  if (type == "Punctuation") {
    SplitBehavior b = tokjson::find(j, "behavior") ? parse_behavior(j, where) : SplitBehavior::Isolated;
    return class_split(std::string("[") + kPunctClass + "]", b, false, where);
  }
  if (type == "BertPreTokenizer") {
    auto seq = std::make_unique<SequencePre>();
    seq->parts.push_back(class_split(R"(\s)", SplitBehavior::Removed, false, where));
    seq->parts.push_back(class_split(std::string("[") + kPunctClass + "]", SplitBehavior::Isolated,
                                     false, where));
    return seq;
  }
  if (type == "CharDelimiterSplit") {
    uint32_t d = tokjson::need_char(j, "delimiter", where);
    std::string s;
    unicode::append_utf8(s, d);
    return std::make_unique<PatternSplit>(Pattern(false, s, where), SplitBehavior::Removed, false);
  }
  tokjson::unsupported_type(where, type,
                            "Sequence, ByteLevel, Split, Metaspace, Digits, Whitespace, "
                            "WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit");
}

}  // namespace qlora
