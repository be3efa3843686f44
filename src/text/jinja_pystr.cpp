// Python str semantics over UTF-8 for the Jinja interpreter (case mapping through utf8proc).
#include "text/jinja_pystr.h"

#include <algorithm>
#include <stdexcept>

#include "text/unicode.h"

#ifdef QLORA_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

namespace qlora::jinja::pystr {

namespace {

using unicode::append_utf8;

enum class Cat { Upper, Lower, Title, OtherLetter, Digit, OtherNumber, Space, Control, Other };

Cat category(uint32_t cp) {
#ifdef QLORA_HAVE_UTF8PROC
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: return Cat::Upper;
    case UTF8PROC_CATEGORY_LL: return Cat::Lower;
    case UTF8PROC_CATEGORY_LT: return Cat::Title;
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: return Cat::OtherLetter;
    case UTF8PROC_CATEGORY_ND: return Cat::Digit;
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO: return Cat::OtherNumber;
    case UTF8PROC_CATEGORY_ZS: return Cat::Space;
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: return Cat::Control;
    default: return Cat::Other;
  }
#else
  if (cp >= 'A' && cp <= 'Z') return Cat::Upper;
  if (cp >= 'a' && cp <= 'z') return Cat::Lower;
  if (cp >= '0' && cp <= '9') return Cat::Digit;
  if (cp == ' ') return Cat::Space;
  if (cp < 0x20 || cp == 0x7f) return Cat::Control;
  return cp < 0x80 ? Cat::Other : Cat::OtherLetter;
#endif
}

bool is_cased(uint32_t cp) {
  Cat c = category(cp);
  return c == Cat::Upper || c == Cat::Lower || c == Cat::Title;
}

uint32_t to_upper(uint32_t cp) {
#ifdef QLORA_HAVE_UTF8PROC
  return static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp)));
#else
  return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
#endif
}

uint32_t to_lower(uint32_t cp) {
#ifdef QLORA_HAVE_UTF8PROC
  return static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
#else
  return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
#endif
}

uint32_t to_title(uint32_t cp) {
#ifdef QLORA_HAVE_UTF8PROC
  return static_cast<uint32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp)));
#else
  return to_upper(cp);
#endif
}

// Python's simple case mapping plus the full mappings people actually meet (German sharp s).
void append_upper(std::string& out, uint32_t cp) {
  if (cp == 0xDF) {
    out += "SS";
    return;
  }
  append_utf8(out, to_upper(cp));
}

bool in_set(uint32_t cp, const std::vector<uint32_t>& set) {
  return std::find(set.begin(), set.end(), cp) != set.end();
}

bool is_line_break(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D ||
         cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

template <class Pred>
bool all_of_nonempty(std::string_view s, Pred pred) {
  auto cps = decode(s);
  if (cps.empty()) return false;
  return std::all_of(cps.begin(), cps.end(), pred);
}

}  // namespace

bool is_space(uint32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  if (cp >= 0x1C && cp <= 0x20) return true;
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
      cp == 0x205F || cp == 0x3000)
    return true;
  return cp >= 0x2000 && cp <= 0x200A;
}

std::vector<uint32_t> decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(unicode::next_cp(s, i));
  return out;
}

