// UTF-8 helpers, GPT-2 byte<->char map, Unicode classes and normalization forms for the tokenizer.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace qlora::unicode {

constexpr uint32_t kReplacement = 0xFFFD;

// Decodes the code point at s[i] and advances i. Assumes valid UTF-8 (see is_valid_utf8); a
// malformed byte yields U+FFFD and advances by one.
uint32_t next_cp(std::string_view s, size_t& i);
// Byte length of the UTF-8 sequence that starts with lead byte b (1 for stray continuation bytes).
size_t cp_len(unsigned char b);
void append_utf8(std::string& out, uint32_t cp);

// Strict UTF-8 check (no overlongs, surrogates or values past U+10FFFF). On failure *bad_at
// (if given) is the byte offset of the first bad sequence.
bool is_valid_utf8(std::string_view s, size_t* bad_at = nullptr);
// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// GPT-2 byte-level alphabet: every byte maps to one printable code point (space -> U+0120 'Ġ').
uint32_t byte_to_cp(uint8_t b);
int cp_to_byte(uint32_t cp);  // -1 when cp is not in the alphabet
// Maps each byte of s to its alphabet character (UTF-8 encoded).
std::string bytes_to_alphabet(std::string_view s);

// Character classes with the meaning Rust gives them (HF tokenizers is written in Rust).
bool is_whitespace(uint32_t cp);  // char::is_whitespace (White_Space property)
bool is_word_char(uint32_t cp);   // regex \w: alphabetic, marks, Nd, Pc, joiners

// Rust char::to_lowercase, appended as UTF-8 (may be more than one code point: U+0130).
void append_lowercase(std::string& out, uint32_t cp);

enum class NormForm { NFC, NFD, NFKC, NFKD };
// True when built with a Unicode normalization library (utf8proc).
bool has_normalization();
// Error(Unsupported) when has_normalization() is false.
std::string normalize(std::string_view s, NormForm form);

}  // namespace qlora::unicode
