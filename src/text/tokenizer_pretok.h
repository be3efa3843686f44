// Pre-tokenizers of tokenizer.json (ByteLevel, Split, Metaspace, Digits, Whitespace, Sequence ...).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace qlora {

// One split of the input on its way to the model. Pieces that already carry an added-token id
// are left alone by pre-tokenizers.
struct Piece {
  std::string text;
  int32_t id = -1;         // added-token id, or -1 for text the model still has to tokenize
  bool at_origin = false;  // first character maps to offset 0 of the input
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Rewrites `pieces` in place (splitting and/or transforming the ones with id < 0).
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

// nullptr for JSON null; unknown types -> Error(Unsupported) naming where + ".type".
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& j, const std::string& where);

// GPT-2's pre-tokenizer regex, as HF's ByteLevel uses it.
extern const char* const kGpt2Pattern;
// The Split regexes of Llama 3's and Qwen2's tokenizer.json (llama.cpp's "llama-bpe" and "qwen2").
extern const char* const kLlama3Pattern;
extern const char* const kQwen2Pattern;
// The Split regex of o200k vocabularies' tokenizer.json (Phi-4-mini, gpt-oss; llama.cpp's "gpt-4o").
extern const char* const kO200kPattern;
// The same split as llama.cpp writes it for "gpt-4o" (llama-vocab.cpp), to run on collapsed text
// (tokenizer_collapsed.h): an upper-case letter is a letter not in [a-z], a lower-case one a
// letter not in [A-Z], \p{M} is in neither, and the contractions are spelled out in both cases.
extern const char* const kO200kLlamaCppPattern;
// The Split regex of Tekken vocabularies' tokenizer.json (Mistral NeMo, Mistral Small 3, Ministral;
// llama.cpp's "tekken"): o200k's without the contractions, digits one by one; and llama.cpp's
// spelling of it, run on collapsed text as for "gpt-4o".
extern const char* const kTekkenPattern;
extern const char* const kTekkenLlamaCppPattern;

// What llama.cpp runs for a byte-level BPE vocabulary whose split regex uses \p{..} classes:
// `pattern` (llama.cpp's spelling) on the collapsed text, matches and the text between them kept
// as pieces, then GPT-2's byte alphabet (ByteLevel without its own regex or prefix space).
std::unique_ptr<PreTokenizer> llama_cpp_byte_level(std::string_view pattern, const std::string& where);

// HF's SplitDelimiterBehavior.
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// A split of one string: byte ranges that cover it in order, each flagged as a match or not.
struct Span {
  size_t begin, end;
  bool match;
};

// Cuts `p` at `spans` following `behavior` (HF NormalizedString::split); empty pieces are dropped.
void split_piece(const Piece& p, const std::vector<Span>& spans, SplitBehavior behavior,
                 std::vector<Piece>& out);
// Turns match ranges into spans covering all of a string of length n (gaps are non-matches).
void matches_to_spans(const std::vector<std::pair<size_t, size_t>>& m, size_t n, bool invert,
                      std::vector<Span>& out);

}  // namespace qlora
