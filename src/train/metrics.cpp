// MetricsWriter: JSONL records flushed line by line, so a crash loses at most the line in flight.
#include "train/metrics.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace qlora {
namespace fs = std::filesystem;

namespace {

// Keeps the records up to `step` (and those without a step); rewritten through a temp file.
void truncate_after_step(const std::string& path, int64_t step) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;  // torn last line of a killed run
    auto it = j.find("step");
    if (it != j.end() && it->is_number() && it->get<double>() > double(step)) continue;
    kept += line + "\n";
  }
  in.close();
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    if (!out.flush()) fail(ErrorKind::Io, tmp, "cannot write metrics file", "check disk space and permissions");
  }
  fs::rename(tmp, path, ec);
  if (ec) fail(ErrorKind::Io, path, "cannot replace metrics file: " + ec.message());
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& output_dir, int64_t keep_through_step)
    : path_((fs::path(output_dir) / "metrics.jsonl").string()) {
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  if (ec) fail(ErrorKind::Io, output_dir, "cannot create output_dir: " + ec.message(), "check output_dir");
  if (keep_through_step >= 0) truncate_after_step(path_, keep_through_step);
  file_ = std::fopen(path_.c_str(), "a");
  if (!file_) fail(ErrorKind::Io, path_, "cannot open metrics file for appending", "check permissions of output_dir");
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  QLORA_ASSERT(record.is_object());
  // replace: a stray invalid UTF-8 byte in a sample must not abort training
  std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    fail(ErrorKind::Io, path_, "cannot write metrics record", "check free disk space");
}

}  // namespace qlora
