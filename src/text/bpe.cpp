// BPE merges in HF order: lowest rank first, leftmost on ties, stale queue entries skipped.
#include "text/bpe.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "text/unicode.h"

namespace qlora {

static uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions opt, const std::string& where)
    : BpeModel(std::move(vocab), merges, {}, std::move(opt), where) {}

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   const std::vector<uint32_t>& ranks, BpeOptions opt, const std::string& where)
    : vocab_(std::move(vocab)), opt_(std::move(opt)) {
  QLORA_ASSERT(ranks.empty() || ranks.size() == merges.size());
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab_) {
    if (id < 0) fail(ErrorKind::Format, where + ".vocab", "negative id for token '" + tok + "'");
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), nullptr);
  for (const auto& kv : vocab_) id_to_token_[kv.second] = &kv.first;

  size_t prefix_len = opt_.continuing_subword_prefix.size();
  merges_.reserve(merges.size());
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
    merges_.set(pair_key(ia->second, ib->second), {ranks.empty() ? static_cast<uint32_t>(i) : ranks[i], im->second});
  }

  if (!opt_.unk_token.empty()) {
    auto it = vocab_.find(opt_.unk_token);
    if (it != vocab_.end()) unk_id_ = it->second;
  }
  if (opt_.continuing_subword_prefix.empty() && opt_.end_of_word_suffix.empty()) {
    cp_ids_.assign(kCpTable, -1);
    std::string ch;
    for (uint32_t cp = 0; cp < kCpTable; ++cp) {
      if (cp >= 0xD800 && cp < 0xE000) continue;
      ch.clear();
      unicode::append_utf8(ch, cp);
      cp_ids_[cp] = token_to_id(ch);
    }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(std::string_view(name));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

void BpeModel::MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;  // load factor <= 1/2
  slots_.assign(cap, Slot{kEmpty, {0, 0}});
  mask_ = cap - 1;
  size_ = 0;
}

void BpeModel::MergeTable::set(uint64_t key, MergeInfo info) {
  if ((size_ + 1) * 2 > slots_.size()) {  // grow (reserve() normally makes this unnecessary)
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(16, old.size()));
    for (const Slot& s : old)
      if (s.key != kEmpty) set(s.key, s.info);
  }
  for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.info = info;
      return;
    }
    if (s.key == kEmpty) {
      s = {key, info};
      ++size_;
      return;
    }
  }
}

// Decodes one well-formed UTF-8 character of at most 3 bytes at w[i]; false for anything else
// (4-byte characters, malformed bytes), which then take the general path.
static inline bool small_cp(std::string_view w, size_t i, uint32_t& cp, size_t& n) {
  auto b0 = static_cast<unsigned char>(w[i]);
  if (b0 < 0x80) {
    cp = b0;
    n = 1;
    return true;
  }
  auto cont = [&](size_t k) {
    return i + k < w.size() && (static_cast<unsigned char>(w[i + k]) & 0xC0) == 0x80;
  };
  if ((b0 & 0xE0) == 0xC0 && cont(1)) {
    cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(w[i + 1]) & 0x3Fu);
    n = 2;
    return cp >= 0x80;
  }
  if ((b0 & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    cp = ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(w[i + 1]) & 0x3Fu) << 6) |
         (static_cast<unsigned char>(w[i + 2]) & 0x3Fu);
    n = 3;
    return cp >= 0x800;
  }
  return false;
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
  if (word.size() >= kCacheMaxWord) {  // long words rarely repeat: not worth the memory
    merge_word(word, out);
    return;
  }
  uint64_t h = std::hash<std::string_view>{}(word);
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.get(word, h, out)) return;
  }
  size_t before = out.size();
  merge_word(word, out);
  std::lock_guard<std::mutex> lock(cache_mu_);
  cache_.put(word, h, out.data() + before, out.size() - before);
}

void BpeModel::clear_cache() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  cache_.clear();
}

BpeModel::WordCache::WordCache(size_t capacity) : capacity_(capacity) {
  size_t n = 16;
  while (n < capacity * 2) n <<= 1;  // load factor <= 1/2
  mask_ = n - 1;
  slots_.assign(n, Slot{0, 0});
}

void BpeModel::WordCache::clear() {
  if (size_ == 0) return;
  std::fill(slots_.begin(), slots_.end(), Slot{0, 0});
  arena_.clear();
  size_ = 0;
}

bool BpeModel::WordCache::get(std::string_view w, uint64_t h, std::vector<int32_t>& out) const {
  uint32_t tag = static_cast<uint32_t>(h >> 32) | 1u;
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.tag == 0) return false;
    if (s.tag != tag) continue;
    const uint32_t* e = arena_.data() + s.off;
    size_t klen = e[0] & 0xFFFF, n = e[0] >> 16;
    if (klen != w.size() || std::memcmp(e + 1, w.data(), klen) != 0) continue;
    const auto* ids = reinterpret_cast<const int32_t*>(e + 1 + (klen + 3) / 4);
    out.insert(out.end(), ids, ids + n);
    return true;
  }
}

