// BPE model: vocab + ranked merges, exact HF merge order (priority queue), byte fallback, word cache.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace qlora {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  std::string unk_token;                  // "" = none: unknown characters are dropped
  std::string continuing_subword_prefix;  // "" = none
  std::string end_of_word_suffix;         // "" = none
  bool fuse_unk = false;
  bool byte_fallback = false;  // unknown characters become <0xNN> tokens when those exist
  bool ignore_merges = false;  // a word found whole in the vocab is one token (Llama 3)
};

class BpeModel {
 public:
  // `where` names the source in errors ("tokenizer.json: model"). Merges whose parts or result
  // are missing from the vocab are Error(Format) naming the merge index.
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions opt, const std::string& where);

  // Appends the ids for one pre-tokenized word. Thread-safe; results are cached per word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  const std::string* id_to_token(int32_t id) const;   // nullptr when absent
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  const Vocab& vocab() const { return vocab_; }
  const BpeOptions& options() const { return opt_; }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  struct MergeInfo {
    uint32_t rank;
    int32_t new_id;
  };
  Vocab vocab_;
  std::vector<const std::string*> id_to_token_;  // points into vocab_ keys
  std::unordered_map<uint64_t, MergeInfo> merges_;  // key: (left id << 32) | right id
  BpeOptions opt_;
  int32_t unk_id_ = -1;
  int32_t byte_ids_[256];  // <0xNN> token ids for byte fallback, -1 when absent

  static constexpr size_t kCacheCap = 50000;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace qlora
