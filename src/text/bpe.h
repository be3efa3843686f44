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
  // The same with each merge's rank given (ranks[i] for merges[i]) instead of its index: merges
  // of equal rank compete by position, the leftmost first (a SentencePiece vocabulary, ranked by
  // the score of the merged piece, runs as llama.cpp's SPM tokenizer does).
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           const std::vector<uint32_t>& ranks, BpeOptions opt, const std::string& where);

  // Appends the ids for one pre-tokenized word. Thread-safe; results are cached per word (words
  // shorter than kCacheMaxWord bytes, as HF caches only those).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;
  // Empties the word cache (benchmarks measure cold-cache throughput with it).
  void clear_cache() const;

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  const std::string* id_to_token(int32_t id) const;   // nullptr when absent
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  const Vocab& vocab() const { return vocab_; }
  const BpeOptions& options() const { return opt_; }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  // merge_word's per-thread symbol list and merge queue (defined in bpe.cpp).
  struct MergeScratch;
  // Appends word's initial symbols (vocab characters, byte fallback, unknowns) to sc's symbol list.
  void initial_symbols(std::string_view word, MergeScratch& sc) const;
  // Applies the merges to sc's symbol list, lowest rank first, leftmost on ties.
  void apply_merges(MergeScratch& sc) const;

  struct MergeInfo {
    uint32_t rank;
    int32_t new_id;
  };
  // Open-addressing table of the merges, key (left id << 32) | right id (ids are >= 0, so the
  // all-ones key marks an empty slot). One probe sequence in a flat array per lookup.
  class MergeTable {
   public:
    void reserve(size_t n);
    void set(uint64_t key, MergeInfo info);  // overwrites: a later duplicate merge wins
    const MergeInfo* find(uint64_t key) const {
      if (slots_.empty()) return nullptr;
      for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
        const Slot& s = slots_[i];
        if (s.key == key) return &s.info;
        if (s.key == kEmpty) return nullptr;
      }
    }

   private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    struct Slot {
      uint64_t key;
      MergeInfo info;
    };
    static size_t hash(uint64_t k) {
      k ^= k >> 29;
      k *= 0xbf58476d1ce4e5b9ULL;
      k ^= k >> 32;
      return static_cast<size_t>(k);
    }
    std::vector<Slot> slots_;
    size_t mask_ = 0, size_ = 0;
  };

  Vocab vocab_;
  std::vector<const std::string*> id_to_token_;  // points into vocab_ keys
  MergeTable merges_;
  // Id of the token that is exactly code point cp (cp < kCpTable), -1 when the vocab has none.
  // Used for the initial symbols of a word when there is no subword prefix/suffix to attach.
  static constexpr uint32_t kCpTable = 0x3000;
  std::vector<int32_t> cp_ids_;
  BpeOptions opt_;
  int32_t unk_id_ = -1;
  int32_t byte_ids_[256];  // <0xNN> token ids for byte fallback, -1 when absent

  // Word -> ids cache: open addressing over 8-byte slots (hash tag, arena offset); each entry
  // keeps its key bytes and ids side by side in one arena, so a hit touches two cache lines
  // instead of a node-based map's four. Emptied whole when full (bounded memory).
  class WordCache {
   public:
    explicit WordCache(size_t capacity);
    // Appends the cached ids of `w` (hash h) to out; false when absent.
    bool get(std::string_view w, uint64_t h, std::vector<int32_t>& out) const;
    void put(std::string_view w, uint64_t h, const int32_t* ids, size_t n);
    void clear();

   private:
    struct Slot {
      uint32_t tag;  // high hash bits | 1; 0 = empty
      uint32_t off;  // arena index of the entry: [key len | id count << 16][key, padded][ids]
    };
    size_t capacity_, size_ = 0, mask_;
    std::vector<Slot> slots_;
    std::vector<uint32_t> arena_;
  };
  static constexpr size_t kCacheCap = 50000;
  static constexpr size_t kCacheMaxWord = 256;
  static constexpr size_t kCacheArenaWords = size_t{8} << 20;  // 32 MiB of keys and ids at most
  mutable std::mutex cache_mu_;
  mutable WordCache cache_{kCacheCap};
};

}  // namespace qlora