void BpeModel::WordCache::put(std::string_view w, uint64_t h, const int32_t* ids, size_t n) {
  if (w.size() > 0xFFFF || n > 0xFFFF) return;
  size_t words = 1 + (w.size() + 3) / 4 + n;
  if (size_ >= capacity_ || arena_.size() + words > kCacheArenaWords) clear();
  uint32_t tag = static_cast<uint32_t>(h >> 32) | 1u;
  size_t i = h & mask_;
  for (;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.tag == 0) break;
    if (s.tag != tag) continue;
    const uint32_t* e = arena_.data() + s.off;
    size_t klen = e[0] & 0xFFFF;
    if (klen == w.size() && std::memcmp(e + 1, w.data(), klen) == 0) return;  // already there
  }
  size_t off = arena_.size();
  arena_.resize(off + words, 0);
  uint32_t* e = arena_.data() + off;
  e[0] = static_cast<uint32_t>(w.size() | (n << 16));
  if (!w.empty()) std::memcpy(e + 1, w.data(), w.size());
  if (n) std::memcpy(e + 1 + (w.size() + 3) / 4, ids, n * sizeof(int32_t));  // a word may encode to no ids
  slots_[i] = {tag, static_cast<uint32_t>(off)};
  ++size_;
}

struct BpeModel::MergeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  struct Merge {
    int32_t pos;
    uint32_t rank;
    int32_t new_id;
    bool operator<(const Merge& o) const {  // max-heap: invert for lowest rank, then leftmost
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Symbol> sym;
  // Binary heap on a reused buffer (std::priority_queue's order: lowest rank, then leftmost).
  std::vector<Merge> queue;

  void add(int32_t id) {  // appends a symbol linked after the last one
    int32_t n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, -1, true});
    if (n > 0) sym[n - 1].next = n;
  }
  void push(Merge m) {
    queue.push_back(m);
    std::push_heap(queue.begin(), queue.end());
  }
};

void BpeModel::initial_symbols(std::string_view w, MergeScratch& sc) const {
  // Pending unknown: added when the next known character arrives, or fused with the next unknown.
  bool unk_pending = false;
  std::string s;
  const bool cp_table = !cp_ids_.empty();
  for (size_t i = 0; i < w.size();) {
    if (cp_table) {  // fast path: a character that is itself a vocab token
      uint32_t cp;
      size_t n;
      if (small_cp(w, i, cp, n) && cp < kCpTable && cp_ids_[cp] >= 0) {
        if (unk_pending) {
          sc.add(unk_id_);
          unk_pending = false;
        }
        sc.add(cp_ids_[cp]);
        i += n;
        continue;
      }
    }
    size_t start = i;
    unicode::next_cp(w, i);
    bool first = start == 0, last = i >= w.size();
    s.assign(w.substr(start, i - start));
    if (!first && !opt_.continuing_subword_prefix.empty()) s.insert(0, opt_.continuing_subword_prefix);
    if (last && !opt_.end_of_word_suffix.empty()) s += opt_.end_of_word_suffix;
    if (int32_t id = token_to_id(s); id >= 0) {
      if (unk_pending) {
        sc.add(unk_id_);
        unk_pending = false;
      }
      sc.add(id);
      continue;
    }
    if (opt_.byte_fallback) {
      bool all = true;
      for (unsigned char b : s) all = all && byte_ids_[b] >= 0;
      if (all) {
        // HF leaves a pending unknown in place here, so it lands after these bytes.
        for (unsigned char b : s) sc.add(byte_ids_[b]);
        continue;
      }
    }
    if (!opt_.unk_token.empty()) {
      if (unk_id_ < 0)
        fail(ErrorKind::Data, "BPE model", "unk_token '" + opt_.unk_token + "' is not in the vocab",
             "the text has characters the vocab cannot represent");
      if (unk_pending && !opt_.fuse_unk) sc.add(unk_id_);
      unk_pending = true;
    }
  }
  if (unk_pending) sc.add(unk_id_);
}

void BpeModel::apply_merges(MergeScratch& sc) const {
  auto& sym = sc.sym;
  auto& queue = sc.queue;
  auto find_merge = [&](int32_t a, int32_t b) { return merges_.find(pair_key(a, b)); };
  queue.clear();
  for (size_t k = 0; k + 1 < sym.size(); ++k)
    if (const MergeInfo* m = find_merge(sym[k].id, sym[k + 1].id))
      sc.push({static_cast<int32_t>(k), m->rank, m->new_id});

  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end());
    MergeScratch::Merge top = queue.back();
    queue.pop_back();
    MergeScratch::Symbol& cur = sym[top.pos];
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
        sc.push({cur.prev, pm->rank, pm->new_id});
    if (cur.next >= 0)
      if (const MergeInfo* nm = find_merge(cur.id, sym[cur.next].id))
        sc.push({top.pos, nm->rank, nm->new_id});
  }
}

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  // Scratch buffers reused across calls on this thread (merge_word never re-enters itself).
  thread_local MergeScratch sc;
  sc.sym.clear();
  sc.sym.reserve(w.size());
  initial_symbols(w, sc);
  apply_merges(sc);
  for (const MergeScratch::Symbol& x : sc.sym)
    if (x.alive) out.push_back(x.id);
  if (sc.sym.capacity() > (size_t{1} << 16)) {  // one huge word: do not keep its buffers around
    std::vector<MergeScratch::Symbol>().swap(sc.sym);
    std::vector<MergeScratch::Merge>().swap(sc.queue);
  }
}

}  // namespace qlora
