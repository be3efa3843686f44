// Jinja lexer following jinja2's lexer rules (trim_blocks=True, lstrip_blocks=True).
#include "text/jinja_lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "text/jinja_pystr.h"
#include "text/unicode.h"

namespace qlora::jinja {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name) : name_(name) {
    // jinja2 turns \r\n and \r into \n before lexing and drops one trailing newline
    // (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t n = src_.size();
    while (pos_ < n) {
      size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit_data(src_.substr(pos_), pos_);
        break;
      }
      char kind = src_[tag + 1];
      size_t p = tag + 2;
      char sign = 0;
      if (p < n && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      std::string text = src_.substr(pos_, tag - pos_);
      size_t raw_body = kind == '%' ? match_raw_begin(p) : std::string::npos;

      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop the indentation before a block or comment tag that starts its line.
        size_t l = text.rfind('\n');
        l = (l == std::string::npos) ? 0 : l + 1;
        if ((l > 0 || line_starting_) && l < text.size() && all_ws(text, l)) text.resize(l);
      }
      emit_data(text, pos_);

      if (raw_body != std::string::npos) {
        lex_raw(tag, raw_body);
      } else if (kind == '#') {
        lex_comment(tag, p);
      } else {
        push(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, kind == '{' ? "{{" : "{%", tag);
        lex_tag(tag, p, kind == '%');
      }
    }
    push(Tok::Eof, "", src_.size());
    return std::move(out_);
  }

 private:
  std::string src_;
  const std::string& name_;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  mutable size_t cache_line_ = 0, cache_pos_ = 0, cache_col_ = 1;

  Loc loc_at(size_t pos) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    size_t start = line_starts_[line - 1];
    // Columns count code points, as an editor shows them. Tokens arrive in order, so count on from
    // the previous one on the same line (a long one-line template stays linear).
    size_t col = 1;
    if (line == cache_line_ && pos >= cache_pos_) {
      start = cache_pos_;
      col = cache_col_;
    }
    col += pystr::length(std::string_view(src_).substr(start, pos - start));
    cache_line_ = line;
    cache_pos_ = pos;
    cache_col_ = col;
    return Loc{static_cast<int>(line), static_cast<int>(col)};
  }

  [[noreturn]] void fail(size_t pos, const std::string& what, const std::string& hint = "") const {
    Loc l = loc_at(pos);
    qlora::fail(ErrorKind::Format, name_ + ":" + std::to_string(l.line) + ":" + std::to_string(l.col), what,
                hint);
  }

  bool starts(size_t p, const char* s) const { return src_.compare(p, std::strlen(s), s) == 0; }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // Decodes one code point at p and reports whether it is whitespace (regex \s), with its length.
  bool ws_at(size_t p, size_t* len) const {
    size_t q = p;
    uint32_t cp = unicode::next_cp(src_, q);
    *len = q - p;
    return pystr::is_space(cp);
  }

  size_t skip_ws(size_t p) const {
    size_t len;
    while (p < src_.size() && ws_at(p, &len)) p += len;
    return p;
  }

  static bool all_ws(const std::string& s, size_t from) {
    for (size_t i = from; i < s.size();) {
      uint32_t cp = unicode::next_cp(s, i);
      if (!pystr::is_space(cp)) return false;
    }
    return true;
  }

  static std::string rstrip_ws(const std::string& s) { return pystr::strip(s, std::nullopt, false, true); }

  void push(Tok type, std::string text, size_t pos) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.loc = loc_at(pos);
    out_.push_back(std::move(t));
  }

  void emit_data(std::string text, size_t pos) {
    if (!text.empty()) push(Tok::Data, std::move(text), pos);
  }

  // After "{%" (+ sign) at p: the body start of a `{% raw %}` tag, or npos.
  size_t match_raw_begin(size_t p) const {
    size_t q = skip_ws(p);
    if (!starts(q, "raw")) return std::string::npos;
    q = skip_ws(q + 3);
    if (starts(q, "-%}")) return skip_ws(q + 3);
    if (starts(q, "%}")) return q + 2;
    return std::string::npos;
  }

  void lex_raw(size_t tag, size_t body) {
    for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t q = i + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_ws(q);
      if (!starts(q, "endraw")) continue;
      q = skip_ws(q + 6);
      std::string text = src_.substr(body, i - body);
      if (sign == '-') text = rstrip_ws(text);
      if (starts(q, "-%}")) {
        pos_ = skip_ws(q + 3);
      } else if (starts(q, "+%}")) {
        pos_ = q + 3;
      } else if (starts(q, "%}")) {
        pos_ = q + 2;
        if (pos_ < src_.size() && src_[pos_] == '\n') ++pos_;
      } else {
        continue;
      }
      emit_data(text, body);
      line_starting_ = src_[pos_ - 1] == '\n';
      return;
    }
    fail(tag, "missing end of raw directive", "close it with {% endraw %}");
  }

  void lex_comment(size_t tag, size_t p) {
    size_t j = src_.find("#}", p);
    if (j == std::string::npos) fail(tag, "missing end of comment tag", "close it with #}");
    if (j > p && src_[j - 1] == '-') {
      pos_ = skip_ws(j + 2);
    } else if (j > p && src_[j - 1] == '+') {
      pos_ = j + 2;
    } else {
      pos_ = j + 2;
      if (pos_ < src_.size() && src_[pos_] == '\n') ++pos_;
    }
    line_starting_ = src_[pos_ - 1] == '\n';
  }

  void lex_tag(size_t tag, size_t p, bool block) {
    std::vector<char> brackets;
    size_t n = src_.size();
    while (true) {
      if (p >= n)
        fail(tag, std::string("unexpected end of template, expected end of ") + (block ? "statement" : "print"),
             block ? "close the tag with %}" : "close the tag with }}");
      if (brackets.empty()) {
        size_t end = std::string::npos;
        if (block) {
          if (starts(p, "-%}")) {
            end = skip_ws(p + 3);
          } else if (starts(p, "+%}")) {
            end = p + 3;
          } else if (starts(p, "%}")) {
            end = p + 2;
            if (end < n && src_[end] == '\n') ++end;  // trim_blocks
          }
        } else {
          if (starts(p, "-}}"))
            end = skip_ws(p + 3);
          else if (starts(p, "}}"))
            end = p + 2;
        }
        if (end != std::string::npos) {
          push(block ? Tok::BlockEnd : Tok::VarEnd, block ? "%}" : "}}", p);
          pos_ = end;
          line_starting_ = src_[end - 1] == '\n';
          return;
        }
      }
      size_t len;
      char c = src_[p];
      if (ws_at(p, &len)) {
        p += len;
      } else if (is_digit(c)) {
        p = lex_number(p);
      } else if (is_name_start(c)) {
        size_t q = p;
        while (q < n && is_name_char(src_[q])) ++q;
        push(Tok::Name, src_.substr(p, q - p), p);
        p = q;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        p = lex_operator(p, &brackets);
      }
    }
  }

  size_t scan_digits(size_t p, bool (*ok)(char)) const {
    // digits with single underscores between them, as Python allows
    while (p < src_.size() && (ok(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && ok(src_[p + 1])))) ++p;
    return p;
  }

  size_t lex_number(size_t p) {
    size_t n = src_.size();
    auto dec = [](char c) { return is_digit(c); };
    if (src_[p] == '0' && p + 1 < n && std::strchr("xXoObB", src_[p + 1]) && src_[p + 1] != 0) {
      char k = static_cast<char>(src_[p + 1] | 0x20);
      int base = k == 'x' ? 16 : k == 'o' ? 8 : 2;
      size_t q = p + 2;
      int64_t v = 0;
      while (q < n) {
        char c = src_[q];
        int d = -1;
        if (c == '_') {
          ++q;
          continue;
        }
        if (c >= '0' && c <= '9') d = c - '0';
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') d = (c | 0x20) - 'a' + 10;
        if (d < 0 || d >= base) break;
        if (v > (INT64_MAX - d) / base) fail(p, "integer literal out of range", "integers are 64-bit here");
        v = v * base + d;
        ++q;
      }
      if (q == p + 2) fail(p, "invalid integer literal");
      Token t;
      t.type = Tok::Int;
      t.int_value = v;
      t.text = src_.substr(p, q - p);
      t.loc = loc_at(p);
      out_.push_back(t);
      return q;
    }
    size_t q = scan_digits(p, dec);
    bool is_float = false;
    bool after_dot = p > 0 && src_[p - 1] == '.';  // `x.0.1` is two subscripts, not a float
    size_t f = q;
    if (!after_dot) {
      if (f + 1 < n && src_[f] == '.' && is_digit(src_[f + 1])) {
        f = scan_digits(f + 1, dec);
        is_float = true;
      }
      if (f < n && (src_[f] == 'e' || src_[f] == 'E')) {
        size_t e = f + 1;
        if (e < n && (src_[e] == '+' || src_[e] == '-')) ++e;
        if (e < n && is_digit(src_[e])) {
          f = scan_digits(e, dec);
          is_float = true;
        }
      }
    }
    Token t;
    t.loc = loc_at(p);
    std::string digits;
    if (is_float) {
      for (size_t i = p; i < f; ++i)
        if (src_[i] != '_') digits += src_[i];
      t.type = Tok::Float;
      t.float_value = std::strtod(digits.c_str(), nullptr);
      t.text = src_.substr(p, f - p);
      out_.push_back(t);
      return f;
    }
    for (size_t i = p; i < q; ++i)
      if (src_[i] != '_') digits += src_[i];
    errno = 0;
    long long v = std::strtoll(digits.c_str(), nullptr, 10);
    if (errno == ERANGE) fail(p, "integer literal out of range", "integers are 64-bit here");
    t.type = Tok::Int;
    t.int_value = v;
    t.text = src_.substr(p, q - p);
    out_.push_back(t);
    return q;
  }

  size_t lex_string(size_t p) {
    char quote = src_[p];
    size_t q = p + 1;
    while (q < src_.size() && src_[q] != quote) q += (src_[q] == '\\') ? 2 : 1;
    if (q >= src_.size()) fail(p, "unterminated string literal", std::string("close it with ") + quote);
    std::string value, error;
    if (!pystr::unescape_literal(std::string_view(src_).substr(p + 1, q - p - 1), &value, &error))
      fail(p, error);
    push(Tok::String, std::move(value), p);
    return q + 1;
  }

  size_t lex_operator(size_t p, std::vector<char>* brackets) {
    static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (starts(p, op)) {
        push(Tok::Op, op, p);
        return p + 2;
      }
    }
    char c = src_[p];
    if (!std::strchr("+-/*%~[](){}<>=.:|,;", c) || c == 0) {
      size_t q = p;
      unicode::next_cp(src_, q);
      fail(p, "unexpected char '" + src_.substr(p, q - p) + "'");
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets->push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets->empty()) fail(p, std::string("unexpected '") + c + "'");
      char expected = brackets->back();
      brackets->pop_back();
      if (expected != c) fail(p, std::string("unexpected '") + c + "', expected '" + expected + "'");
    }
    push(Tok::Op, std::string(1, c), p);
    return p + 1;
  }
};

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& name) { return Lexer(source, name).run(); }

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::Data: return "template data";
    case Tok::VarBegin: return "begin of print statement";
    case Tok::VarEnd: return "end of print statement";
    case Tok::BlockBegin: return "begin of statement block";
    case Tok::BlockEnd: return "end of statement block";
    case Tok::Eof: return "end of template";
    case Tok::String: return "string literal";
    default: return "'" + t.text + "'";
  }
}

}  // namespace qlora::jinja
