// PCRE2 wrapper: compile once with JIT, per-thread match data and JIT stack.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer_regex.h"

#include <pcre2.h>

#include <memory>

#include "core/error.h"
#include "text/unicode.h"

namespace qlora {

// White_Space as Oniguruma (and Rust) define it, as the inside of a character class.
static constexpr const char* kWhiteSpaceSet =
    R"(\x{9}-\x{d}\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";

// Oniguruma's Unicode \w as measured against HF tokenizers: letters, marks, all numbers,
// connector punctuation and the alphabetic symbols (circled/squared letters), not joiners.
// PCRE2 10.42's \w is only letters, numbers and '_'.
static constexpr const char* kWordSet =
    R"(\p{L}\p{M}\p{N}\p{Pc}\x{24B6}-\x{24E9}\x{1F130}-\x{1F149}\x{1F150}-\x{1F169}\x{1F170}-\x{1F189})";

std::string onig_compatible_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // offset just after '[' or '[^', where a literal ']' may stand
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceSet) : "[" + std::string(kWhiteSpaceSet) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceSet) + "]";
      } else if (e == 'w') {
        out += in_class ? std::string(kWordSet) : "[" + std::string(kWordSet) + "]";
      } else if (e == 'W' && !in_class) {
        out += "[^" + std::string(kWordSet) + "]";
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      class_start = i + 1;
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:name:]
      size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']' && i != class_start) in_class = false;
    out += c;
  }
  return out;
}

namespace {
struct MatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* js = nullptr;
  MatchState() {
    md = pcre2_match_data_create(1, nullptr);
    mc = pcre2_match_context_create(nullptr);
    // Long whitespace runs need more than the default 32 KiB JIT stack.
    js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~MatchState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    pcre2_jit_stack_free(js);
  }
};
MatchState& match_state() {
  thread_local MatchState st;
  return st;
}
std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}
}  // namespace

Regex::Regex(std::string_view pattern, const std::string& where, RegexText text) : where_(where), text_(text) {
  const bool utf8 = text == RegexText::Utf8;
  std::string p = utf8 ? onig_compatible_pattern(pattern) : std::string(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  // Without UTF and UCP, PCRE2's built-in tables are the "C" locale's.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                   utf8 ? PCRE2_UTF | PCRE2_UCP : 0, &err, &off, nullptr);
  if (!code)
    fail(ErrorKind::Format, where, "bad regex /" + std::string(pattern) + "/: " + pcre2_message(err),
         "PCRE2 could not compile it");
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

static int run(void* code, std::string_view s, size_t start, uint32_t opts) {
  MatchState& st = match_state();
  return pcre2_match(static_cast<pcre2_code*>(code), reinterpret_cast<PCRE2_SPTR>(s.data()),
                     s.size(), start, opts | PCRE2_NO_UTF_CHECK, st.md, st.mc);
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  size_t pos = 0;
  while (pos <= s.size()) {
    int rc = run(code_, s, pos, 0);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail(ErrorKind::Data, where_, "regex match failed: " + pcre2_message(rc));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_state().md);
    size_t a = ov[0], b = ov[1];
    out.emplace_back(a, b);
    if (b > a) {
      pos = b;
    } else {
      if (b >= s.size()) break;
      pos = b + (text_ == RegexText::Utf8 ? unicode::cp_len(static_cast<unsigned char>(s[b])) : 1);
    }
  }
}

size_t Regex::matches_at(std::string_view s, size_t at) const {
  int rc = run(code_, s, at, PCRE2_ANCHORED);
  if (rc == PCRE2_ERROR_NOMATCH) return std::string_view::npos;
  if (rc < 0) fail(ErrorKind::Data, where_, "regex match failed: " + pcre2_message(rc));
  return pcre2_get_ovector_pointer(match_state().md)[1];
}

Pattern::Pattern(bool is_regex, std::string_view text, const std::string& where) {
  if (is_regex) re_ = std::make_unique<Regex>(text, where);
  else literal_ = text;
}

void Pattern::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  if (re_) return re_->find_all(s, out);
  out.clear();
  if (literal_.empty()) return;  // nothing to find; an empty regex would match between chars
  for (size_t pos = s.find(literal_); pos != std::string_view::npos;
       pos = s.find(literal_, pos + literal_.size()))
    out.emplace_back(pos, pos + literal_.size());
}

std::string Pattern::replace_all(std::string_view s, std::string_view content) const {
  std::vector<std::pair<size_t, size_t>> m;
  find_all(s, m);
  if (m.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size());
  size_t last = 0;
  for (auto [a, b] : m) {
    out.append(s.substr(last, a - last));
    out.append(content);
    last = b;
  }
  out.append(s.substr(last));
  return out;
}

}  // namespace qlora
