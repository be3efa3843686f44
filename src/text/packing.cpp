// First-fit-decreasing packing with a max-segment-tree over bins (O(n log n) for any n).
#include "text/packing.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace qlora {

namespace {

// Remaining capacity of bins 0..n-1 (unopened bins are empty); finds the leftmost bin with room.
class BinTree {
 public:
  BinTree(size_t n, int64_t capacity) : size_(1) {
    while (size_ < n) size_ *= 2;
    room_.assign(2 * size_, 0);
    for (size_t i = 0; i < n; i++) room_[size_ + i] = capacity;
    for (size_t i = size_ - 1; i > 0; i--) room_[i] = std::max(room_[2 * i], room_[2 * i + 1]);
  }
  size_t first_fit(int64_t len) const {
    size_t i = 1;
    while (i < size_) i = room_[2 * i] >= len ? 2 * i : 2 * i + 1;
    return i - size_;
  }
  void take(size_t bin, int64_t len) {
    size_t i = size_ + bin;
    room_[i] -= len;
    for (i /= 2; i > 0; i /= 2) room_[i] = std::max(room_[2 * i], room_[2 * i + 1]);
  }

 private:
  size_t size_;
  std::vector<int64_t> room_;  // (2*size) max remaining capacity per subtree
};

}  // namespace

std::vector<std::vector<int64_t>> pack_ffd(const std::vector<int64_t>& lengths, int64_t capacity, uint64_t seed) {
  const size_t n = lengths.size();
  for (size_t i = 0; i < n; i++)
    if (lengths[i] < 1 || lengths[i] > capacity)
      fail(ErrorKind::Internal, "pack_ffd", "document " + std::to_string(i) + " has " + std::to_string(lengths[i]) +
                                                " tokens; packing needs 1.." + std::to_string(capacity));
  std::vector<int64_t> order(n);
  for (size_t i = 0; i < n; i++) order[i] = int64_t(i);
  Rng rng(seed ^ 0x9ac4ull);
  for (size_t i = n; i > 1; i--) std::swap(order[i - 1], order[rng.below(i)]);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<int64_t>> bins;
  if (n == 0) return bins;
  BinTree tree(n, capacity);
  for (int64_t d : order) {
    const size_t b = tree.first_fit(lengths[size_t(d)]);
    tree.take(b, lengths[size_t(d)]);
    if (b >= bins.size()) bins.resize(b + 1);
    bins[b].push_back(d);
  }
  return bins;
}

std::vector<Example> pack_examples(const std::vector<Example>& docs, int64_t capacity, uint64_t seed,
                                   PackStats* stats) {
  std::vector<int64_t> lengths(docs.size());
  for (size_t i = 0; i < docs.size(); i++) lengths[i] = int64_t(docs[i].ids.size());
  PackStats st;
  st.documents = int64_t(docs.size());
  st.capacity = capacity;
  std::vector<Example> rows;
  for (const auto& bin : pack_ffd(lengths, capacity, seed)) {
    Example row;
    for (int64_t d : bin) {
      const Example& doc = docs[size_t(d)];
      QLORA_ASSERT(doc.doc_lens.empty());
      row.ids.insert(row.ids.end(), doc.ids.begin(), doc.ids.end());
      row.labels.push_back(kNoLoss);
      row.labels.insert(row.labels.end(), doc.labels.begin() + 1, doc.labels.end());
      row.doc_lens.push_back(int32_t(doc.ids.size()));
    }
    st.tokens += int64_t(row.ids.size());
    rows.push_back(std::move(row));
  }
  st.rows = int64_t(rows.size());
  if (stats) *stats = st;
  return rows;
}

}  // namespace qlora
