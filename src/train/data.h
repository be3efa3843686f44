// Training data at the engine boundary: examples (text/dataset.h) -> shuffled micro-batches.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/batch.h"
#include "text/dataset.h"
#include "text/example_store.h"

namespace qlora {

static_assert(kNoLoss == kIgnoreIndex, "dataset labels and batch targets share the ignore index");

// What the data layer needs from a tokenizer (kept for model sources and the trainer's report).
struct TextEncoder {
  std::function<std::vector<int32_t>(const std::string&)> encode;
  int32_t bos = -1, eos = -1;  // -1 = none
  int64_t vocab_size = 0;
  std::string name;
};

// Repeats/subsamples examples by a weight: floor(w) full copies plus a seeded subset of
// round(frac(w) * n) rows, in file order within each copy.
std::vector<Example> apply_weight(std::vector<Example> ex, double weight, uint64_t seed);
// The same as indices: which of n rows, in what order, apply_weight keeps.
std::vector<int64_t> weight_indices(size_t n, double weight, uint64_t seed);

// Which of n rows form the eval set: `n_eval` of a seeded permutation.
std::vector<bool> eval_mask(size_t n, int64_t n_eval, uint64_t seed);

// Right-pads rows to the longest one. Packed rows (doc_lens) get positions that restart at each
// document, one segment id per document (padding gets its own) and no target across documents.
Batch pad_batch(const std::vector<const Example*>& rows, int32_t pad_id);

// Deterministic epoch-shuffled stream of micro-batches; its cursor (epoch, index) is checkpointed.
class DataStream {
 public:
  DataStream(const ExampleSet* examples, int64_t batch_size, uint64_t seed, int32_t pad_id);
  Batch next();  // pads to the longest row of the micro-batch; pad targets -100
  int64_t epoch() const { return epoch_; }
  int64_t index() const { return index_; }
  // Epochs whose every micro-batch has been drawn (the next draw starts epoch() + 1 when the
  // current one is used up).
  int64_t completed_epochs() const { return epoch_ + (index_ >= int64_t(order_.size()) ? 1 : 0); }
  void seek(int64_t epoch, int64_t index);
  int64_t batches_per_epoch() const;

 private:
  void shuffle();
  const ExampleSet* ex_;
  int64_t bs_;
  uint64_t seed_;
  int32_t pad_;
  int64_t epoch_ = 0, index_ = 0;
  std::vector<int64_t> order_;
};

// Batches of a fixed list, in order (evaluation).
std::vector<Batch> make_batches(const std::vector<Example>& ex, int64_t batch_size, int32_t pad_id);
std::vector<Batch> make_batches(const ExampleSet& ex, int64_t batch_size, int32_t pad_id);

}  // namespace qlora
