// Dataset weights, eval split, padded/packed micro-batches and the epoch-shuffled stream.
#include "train/data.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace qlora {

namespace {

std::vector<int64_t> permutation(size_t n, uint64_t seed) {
  std::vector<int64_t> idx(n);
  for (size_t i = 0; i < n; i++) idx[i] = int64_t(i);
  Rng rng(seed);
  for (size_t i = n; i > 1; i--) std::swap(idx[i - 1], idx[rng.below(i)]);
  return idx;
}

}  // namespace

std::vector<int64_t> weight_indices(size_t n, double weight, uint64_t seed) {
  if (!(weight > 0) || !std::isfinite(weight))
    fail(ErrorKind::Config, "datasets weight", "weight " + std::to_string(weight) + " is not a positive number");
  std::vector<int64_t> out;
  if (weight == 1.0) {
    for (size_t i = 0; i < n; i++) out.push_back(int64_t(i));
    return out;
  }
  const auto copies = int64_t(std::floor(weight));
  const auto extra = int64_t(std::llround((weight - double(copies)) * double(n)));
  out.reserve(size_t(copies) * n + size_t(extra));
  for (int64_t c = 0; c < copies; c++)
    for (size_t i = 0; i < n; i++) out.push_back(int64_t(i));
  std::vector<int64_t> pick = permutation(n, seed ^ 0x3e1ull);
  pick.resize(size_t(extra));
  std::sort(pick.begin(), pick.end());
  out.insert(out.end(), pick.begin(), pick.end());
  return out;
}

std::vector<Example> apply_weight(std::vector<Example> ex, double weight, uint64_t seed) {
  if (weight == 1.0) return ex;
  std::vector<Example> out;
  for (int64_t i : weight_indices(ex.size(), weight, seed)) out.push_back(ex[size_t(i)]);
  return out;
}

std::vector<bool> eval_mask(size_t n, int64_t n_eval, uint64_t seed) {
  std::vector<bool> is_eval(n, false);
  if (n_eval <= 0) return is_eval;
  if (n_eval >= int64_t(n))
    fail(ErrorKind::Config, "val_set_size", "asks for " + std::to_string(n_eval) + " eval rows but the dataset has only " +
                                                std::to_string(n));
  const std::vector<int64_t> idx = permutation(n, seed ^ 0x5eedull);
  for (int64_t i = 0; i < n_eval; i++) is_eval[size_t(idx[size_t(i)])] = true;
  return is_eval;
}

Batch pad_batch(const std::vector<const Example*>& rows, int32_t pad) {
  int64_t t = 0;
  bool packed = false, roles = false;
  for (auto* e : rows) {
    t = std::max<int64_t>(t, int64_t(e->ids.size()));
    packed = packed || !e->doc_lens.empty();
    roles = roles || !e->roles.empty();
  }
  const int64_t b = int64_t(rows.size());
  Batch x;
  x.b = b;
  x.t = t;
  x.tokens.assign(size_t(b * t), pad);          // (B,T)
  x.targets.assign(size_t(b * t), kIgnoreIndex);  // (B,T)
  x.positions.assign(size_t(b * t), 0);         // (B,T)
  if (packed) x.seg.assign(size_t(b * t), 0);   // (B,T)
  if (roles) x.roles.assign(size_t(b * t), int8_t(DocRole::Sft));
  // Precomputed reference log-probs travel with their rows (all rows have them, or none).
  bool ref = !rows.empty();
  for (auto* e : rows) ref = ref && !e->ref_logps.empty();
  if (ref)
    for (auto* e : rows) x.ref_logps.insert(x.ref_logps.end(), e->ref_logps.begin(), e->ref_logps.end());
  for (int64_t i = 0; i < b; i++) {
    const Example& e = *rows[size_t(i)];
    const int64_t n = int64_t(e.ids.size());
    std::vector<int32_t> lens = e.doc_lens.empty() ? std::vector<int32_t>{int32_t(n)} : e.doc_lens;
    int64_t j = 0;
    for (size_t d = 0; d < lens.size(); d++) {
      const int64_t end = j + lens[d];
      for (int64_t p = 0; j < end; j++, p++) {
        const size_t at = size_t(i * t + j);
        x.tokens[at] = e.ids[size_t(j)];
        x.positions[at] = int32_t(p);
        if (j + 1 < end) x.targets[at] = e.labels[size_t(j + 1)];  // never across a document end
        if (packed) x.seg[at] = int32_t(d);
        if (roles && !e.roles.empty()) x.roles[at] = int8_t(e.roles[size_t(j)]);
      }
    }
    QLORA_ASSERT(j == n);
    if (n < t) {  // right padding: every row's real length, for what must leave padding out
      if (x.lens.empty()) x.lens.assign(size_t(b), int32_t(t));
      x.lens[size_t(i)] = int32_t(n);
    }
    // Padding: in packed rows its own segment (ids stay increasing along the row) with positions
    // from 0; in plain rows positions run on, as Hugging Face numbers a padded row.
    for (int64_t p = 0; j < t; j++, p++) {
      x.positions[size_t(i * t + j)] = int32_t(packed ? p : j);
      if (packed) x.seg[size_t(i * t + j)] = int32_t(lens.size());
    }
  }
  return x;
}

DataStream::DataStream(const ExampleSet* ex, int64_t bs, uint64_t seed, int32_t pad)
    : ex_(ex), bs_(bs), seed_(seed), pad_(pad) {
  shuffle();
}

void DataStream::shuffle() { order_ = permutation(ex_->size(), seed_ * 1000003ull + uint64_t(epoch_)); }

int64_t DataStream::batches_per_epoch() const { return (int64_t(ex_->size()) + bs_ - 1) / bs_; }

void DataStream::seek(int64_t epoch, int64_t index) {
  epoch_ = epoch;
  index_ = index;
  shuffle();
}

Batch DataStream::next() {
  if (index_ >= int64_t(order_.size())) {
    epoch_++;
    index_ = 0;
    shuffle();
  }
  std::vector<Example> made;
  while (int64_t(made.size()) < bs_ && index_ < int64_t(order_.size())) made.push_back((*ex_)[size_t(order_[size_t(index_++)])]);
  std::vector<const Example*> rows;
  for (const Example& e : made) rows.push_back(&e);
  return pad_batch(rows, pad_);
}

std::vector<Batch> make_batches(const std::vector<Example>& ex, int64_t bs, int32_t pad) {
  std::vector<Batch> out;
  for (size_t i = 0; i < ex.size(); i += size_t(bs)) {
    std::vector<const Example*> rows;
    for (size_t j = i; j < std::min(ex.size(), i + size_t(bs)); j++) rows.push_back(&ex[j]);
    out.push_back(pad_batch(rows, pad));
  }
  return out;
}

std::vector<Batch> make_batches(const ExampleSet& ex, int64_t bs, int32_t pad) {
  std::vector<Batch> out;
  for (size_t i = 0; i < ex.size(); i += size_t(bs)) {
    std::vector<Example> made;
    for (size_t j = i; j < std::min(ex.size(), i + size_t(bs)); j++) made.push_back(ex[j]);
    std::vector<const Example*> rows;
    for (const Example& e : made) rows.push_back(&e);
    out.push_back(pad_batch(rows, pad));
  }
  return out;
}

}  // namespace qlora
