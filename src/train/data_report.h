// What the prepared data is, in words and numbers: the summary a run logs and `qlora data` prints.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/train_data.h"

namespace qlora {

// The summary lines load_train_data logs (also printed by `qlora data`).
std::vector<std::string> describe_train_data(const TrainData& d, const TrainConfig& cfg);

// `qlora data`'s report: examples per length (powers of two: 1-16, 17-32, ... up to the longest),
// what packing gives the train examples (or would give, when off), and everything as one JSON object.
struct LengthBucket {
  int64_t lo, hi, count;
};
std::vector<LengthBucket> length_histogram(const DatasetStats& st);
PackStats packing_of(const TrainData& d, const TrainConfig& cfg);
nlohmann::json train_data_json(const TrainData& d, const TrainConfig& cfg);

}  // namespace qlora
