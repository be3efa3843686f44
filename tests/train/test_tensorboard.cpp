// TensorBoard event files: the bytes TensorBoard's own reader was run on
// (tools/make_tensorboard_fixtures.py, tests/fixtures/tensorboard/), the CRC-32C and its mask, and
// damaged files named by the reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/json_util.h"
#include "train/tensorboard.h"

namespace qlora {
namespace {
namespace fs = std::filesystem;

const std::string kFix = std::string(QLORA_FIXTURES) + "/tensorboard";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string only_event_file(const std::string& dir) {
  std::string found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      EXPECT_TRUE(found.empty()) << "two event files in " << dir;
      found = e.path().string();
    }
  return found;
}

// The fixture's events: an eval at step 0, two steps of train scalars (a null grad_norm and a
// boolean are not scalars), an eval at step 2.
void write_fixture_events(const std::string& dir) {
  TensorBoardWriter w(dir, 1764300000.0);
  w.record({{"step", 0}, {"eval_loss", 3.964115}}, 1764300001.0);
  w.record({{"step", 1}, {"loss", 3.0348}, {"learning_rate", 1e-3}, {"grad_norm", 1.25}, {"skipped", false}}, 1764300002.5);
  w.record({{"step", 2}, {"loss", 2.5}, {"learning_rate", 5e-4}, {"grad_norm", nullptr}}, 1764300004.0);
  w.record({{"step", 2}, {"eval_loss", 2.032889}}, 1764300005.0);
}

// CRC-32C known answer (RFC 3720 B.4: 32 bytes of zeros -> 0x8A9136AA), then TensorFlow's mask.
TEST(TensorBoard, Crc32cAndItsMask) {
  const std::string zeros(32, '\0');
  const uint32_t c = 0x8A9136AAu;
  EXPECT_EQ(masked_crc32c(zeros.data(), zeros.size()), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

// tools/make_tensorboard_fixtures.py runs this with QLORA_TB_FIXTURE_OUT set, to write the file
// TensorBoard then reads; otherwise the test writes the same events and compares.
TEST(TensorBoard, WritesTheBytesTensorBoardRead) {
  if (const char* out = std::getenv("QLORA_TB_FIXTURE_OUT")) {
    write_fixture_events(out);
    return;
  }
  const nlohmann::json fx = read_json_file(kFix + "/tensorboard_read.json");
  const fs::path dir = fs::temp_directory_path() / ("qlora_tb_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  write_fixture_events(dir.string());
  const std::string ours = only_event_file(dir.string());
  ASSERT_FALSE(ours.empty());
  EXPECT_EQ(read_bytes(ours), read_bytes(kFix + "/" + fx["file"].get<std::string>()))
      << "the writer no longer writes the bytes TensorBoard read: re-run tools/make_tensorboard_fixtures.py";
  // Our reader sees what TensorBoard's EventAccumulator reported for that file.
  std::map<std::string, std::vector<TensorBoardScalar>> seen;
  for (const auto& s : read_tensorboard_scalars(ours)) seen[s.tag].push_back(s);
  ASSERT_EQ(fx["scalars"].size(), seen.size());
  for (const auto& [tag, points] : fx["scalars"].items()) {
    SCOPED_TRACE(tag);
    ASSERT_EQ(points.size(), seen[tag].size());
    for (size_t i = 0; i < points.size(); i++) {
      EXPECT_EQ(points[i]["step"].get<int64_t>(), seen[tag][i].step);
      EXPECT_EQ(float(points[i]["value"].get<double>()), seen[tag][i].value);
      EXPECT_DOUBLE_EQ(points[i]["wall_time"].get<double>(), seen[tag][i].wall_time);
    }
  }
  // A damaged byte is named, never read as a value.
  std::string bytes = read_bytes(ours);
  bytes[bytes.size() - 6] ^= 0x40;
  std::ofstream(ours, std::ios::binary | std::ios::trunc) << bytes;
  try {
    read_tensorboard_scalars(ours);
    ADD_FAILURE() << "a damaged record was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Format);
    EXPECT_NE(std::string(e.what()).find("CRC mismatch"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qlora
