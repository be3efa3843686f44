// Python str semantics over UTF-8 (length, slicing, strip/split, case, repr) for templates.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qlora::jinja::pystr {

// str.isspace() for one code point (Python's list: ASCII controls \t..\r, \x1c-\x1f, Zs, U+0085,
// U+2028/2029).
bool is_space(uint32_t cp);

std::vector<uint32_t> decode(std::string_view s);  // invalid bytes read as U+FFFD
std::string encode(const std::vector<uint32_t>& cps);
size_t length(std::string_view s);  // code points

// chars == nullopt strips whitespace (Python's default); otherwise any code point in *chars.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// sep == nullopt: split on whitespace runs, dropping empty pieces. maxsplit < 0: no limit.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title(): a cased char after an uncased one goes upper
std::string capitalize(std::string_view s);  // first char upper, the rest lower
std::string jinja_title(std::string_view s); // the |title filter: words split at [-\s({\[<]+
bool is_upper(std::string_view s);
bool is_lower(std::string_view s);
bool is_alpha(std::string_view s);
bool is_digit(std::string_view s);
bool is_alnum(std::string_view s);
bool is_space_str(std::string_view s);

// Python slice s[start:stop:step] over code points (each bound optional).
std::string slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> stop,
                  std::optional<int64_t> step);
// Python slice index normalisation for a sequence of length n; returns the indices taken.
std::vector<size_t> slice_indices(size_t n, std::optional<int64_t> start, std::optional<int64_t> stop,
                                  std::optional<int64_t> step);

// Python repr() of a str: single quotes unless the text holds ' and no ", escapes for \\ \n \r \t,
// other non-printable code points as \xNN / \uNNNN / \UNNNNNNNN.
std::string repr(std::string_view s);

// Python's "unicode-escape" decoding of a Jinja string literal body (non-ASCII kept as is).
// Returns false with *error set on a malformed escape.
bool unescape_literal(std::string_view body, std::string* out, std::string* error);

}  // namespace qlora::jinja::pystr
