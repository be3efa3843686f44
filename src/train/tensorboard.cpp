// TensorBoard event files written with protobuf's generated code and Boost.CRC's CRC-32C.
#include "train/tensorboard.h"

#include <unistd.h>

#include <boost/crc.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "tensorboard_event.pb.h"

namespace qlora {
namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) s.push_back(char((v >> (8 * i)) & 0xff));
}

// metrics.jsonl key -> TensorBoard tag, as transformers' TensorBoardCallback names them
// (eval_* under eval/, everything else under train/).
std::string tag_of(const std::string& key) {
  if (key.rfind("eval_", 0) == 0) return "eval/" + key.substr(5);
  return "train/" + key;
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t n) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;  // CRC-32C (Castagnoli)
  crc.process_bytes(data, n);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(const std::string& data) {
  std::string out, len;
  put_le(len, data.size(), 8);
  out += len;
  put_le(out, masked_crc32c(len.data(), len.size()), 4);
  out += data;
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, double wall_time) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(ErrorKind::Io, dir, "cannot create the TensorBoard log directory: " + ec.message(), "check logging_dir");
  if (wall_time < 0) wall_time = now_seconds();
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = (fs::path(dir) / ("events.out.tfevents." + std::to_string(int64_t(wall_time)) + "." + host + "." +
                            std::to_string(getpid()) + ".0"))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) fail(ErrorKind::Io, path_, "cannot create the TensorBoard event file", "check permissions of logging_dir");
  tensorboard::Event e;
  e.set_wall_time(wall_time);
  e.set_file_version("brain.Event:2");
  write_event(e.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write_event(const std::string& bytes) {
  const std::string rec = tfrecord_frame(bytes);
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size() || std::fflush(file_) != 0)
    fail(ErrorKind::Io, path_, "cannot write TensorBoard event", "check free disk space");
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value, double wall_time) {
  tensorboard::Event e;
  e.set_wall_time(wall_time < 0 ? now_seconds() : wall_time);
  e.set_step(step);
  tensorboard::SummaryValue* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(float(value));
  write_event(e.SerializeAsString());
}

void TensorBoardWriter::record(const nlohmann::json& rec, double wall_time) {
  const auto step = rec.find("step");
  if (step == rec.end() || !step->is_number_integer()) return;
  for (auto it = rec.begin(); it != rec.end(); ++it) {
    if (it.key() == "step" || !it->is_number() || it->is_boolean()) continue;
    const double v = it->get<double>();
    if (std::isfinite(v)) scalar(tag_of(it.key()), step->get<int64_t>(), v, wall_time);
  }
}

std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::Io, path, "cannot open TensorBoard event file");
  const std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto le = [&](size_t p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | uint8_t(b[p + size_t(i)]);
    return v;
  };
  std::vector<TensorBoardScalar> out;
  for (size_t at = 0; at < b.size();) {
    const std::string where = path + ": record at byte " + std::to_string(at);
    if (b.size() - at < 12) fail(ErrorKind::Format, where, "truncated record header");
    const uint64_t n = le(at, 8);
    if (uint32_t(le(at + 8, 4)) != masked_crc32c(b.data() + at, 8)) fail(ErrorKind::Format, where, "length CRC mismatch");
    if (n > b.size() - at - 16) fail(ErrorKind::Format, where, "record runs past the end of the file");
    if (uint32_t(le(at + 12 + size_t(n), 4)) != masked_crc32c(b.data() + at + 12, size_t(n)))
      fail(ErrorKind::Format, where, "data CRC mismatch");
    tensorboard::Event e;
    if (!e.ParseFromArray(b.data() + at + 12, int(n))) fail(ErrorKind::Format, where, "not an Event protobuf");
    if (e.has_summary())
      for (const auto& v : e.summary().value())
        if (v.has_simple_value()) out.push_back({v.tag(), e.step(), e.wall_time(), v.simple_value()});
    at += 12 + size_t(n) + 4;
  }
  return out;
}

}  // namespace qlora
