// MetricsWriter: one JSON object per line in <output_dir>/metrics.jsonl, flushed as it is written.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace qlora {

class MetricsWriter {
 public:
  // Appends to <output_dir>/metrics.jsonl (output_dir is created). keep_through_step >= 0 first
  // drops records whose "step" is larger, and torn lines, so a resumed run does not log twice.
  explicit MetricsWriter(const std::string& output_dir, int64_t keep_through_step = -1);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // record must be a JSON object; NaN/inf numbers are written as null (JSON has no NaN).
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace qlora
