// Training data at the engine boundary: JSONL rows -> token examples -> shuffled micro-batches.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/batch.h"

namespace qlora {

// Tokens of one training row, Hugging Face style: labels[t] is the label of token t (-100 = no loss).
struct Example {
  std::vector<int32_t> ids, labels;
  int64_t n_trained() const;  // tokens that produce loss after the causal shift
};

// What the data layer needs from a tokenizer.
struct TextEncoder {
  std::function<std::vector<int32_t>(const std::string&)> encode;
  int32_t bos = -1, eos = -1;  // -1 = none
  int64_t vocab_size = 0;
  std::string name;
};

struct DataStats {
  int64_t rows = 0, truncated = 0, dropped = 0, skipped_no_loss = 0, tokens = 0, trained_tokens = 0;
  int64_t longest = 0;
};

// Reads JSONL rows {"text": ...} or pre-tokenized {"input_ids": [...], "labels": [...]?}.
// Truncation policy for rows longer than max_length: truncate_right | truncate_left | drop | error.
// Errors name file:line and what is wrong; an empty result is an error.
std::vector<Example> load_jsonl_examples(const std::string& path, const TextEncoder& enc, int64_t max_length,
                                         const std::string& truncation, DataStats* stats);

// Splits off the last `n_eval` examples of a seeded permutation as the eval set.
void split_eval(std::vector<Example>& train, std::vector<Example>& eval, int64_t n_eval, uint64_t seed);

// Deterministic epoch-shuffled stream of micro-batches; its cursor (epoch, index) is checkpointed.
class DataStream {
 public:
  DataStream(const std::vector<Example>* examples, int64_t batch_size, uint64_t seed, int32_t pad_id);
  Batch next();                    // pads to the longest row of the micro-batch; pad targets -100
  int64_t epoch() const { return epoch_; }
  int64_t index() const { return index_; }
  void seek(int64_t epoch, int64_t index);
  int64_t batches_per_epoch() const;

 private:
  void shuffle();
  const std::vector<Example>* ex_;
  int64_t bs_;
  uint64_t seed_;
  int32_t pad_;
  int64_t epoch_ = 0, index_ = 0;
  std::vector<int64_t> order_;
};

// Batches of a fixed list, in order (evaluation).
std::vector<Batch> make_batches(const std::vector<Example>& ex, int64_t batch_size, int32_t pad_id);

}  // namespace qlora
