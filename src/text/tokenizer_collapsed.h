// llama.cpp's regex split for patterns with Unicode classes (unicode_regex_split, the path it calls
// "collapsed"): the text becomes one byte per code point and the pattern one over those bytes.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "text/tokenizer_pretok.h"

namespace qlora {

// llama.cpp's rewrite of a pattern for the collapsed text: each \p{N} \p{L} \p{P} \p{M} \p{S}
// becomes the category's placeholder byte (written \xD1 .. \xD5) plus the category's ASCII
// members, in brackets where it stood outside a class. Another \p{..} -> Error(Unsupported, where).
std::string collapse_pattern(std::string_view pattern, const std::string& where);

// A pre-tokenizer that cuts each piece at the matches of `pattern` (llama.cpp's spelling, with
// \p{..} classes) found on its collapsed text by C++ std::regex's rules ("C" locale), every match
// and every stretch between matches becoming a piece of the original text. The text collapses as
// llama.cpp's does: an ASCII code point stays itself, other whitespace (White_Space) becomes \v, a
// letter, number, punctuation, mark or symbol its category's placeholder byte, anything else 0xD0.
// Only the categories the pattern names are told apart (the others collapse to 0xD0 as well, which
// such a pattern cannot tell from their placeholders).
std::unique_ptr<PreTokenizer> collapsed_split(std::string_view pattern, const std::string& where);

}  // namespace qlora
