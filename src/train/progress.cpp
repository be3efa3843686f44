// Progress reporter and human-readable formatting of durations and sizes.
#include "train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace qlora {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = int64_t(std::llround(seconds));
  char buf[48];
  if (s < 60) std::snprintf(buf, sizeof buf, "%llds", (long long)s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else if (s < 86400)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  else std::snprintf(buf, sizeof buf, "%lldd%02lldh", (long long)(s / 86400), (long long)(s % 86400 / 3600));
  return buf;
}

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (!std::isfinite(bytes)) return "?";
  const char* sign = bytes < 0 ? "-" : "";
  double b = std::fabs(bytes);
  char buf[48];
  if (b < 1024) {
    std::snprintf(buf, sizeof buf, "%s%.0f B", sign, b);
    return buf;
  }
  int u = 0;
  while (b >= 1024 && u < 5) b /= 1024, ++u;
  std::snprintf(buf, sizeof buf, "%s%.2f %s", sign, b, units[u]);
  return buf;
}

ProgressReporter::ProgressReporter(int64_t total_steps, int64_t logging_steps, std::FILE* out, int tty,
                                   int eta_window)
    : total_(total_steps),
      logging_steps_(logging_steps < 1 ? 1 : logging_steps),
      out_(out),
      tty_(tty < 0 ? isatty(fileno(out)) != 0 : tty != 0),
      window_(eta_window < 1 ? 1 : size_t(eta_window)) {}

ProgressReporter::~ProgressReporter() { finish(); }

double ProgressReporter::eta_seconds() const {
  if (recent_.empty()) return std::numeric_limits<double>::quiet_NaN();
  double mean = recent_sum_ / double(recent_.size());
  return mean * double(std::max<int64_t>(total_ - last_step_, 0));
}

std::string ProgressReporter::status_line(const StepReport& r) const {
  char buf[256];
  const std::string ranks = ranks_ > 1 ? " | " + std::to_string(ranks_) + " ranks" : std::string();
  std::string extra;
  for (const auto& [name, v] : r.extra) {
    char e[64];
    std::snprintf(e, sizeof e, " | %s %.4g", name.c_str(), v);
    extra += e;
  }
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f%s | lr %.1e | %.0f tok/s%s | ETA %s", (long long)r.step,
                (long long)total_, r.loss, extra.c_str(), r.lr, r.tokens_per_s, ranks.c_str(),
                format_duration(eta_seconds()).c_str());
  return buf;
}

void ProgressReporter::record(int64_t done, double seconds) {
  // a moving window, not the whole-run mean, so the slow first step (allocation, warm-up) fades out
  recent_.push_back(seconds);
  recent_sum_ += seconds;
  if (recent_.size() > window_) {
    recent_sum_ -= recent_.front();
    recent_.pop_front();
  }
  last_step_ = done;
}

void ProgressReporter::show(int64_t done, const std::string& line) {
  if (tty_) {
    std::fprintf(out_, "\r%s\x1b[K", line.c_str());
    line_open_ = true;
  } else if (done % logging_steps_ == 0 || done == total_) {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressReporter::update(const StepReport& r) {
  record(r.step, r.step_seconds);
  show(r.step, status_line(r));
}

void ProgressReporter::update_text(int64_t done, double seconds, const std::string& text) {
  record(done, seconds);
  show(done, text + " | ETA " + format_duration(eta_seconds()));
}

void ProgressReporter::message(const std::string& line) {
  if (line_open_) std::fprintf(out_, "\r\x1b[K");
  line_open_ = false;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void ProgressReporter::finish() {
  if (!line_open_) return;
  std::fprintf(out_, "\r\x1b[K");
  std::fflush(out_);
  line_open_ = false;
}

}  // namespace qlora
