// Everything the trainer needs from the data layer for one run: train/eval examples and stats.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "train/data.h"
#include "train/model_source.h"
#include "train/train_config.h"

namespace qlora {

struct TrainData {
  std::vector<Example> train, eval;
  DataStats stats;
  int64_t longest = 0;  // longest row (train or eval), after truncation
  int32_t pad_id = 0;
};

// Reads cfg.train_file (+ eval_file or a val_set_size split) with the model's tokenizer and
// reports what it did through `log`.
TrainData load_train_data(const TrainConfig& cfg, const ModelSource& src, const std::function<void(const std::string&)>& log);

}  // namespace qlora
