// PCRE2 (UTF + UCP, JIT) regex used by pre-tokenizers and normalizers, with Oniguruma's \s.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qlora {

// HF tokenizers compiles its patterns with Oniguruma, whose \s is the White_Space property;
// PCRE2's \s also matches U+180E and its \w leaves out combining marks. Patterns are rewritten so
// \s \S \w \W mean what Oniguruma means.
std::string onig_compatible_pattern(std::string_view pattern);

// What a pattern is matched against. Utf8: valid UTF-8 with Unicode classes (UTF + UCP) and
// Oniguruma's \s \w. Bytes: a byte string, each byte one character, classes ASCII-only as in
// C++ std::regex under the "C" locale (\s is space, \t \n \v \f \r; no byte >= 0x80 is a space,
// letter or digit); the pattern is taken as PCRE2 writes it.
enum class RegexText { Utf8, Bytes };

class Regex {
 public:
  // Compile errors -> Error(Format, where) quoting PCRE2's message and the offset in the pattern.
  Regex(std::string_view pattern, const std::string& where, RegexText text = RegexText::Utf8);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All non-overlapping matches, left to right, as byte ranges [first, second) of s (valid
  // UTF-8 for RegexText::Utf8). An empty match advances by one character.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
  // End offset of a match anchored at `at`, or npos when none.
  size_t matches_at(std::string_view s, size_t at) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  std::string where_;
  RegexText text_;
};

// A literal string or a regex ({"String": ..} / {"Regex": ..} in tokenizer.json), as used by
// Split, Replace and the Replace decoder: all non-overlapping occurrences, left to right.
class Pattern {
 public:
  Pattern() = default;
  Pattern(bool is_regex, std::string_view text, const std::string& where);
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
  // Every occurrence replaced by `content`.
  std::string replace_all(std::string_view s, std::string_view content) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> re_;
};

}  // namespace qlora
