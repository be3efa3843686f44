// TensorBoard event files: scalars as TensorBoard's Event / Summary protobufs (protobuf from Debian,
// the schema in train/tensorboard_event.proto) in TFRecord framing, one file per run.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qlora {

class TensorBoardWriter {
 public:
  // Creates `dir` and events.out.tfevents.<unix time>.<host>.<pid>.0 in it; the first record says
  // which event format the file holds ("brain.Event:2"). wall_time < 0: the clock now.
  explicit TensorBoardWriter(const std::string& dir, double wall_time = -1);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void scalar(const std::string& tag, int64_t step, double value, double wall_time = -1);
  // Every finite number of a metrics.jsonl record except "step", under Hugging Face's tags:
  // eval_loss -> eval/loss, learning_rate -> train/learning_rate, loss -> train/loss, ...
  void record(const nlohmann::json& metrics_record, double wall_time = -1);
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& bytes);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// The scalars of an event file, in file order. Format error naming the file and byte offset when a
// record's length or data fails its CRC, or does not parse.
struct TensorBoardScalar {
  std::string tag;
  int64_t step = 0;
  double wall_time = 0;
  float value = 0;
};
std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path);

// TFRecord framing of one record: length (u64 LE), its masked CRC-32C, the data, the data's masked
// CRC-32C (TensorFlow's record_writer).
std::string tfrecord_frame(const std::string& data);
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace qlora
