// UTF-8 helpers, byte-level alphabet, character classes and normalization (utf8proc when built in).
#include "text/unicode.h"

#include <array>
#include <cstdlib>
#include <cwctype>
#include <locale.h>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "text/tokenizer_regex.h"

// The build defines QLORA_HAVE_UTF8PROC (and links libutf8proc) when the library is found;
// without it NFC/NFKC normalizers are rejected at load time with a hint.
#if defined(QLORA_HAVE_UTF8PROC)
#include <utf8proc.h>
#endif

namespace qlora::unicode {

size_t cp_len(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 1;
}

uint32_t next_cp(std::string_view s, size_t& i) {
  unsigned char b = s[i];
  size_t n = cp_len(b);
  if (n == 1 || i + n > s.size()) {
    ++i;
    return b < 0x80 ? b : kReplacement;
  }
  uint32_t cp = b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length of the valid sequence at s[i], or 0 with *bad_len = bytes of the maximal invalid
// subsequence (the WHATWG / Rust lossy rule: stop at the first byte that cannot continue).
static size_t valid_len(std::string_view s, size_t i, size_t* bad_len) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char b = byte(i);
  if (b < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) n = 2;
  else if (b == 0xE0) n = 3, lo = 0xA0;
  else if (b >= 0xE1 && b <= 0xEC) n = 3;
  else if (b == 0xED) n = 3, hi = 0x9F;
  else if (b >= 0xEE && b <= 0xEF) n = 3;
  else if (b == 0xF0) n = 4, lo = 0x90;
  else if (b >= 0xF1 && b <= 0xF3) n = 4;
  else if (b == 0xF4) n = 4, hi = 0x8F;
  else {
    *bad_len = 1;
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) {
      *bad_len = k;
      return 0;
    }
    unsigned char c = byte(i + k);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) {
      *bad_len = k;
      return 0;
    }
  }
  return n;
}

bool is_valid_utf8(std::string_view s, size_t* bad_at) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0, n = valid_len(s, i, &bad);
    if (n == 0) {
      if (bad_at) *bad_at = i;
      return false;
    }
    i += n;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t bad = 0, n = valid_len(s, i, &bad);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      append_utf8(out, kReplacement);
      i += bad;
    }
  }
  return out;
}

namespace {
struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_str{};
  std::array<std::array<char, 2>, 256> enc{};  // to_str as 1 or 2 bytes (all code points < 0x800)
  std::array<uint8_t, 256> enc_len{};
  std::array<int, 324> from_cp{};  // alphabet code points are all < 0x144
  ByteMap() {
    from_cp.fill(-1);
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? b : extra++;
      from_cp[to_cp[b]] = b;
      append_utf8(to_str[b], to_cp[b]);
      enc_len[b] = static_cast<uint8_t>(to_str[b].size());
      for (size_t k = 0; k < to_str[b].size(); ++k) enc[b][k] = to_str[b][k];
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

uint32_t byte_to_cp(uint8_t b) { return byte_map().to_cp[b]; }
int cp_to_byte(uint32_t cp) { return cp < 324 ? byte_map().from_cp[cp] : -1; }

std::string bytes_to_alphabet(std::string_view s) {
  const ByteMap& m = byte_map();
  std::string out(s.size() * 2, '\0');
  char* p = out.data();
  for (unsigned char b : s) {
    p[0] = m.enc[b][0];
    p[1] = m.enc[b][1];
    p += m.enc_len[b];
  }
  out.resize(static_cast<size_t>(p - out.data()));
  return out;
}

bool is_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') ||
                        (cp >= 'A' && cp <= 'Z') || cp == '_';
  // Only consulted for single_word added tokens, so one regex call per check is fine.
  static const Regex word(
      R"([\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}\x{24B6}-\x{24E9}])", "unicode word class");
  std::string s;
  append_utf8(s, cp);
  return word.matches_at(s, 0) == s.size();
}

void append_lowercase(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return;
  }
  if (cp == 0x130) {  // the one unconditional multi-char lowercase mapping: i + combining dot
    out += "i\xCC\x87";
    return;
  }
#if defined(QLORA_HAVE_UTF8PROC)
  append_utf8(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
#else
  static locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
  append_utf8(out, loc ? static_cast<uint32_t>(towlower_l(static_cast<wint_t>(cp), loc)) : cp);
#endif
}

bool has_normalization() {
#if defined(QLORA_HAVE_UTF8PROC)
  return true;
#else
  return false;
#endif
}

std::string normalize(std::string_view s, NormForm form) {
#if defined(QLORA_HAVE_UTF8PROC)
  int opt = UTF8PROC_STABLE;
  switch (form) {
    case NormForm::NFC: opt |= UTF8PROC_COMPOSE; break;
    case NormForm::NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case NormForm::NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormForm::NFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                    static_cast<utf8proc_option_t>(opt));
  if (n < 0)
    fail(ErrorKind::Data, "unicode normalization", utf8proc_errmsg(n),
         "the text must be valid UTF-8");
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> hold(dst, &std::free);
  return std::string(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
#else
  (void)s;
  (void)form;
  fail(ErrorKind::Unsupported, "unicode normalization",
       "this build has no Unicode normalization library (NFC/NFD/NFKC/NFKD)",
       "install libutf8proc-dev and rebuild; CMake defines QLORA_HAVE_UTF8PROC when it is found");
#endif
}

}  // namespace qlora::unicode
