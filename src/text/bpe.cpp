// BPE merges in HF order: lowest rank first, leftmost on ties, stale queue entries skipped.
#include "text/bpe.h"

#include <queue>

#include "core/error.h"
#include "text/unicode.h"

namespace qlora {

static uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions opt, const std::string& where)
    : vocab_(std::move(vocab)), opt_(std::move(opt)) {
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab_) {
    if (id < 0) fail(ErrorKind::Format, where + ".vocab", "negative id for token '" + tok + "'");
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), nullptr);
  for (const auto& kv : vocab_) id_to_token_[kv.second] = &kv.first;

  size_t prefix_len = opt_.continuing_subword_prefix.size();
  merges_.reserve(merges.size() * 2);
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    // The merged token drops the right part's continuation prefix ("##").
    std::string merged = a + (b.size() >= prefix_len && prefix_len > 0 &&
                                      b.compare(0, prefix_len, opt_.continuing_subword_prefix) == 0
                                  ? b.substr(prefix_len)
                                  : b);
    auto im = vocab_.find(merged);
    const std::string& missing = ia == vocab_.end() ? a : ib == vocab_.end() ? b : merged;
    if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end())
      fail(ErrorKind::Format, where + ".merges[" + std::to_string(i) + "]",
           "merge '" + a + " " + b + "' uses '" + missing + "', which is not in the vocab");
    merges_[pair_key(ia->second, ib->second)] = {static_cast<uint32_t>(i), im->second};
  }

  if (!opt_.unk_token.empty()) {
    auto it = vocab_.find(opt_.unk_token);
    if (it != vocab_.end()) unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(std::string_view(name));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  return id_to_token_[id];
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (opt_.ignore_merges) {
    if (int32_t id = token_to_id(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= kCacheCap) cache_.clear();  // bounded memory on endless new words
  cache_.emplace(std::string(word), std::move(ids));
}

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(w.size());
  auto add = [&](int32_t id) {
    int32_t n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, -1, true});
    if (n > 0) sym[n - 1].next = n;
  };

  // Pending unknown: added when the next known character arrives, or fused with the next unknown.
  bool unk_pending = false;
  std::string s;
  for (size_t i = 0; i < w.size();) {
    size_t start = i;
    unicode::next_cp(w, i);
    bool first = start == 0, last = i >= w.size();
    s.assign(w.substr(start, i - start));
    if (!first && !opt_.continuing_subword_prefix.empty()) s.insert(0, opt_.continuing_subword_prefix);
    if (last && !opt_.end_of_word_suffix.empty()) s += opt_.end_of_word_suffix;
    if (int32_t id = token_to_id(s); id >= 0) {
      if (unk_pending) {
        add(unk_id_);
        unk_pending = false;
      }
      add(id);
      continue;
    }
    if (opt_.byte_fallback) {
      bool all = true;
      for (unsigned char b : s) all = all && byte_ids_[b] >= 0;
      if (all) {
        // HF leaves a pending unknown in place here, so it lands after these bytes.
        for (unsigned char b : s) add(byte_ids_[b]);
        continue;
      }
    }
    if (!opt_.unk_token.empty()) {
      if (unk_id_ < 0)
        fail(ErrorKind::Data, "BPE model", "unk_token '" + opt_.unk_token + "' is not in the vocab",
             "the text has characters the vocab cannot represent");
      if (unk_pending && !opt_.fuse_unk) add(unk_id_);
      unk_pending = true;
    }
  }
  if (unk_pending) add(unk_id_);

  struct Merge {
    int32_t pos;
    uint32_t rank;
    int32_t new_id;
    bool operator<(const Merge& o) const {  // max-heap: invert for lowest rank, then leftmost
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  auto find_merge = [&](int32_t a, int32_t b) -> const MergeInfo* {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::priority_queue<Merge> queue;
  for (size_t k = 0; k + 1 < sym.size(); ++k)
    if (const MergeInfo* m = find_merge(sym[k].id, sym[k + 1].id))
      queue.push({static_cast<int32_t>(k), m->rank, m->new_id});

  while (!queue.empty()) {
    Merge top = queue.top();
    queue.pop();
    Symbol& cur = sym[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    int32_t next_pos = cur.next;
    const MergeInfo* m = find_merge(cur.id, sym[next_pos].id);
    if (!m || m->new_id != top.new_id) continue;  // stale entry: the pair changed since
    cur.id = top.new_id;
    sym[next_pos].alive = false;
    cur.next = sym[next_pos].next;
    if (cur.next >= 0) sym[cur.next].prev = top.pos;
    if (cur.prev >= 0)
      if (const MergeInfo* pm = find_merge(sym[cur.prev].id, cur.id))
        queue.push({cur.prev, pm->rank, pm->new_id});
    if (cur.next >= 0)
      if (const MergeInfo* nm = find_merge(cur.id, sym[cur.next].id))
        queue.push({top.pos, nm->rank, nm->new_id});
  }
  for (const Symbol& x : sym)
    if (x.alive) out.push_back(x.id);
}

}  // namespace qlora
