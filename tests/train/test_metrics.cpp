// MetricsWriter JSONL output, progress reporter modes and the human-readable format helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "train/metrics.h"
#include "train/progress.h"

using namespace qlora;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "qlora_metrics_" + name;
  fs::remove_all(d);
  return d;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Captures what a reporter writes.
struct Capture {
  std::FILE* f = std::tmpfile();
  ~Capture() { std::fclose(f); }
  std::string text() {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    for (int ch; (ch = std::fgetc(f)) != EOF;) s += char(ch);
    return s;
  }
};

}  // namespace

TEST(Format, Durations) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(83), "1m23s");
  EXPECT_EQ(format_duration(3600 + 5 * 60 + 7), "1h05m");
  EXPECT_EQ(format_duration(3 * 86400 + 4 * 3600 + 59), "3d04h");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(NAN), "?");
  EXPECT_EQ(format_duration(INFINITY), "?");
}

TEST(Format, Bytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(1.23 * 1024 * 1024 * 1024), "1.23 GiB");
  EXPECT_EQ(format_bytes(80.0 * (1ull << 30)), "80.00 GiB");
  EXPECT_EQ(format_bytes(3.5 * (1ull << 40)), "3.50 TiB");
  EXPECT_EQ(format_bytes(1023.0 * 1024 * 1024), "1023.00 MiB");
}

TEST(Metrics, OneFlushedObjectPerLine) {
  std::string dir = fresh_dir("write");
  MetricsWriter w(dir + "/nested");  // output_dir is created
  w.write({{"step", 1}, {"loss", 2.5}, {"lr", 1e-4}});
  // readable before the writer is closed: each line is flushed
  auto lines = lines_of(w.path());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["loss"], 2.5);
  w.write({{"step", 2}, {"loss", NAN}, {"note", "caf\xc3\xa9"}});
  lines = lines_of(w.path());
  ASSERT_EQ(lines.size(), 2u);
  auto j = nlohmann::json::parse(lines[1]);
  EXPECT_TRUE(j["loss"].is_null());  // NaN is not JSON
  EXPECT_EQ(j["note"], "caf\xc3\xa9");
}

TEST(Metrics, ResumeDropsRecordsAfterTheCheckpoint) {
  std::string dir = fresh_dir("resume");
  {
    MetricsWriter w(dir);
    for (int s = 1; s <= 5; ++s) w.write({{"step", s}, {"loss", 3.0 - 0.1 * s}});
    w.write({{"event", "start"}});
  }
  std::ofstream(dir + "/metrics.jsonl", std::ios::app) << "{\"step\": 6, \"lo";  // torn line
  MetricsWriter w(dir, 3);
  w.write({{"step", 4}, {"loss", 1.0}});
  auto lines = lines_of(w.path());
  ASSERT_EQ(lines.size(), 5u);  // steps 1..3, the event, the new step 4
  EXPECT_EQ(nlohmann::json::parse(lines[2])["step"], 3);
  EXPECT_EQ(nlohmann::json::parse(lines[3])["event"], "start");
  EXPECT_EQ(nlohmann::json::parse(lines[4])["loss"], 1.0);
}

TEST(Progress, TerminalRedrawsOneLine) {
  Capture cap;
  {
    ProgressReporter p(100, 10, cap.f, /*tty=*/1);
    p.update({.step = 12, .loss = 2.34123, .lr = 1.9e-4, .tokens_per_s = 1234.4, .step_seconds = 1.0, .extra = {}});
    EXPECT_EQ(p.eta_seconds(), 88.0);
    p.message("eval loss 2.1");
    p.update({.step = 13, .loss = 2.3, .lr = 1.8e-4, .tokens_per_s = 1000, .step_seconds = 1.0, .extra = {}});
  }  // destructor clears the line
  std::string t = cap.text();
  EXPECT_EQ(t.rfind("\rstep 12/100 | loss 2.3412 | lr 1.9e-04 | 1234 tok/s | ETA 1m28s\x1b[K", 0), 0u) << t;
  EXPECT_NE(t.find("\r\x1b[Keval loss 2.1\n"), std::string::npos);
  EXPECT_NE(t.find("\rstep 13/100"), std::string::npos);
  EXPECT_EQ(t.substr(t.size() - 4), "\r\x1b[K");
}

TEST(Progress, PlainLogEveryLoggingStepsAndAtTheEnd) {
  Capture cap;
  ProgressReporter p(7, 3, cap.f, /*tty=*/0);
  for (int s = 1; s <= 7; ++s) p.update({.step = s, .loss = 1.0, .lr = 1e-4, .tokens_per_s = 10, .step_seconds = 2, .extra = {}});
  p.finish();
  std::string t = cap.text();
  EXPECT_EQ(t.find('\r'), std::string::npos);
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 3);  // steps 3, 6 and the last
  EXPECT_NE(t.find("step 3/7 "), std::string::npos);
  EXPECT_NE(t.find("step 6/7 "), std::string::npos);
  EXPECT_NE(t.find("step 7/7 | loss 1.0000 | lr 1.0e-04 | 10 tok/s | ETA 0s\n"), std::string::npos);
}

TEST(Progress, EtaIsAMovingAverage) {
  Capture cap;
  ProgressReporter p(100, 1, cap.f, 0, /*eta_window=*/4);
  EXPECT_TRUE(std::isnan(p.eta_seconds()));
  p.update({.step = 1, .step_seconds = 50.0, .extra = {}});  // slow first step (allocation, warm-up)
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 99 * 50.0);
  for (int s = 2; s <= 5; ++s) p.update({.step = s, .step_seconds = 1.0 + s, .extra = {}});  // 3,4,5,6
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 95 * 4.5);  // the first step left the window
}

TEST(Progress, StatusLineShowsTheRanksOfAMultiRankRun) {
  ProgressReporter one(10, 1, stderr, 0);
  const StepReport r{3, 2.5, 1e-3, 1000, 0.1, {}};
  EXPECT_EQ(one.status_line(r).find("ranks"), std::string::npos);  // one process: unchanged
  ProgressReporter four(10, 1, stderr, 0);
  four.set_ranks(4);
  EXPECT_NE(four.status_line(r).find("| 1000 tok/s | 4 ranks | ETA"), std::string::npos) << four.status_line(r);
}
