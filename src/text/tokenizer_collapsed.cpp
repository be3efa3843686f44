// The collapsed-text split of llama.cpp (unicode.cpp, unicode_regex_split).
#include "text/tokenizer_collapsed.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "text/tokenizer_regex.h"
#include "text/unicode.h"

namespace qlora {
namespace {

// llama.cpp's categories: the placeholder byte of a non-ASCII code point of the category, and the
// ASCII code points the category's class still holds after the rewrite (as a class body).
struct Category {
  char name;  // X of \p{X}
  unsigned char placeholder;
  const char* ascii;
};
constexpr Category kCategories[] = {
    {'N', 0xD1, "0-9"},
    {'L', 0xD2, "A-Za-z"},
    {'P', 0xD3, R"(!-#%-*,-/:-;?-@\[-\]_\{\})"},
    {'M', 0xD4, ""},
    {'S', 0xD5, R"(\$\+<->\^`\|)"},
};
constexpr char kWhitespace = 0x0B;  // llama.cpp's stand-in for non-ASCII whitespace
constexpr char kOther = static_cast<char>(0xD0);

// \p{X} at p[i] with X one of kCategories: the category, else null.
const Category* category_at(std::string_view p, size_t i) {
  if (p.compare(i, 3, "\\p{") != 0 || i + 4 >= p.size() || p[i + 4] != '}') return nullptr;
  for (const Category& c : kCategories)
    if (c.name == p[i + 3]) return &c;
  return nullptr;
}

class CollapsedSplit : public PreTokenizer {
 public:
  CollapsedSplit(std::string_view pattern, const std::string& where)
      : re_(collapse_pattern(pattern, where), where, RegexText::Bytes) {
    for (const Category& c : kCategories)
      if (pattern.find(std::string("\\p{") + c.name + "}") != std::string_view::npos)
        runs_.push_back({static_cast<char>(c.placeholder),
                         std::make_unique<Regex>(std::string("\\p{") + c.name + "}+", where)});
  }

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 2);
    std::vector<std::pair<size_t, size_t>> m;
    std::vector<Span> spans;
    std::vector<size_t> at;  // byte offset of each code point, then the length
    std::string collapsed;
    for (Piece& p : pieces) {
      if (p.id >= 0) {
        out.push_back(std::move(p));
        continue;
      }
      collapse(p.text, collapsed, at);
      re_.find_all(collapsed, m);
      matches_to_spans(m, collapsed.size(), false, spans);
      for (Span& s : spans) s.begin = at[s.begin], s.end = at[s.end];
      split_piece(p, spans, SplitBehavior::Isolated, out);
    }
    pieces = std::move(out);
  }

 private:
  // One byte per code point of s into `out`; `at` gets each code point's byte offset, then s.size().
  void collapse(std::string_view s, std::string& out, std::vector<size_t>& at) const {
    out.clear();
    at.clear();
    bool ascii = true;
    for (size_t i = 0; i < s.size();) {
      at.push_back(i);
      const uint32_t cp = unicode::next_cp(s, i);
      if (cp < 0x80) {
        out += static_cast<char>(cp);
      } else {
        out += unicode::is_whitespace(cp) ? kWhitespace : kOther;
        ascii = false;
      }
    }
    at.push_back(s.size());
    if (ascii) return;
    // The runs of each category (PCRE2's Unicode properties) overwrite the fallback byte.
    std::vector<std::pair<size_t, size_t>> m;
    for (const auto& [placeholder, re] : runs_) {
      re->find_all(s, m);
      for (auto [a, b] : m)
        for (size_t k = size_t(std::lower_bound(at.begin(), at.end(), a) - at.begin()); at[k] < b; ++k)
          if (out[k] == kOther) out[k] = placeholder;
    }
  }

  Regex re_;
  std::vector<std::pair<char, std::unique_ptr<Regex>>> runs_;  // placeholder, \p{X}+
};

}  // namespace

std::string collapse_pattern(std::string_view p, const std::string& where) {
  static const char* const kHex = "0123456789ABCDEF";
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;  // as llama.cpp tracks it: a '[' or ']' not after a backslash
  for (size_t i = 0; i < p.size(); ++i) {
    const bool escaped = i > 0 && p[i - 1] == '\\';
    if (p[i] == '[' && !escaped) in_class = true;
    else if (p[i] == ']' && !escaped) in_class = false;
    if (p.compare(i, 3, "\\p{") == 0) {
      const Category* c = category_at(p, i);
      if (!c)
        fail(ErrorKind::Unsupported, where, "regex class \\p{...} at offset " + std::to_string(i),
             "llama.cpp's collapsed regexes know \\p{N} \\p{L} \\p{P} \\p{M} \\p{S}");
      const std::string cls = std::string("\\x") + kHex[c->placeholder >> 4] + kHex[c->placeholder & 15] + c->ascii;
      out += in_class ? cls : "[" + cls + "]";
      i += 4;
      continue;
    }
    out += p[i];
  }
  return out;
}

std::unique_ptr<PreTokenizer> collapsed_split(std::string_view pattern, const std::string& where) {
  return std::make_unique<CollapsedSplit>(pattern, where);
}

}  // namespace qlora