std::string encode(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) append_utf8(out, cp);
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  auto cps = decode(s);
  std::vector<uint32_t> set;
  if (chars) set = decode(*chars);
  auto strip_it = [&](uint32_t cp) { return chars ? in_set(cp, set) : is_space(cp); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return encode(std::vector<uint32_t>(cps.begin() + b, cps.begin() + e));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw std::invalid_argument("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t at = s.find(*sep, pos);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, at - pos));
      pos = at + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  auto cps = decode(s);
  size_t i = 0, n = cps.size();
  while (true) {
    while (i < n && is_space(cps[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      // The rest, with its trailing whitespace stripped, is the last piece.
      size_t e = n;
      while (e > i && is_space(cps[e - 1])) --e;
      out.push_back(encode(std::vector<uint32_t>(cps.begin() + i, cps.begin() + e)));
      break;
    }
    size_t j = i;
    while (j < n && !is_space(cps[j])) ++j;
    out.push_back(encode(std::vector<uint32_t>(cps.begin() + i, cps.begin() + j)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw std::invalid_argument("empty separator");
    size_t end = s.size();
    while (static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    auto cps = decode(s);
    size_t e = cps.size();
    while (true) {
      while (e > 0 && is_space(cps[e - 1])) --e;
      if (e == 0) break;
      if (static_cast<int64_t>(out.size()) == maxsplit) {
        size_t b = 0;
        while (b < e && is_space(cps[b])) ++b;
        out.push_back(encode(std::vector<uint32_t>(cps.begin() + b, cps.begin() + e)));
        break;
      }
      size_t b = e;
      while (b > 0 && !is_space(cps[b - 1])) --b;
      out.push_back(encode(std::vector<uint32_t>(cps.begin() + b, cps.begin() + e)));
      e = b;
    }
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  auto cps = decode(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    if (!is_line_break(cps[i])) {
      ++i;
      continue;
    }
    size_t brk = (cps[i] == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ? 2 : 1;
    size_t end = keepends ? i + brk : i;
    out.push_back(encode(std::vector<uint32_t>(cps.begin() + start, cps.begin() + end)));
    i += brk;
    start = i;
  }
  if (start < cps.size()) out.push_back(encode(std::vector<uint32_t>(cps.begin() + start, cps.end())));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    // Python inserts the replacement before every code point and at the end.
    size_t i = 0;
    while (i <= s.size()) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i == s.size()) break;
      size_t len = unicode::cp_len(static_cast<unsigned char>(s[i]));
      out += s.substr(i, len);
      i += len;
    }
    return out;
  }
  size_t pos = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old, pos);
    if (at == std::string_view::npos) break;
    out += s.substr(pos, at - pos);
    out += repl;
    pos = at + old.size();
    ++done;
  }
  out += s.substr(pos);
  return out;
}

std::string upper(std::string_view s) {
  std::string out;
  for (uint32_t cp : decode(s)) append_upper(out, cp);
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  for (uint32_t cp : decode(s)) append_utf8(out, to_lower(cp));
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (uint32_t cp : decode(s)) {
    append_utf8(out, prev_cased ? to_lower(cp) : to_title(cp));
    prev_cased = is_cased(cp);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (uint32_t cp : decode(s)) {
    append_utf8(out, first ? to_title(cp) : to_lower(cp));
    first = false;
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  auto is_sep = [](uint32_t cp) {
    return is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
  };
  std::string out;
  bool run_start = true, prev_sep = false;
  for (uint32_t cp : decode(s)) {
    bool sep = is_sep(cp);
    if (sep != prev_sep) run_start = true;
    if (sep)
      append_utf8(out, cp);
    else if (run_start)
      append_upper(out, cp);
    else
      append_utf8(out, to_lower(cp));
    run_start = false;
    prev_sep = sep;
  }
  return out;
}

bool is_upper(std::string_view s) {
  bool any = false;
  for (uint32_t cp : decode(s)) {
    Cat c = category(cp);
    if (c == Cat::Lower || c == Cat::Title) return false;
    any |= c == Cat::Upper;
  }
  return any;
}

bool is_lower(std::string_view s) {
  bool any = false;
  for (uint32_t cp : decode(s)) {
    Cat c = category(cp);
    if (c == Cat::Upper || c == Cat::Title) return false;
    any |= c == Cat::Lower;
  }
  return any;
}

bool is_alpha(std::string_view s) {
  return all_of_nonempty(s, [](uint32_t cp) {
    Cat c = category(cp);
    return c == Cat::Upper || c == Cat::Lower || c == Cat::Title || c == Cat::OtherLetter;
  });
}

bool is_digit(std::string_view s) {
  return all_of_nonempty(s, [](uint32_t cp) { return category(cp) == Cat::Digit; });
}

bool is_alnum(std::string_view s) {
  return all_of_nonempty(s, [](uint32_t cp) {
    Cat c = category(cp);
    return c == Cat::Upper || c == Cat::Lower || c == Cat::Title || c == Cat::OtherLetter ||
           c == Cat::Digit || c == Cat::OtherNumber;
  });
}

bool is_space_str(std::string_view s) { return all_of_nonempty(s, is_space); }

std::vector<size_t> slice_indices(size_t n, std::optional<int64_t> start, std::optional<int64_t> stop,
                                  std::optional<int64_t> step) {
  int64_t st = step.value_or(1);
  if (st == 0) throw std::invalid_argument("slice step cannot be zero");
  int64_t len = static_cast<int64_t>(n);
  int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? len : len - 1;
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) {
      x += len;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  int64_t b = clamp(start, st > 0 ? lower : upper);
  int64_t e = clamp(stop, st > 0 ? upper : lower);
  std::vector<size_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(static_cast<size_t>(i));
  return out;
}

std::string slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> stop,
                  std::optional<int64_t> step) {
  auto cps = decode(s);
  std::string out;
  for (size_t i : slice_indices(cps.size(), start, stop, step)) append_utf8(out, cps[i]);
  return out;
}

std::string repr(std::string_view s) {
  auto cps = decode(s);
  bool has_single = in_set('\'', cps), has_double = in_set('"', cps);
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  static const char* hex = "0123456789abcdef";
  auto hex_escape = [&](uint32_t cp, char kind, int digits) {
    out += '\\';
    out += kind;
    for (int d = digits - 1; d >= 0; --d) out += hex[(cp >> (4 * d)) & 0xF];
  };
  for (uint32_t cp : cps) {
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      hex_escape(cp, 'x', 2);
    } else if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      Cat c = category(cp);
      bool printable = c != Cat::Control && c != Cat::Space;
      if (printable)
        append_utf8(out, cp);
      else if (cp <= 0xFF)
        hex_escape(cp, 'x', 2);
      else if (cp <= 0xFFFF)
        hex_escape(cp, 'u', 4);
      else
        hex_escape(cp, 'U', 8);
    }
  }
  out += quote;
  return out;
}

bool unescape_literal(std::string_view body, std::string* out, std::string* error) {
  auto hexval = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  out->clear();
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\') {
      *out += c;
      continue;
    }
    if (i + 1 >= body.size()) {
      *error = "\\ at end of string";
      return false;
    }
    char e = body[++i];
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': *out += '\\'; break;
      case '\'': *out += '\''; break;
      case '"': *out += '"'; break;
      case 'a': *out += '\a'; break;
      case 'b': *out += '\b'; break;
      case 'f': *out += '\f'; break;
      case 'n': *out += '\n'; break;
      case 'r': *out += '\r'; break;
      case 't': *out += '\t'; break;
      case 'v': *out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int d = 0; d < digits; ++d) {
          int h = (i + 1 < body.size()) ? hexval(body[i + 1]) : -1;
          if (h < 0) {
            *error = std::string("truncated \\") + e + std::string(digits, 'X') + " escape";
            return false;
          }
          cp = cp * 16 + static_cast<uint32_t>(h);
          ++i;
        }
        if (cp > 0x10FFFF) {
          *error = "illegal Unicode character";
          return false;
        }
        append_utf8(*out, cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int d = 0; d < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++d)
            cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
          append_utf8(*out, cp);
        } else if (e == 'N') {
          *error = "\\N{...} escapes are not supported";
          return false;
        } else {
          // Python keeps an unknown escape as written.
          *out += '\\';
          *out += e;
        }
    }
  }
  return true;
}

}  // namespace qlora::jinja::pystr
