// Tokenizer internals shared by the encode/decode code and the loaders (not a public header).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/bpe.h"
#include "text/normalizer.h"
#include "text/tokenizer.h"
#include "text/tokenizer_decoder.h"
#include "text/tokenizer_pretok.h"

namespace qlora {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
  std::string decoded;  // what decode/id_to_token show: the normalized content when normalized
};

// Leftmost-longest matching of added-token contents (what HF does with Aho-Corasick).
class AddedMatcher {
 public:
  // patterns[k] is what token index which[k] looks like in the text it is matched against.
  void build(const std::vector<std::string>& patterns, const std::vector<size_t>& which);
  bool empty() const { return patterns_.empty(); }
  // First match at or after `from`: (start, end, index into tokens); false when none.
  bool find(std::string_view s, size_t from, size_t& start, size_t& end, size_t& token) const;

 private:
  std::vector<std::string> patterns_;
  std::vector<size_t> token_of_;
  std::vector<std::vector<size_t>> by_first_byte_;  // pattern indices, longest first
};

struct Tokenizer::Impl {
  std::string name;  // file name for errors
  std::unique_ptr<BpeModel> bpe;  // null for the byte-level fallback
  bool raw_bytes = false;         // byte_level(): ids 0..255 are bytes
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  std::vector<int32_t> prefix, suffix;  // post-processor ids around a single sequence

  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  Vocab added_by_content;
  AddedMatcher raw_matcher;   // tokens with normalized == false, matched on the input
  AddedMatcher norm_matcher;  // tokens with normalized == true, matched after normalization

  std::optional<int32_t> bos, eos, pad, unk;
  std::optional<bool> add_bos, add_eos;
  std::string chat_template;
  bool clean_up_spaces = false;

  // Registers the added tokens (after normalizer is set) and builds both matchers.
  void set_added_tokens(std::vector<AddedToken> tokens);
  // Splits `text` at added tokens of `m` (HF find_matches: single_word, lstrip, rstrip).
  void split_added(const Piece& p, const AddedMatcher& m, std::vector<Piece>& out) const;
  int32_t max_id() const;
};

}  // namespace qlora
