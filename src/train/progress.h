// Console progress: one updating status line on a terminal, plain log lines otherwise; format helpers.
#pragma once
#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace qlora {

// "45s", "1m23s", "2h05m", "3d04h"; "?" for negative, NaN or infinite input.
std::string format_duration(double seconds);
// Binary units: "512 B", "1.50 KiB", "1.23 GiB".
std::string format_bytes(double bytes);

struct StepReport {
  int64_t step = 0;           // optimizer steps done (1-based)
  double loss = 0;
  double lr = 0;              // LR used by this step
  double tokens_per_s = 0;
  double step_seconds = 0;    // wall time of this step, feeds the ETA
  // Objective-specific values shown after the loss ("acc 0.75 | margin 0.12" for preference runs).
  std::vector<std::pair<std::string, double>> extra;
};

class ProgressReporter {
 public:
  // tty: 1 or 0 forces the mode; -1 asks isatty(fileno(out)). eta_window: steps in the moving average.
  ProgressReporter(int64_t total_steps, int64_t logging_steps, std::FILE* out = stderr, int tty = -1,
                   int eta_window = 20);
  ~ProgressReporter();

  // Terminal: redraws the status line every step. Otherwise: one line every logging_steps and at the end.
  void update(const StepReport& r);
  // The same for any kind of work ("eval batch 3/40 | loss 2.1"): `done` of total_steps units,
  // `seconds` for the last one; " | ETA ..." is appended to `text`.
  void update_text(int64_t done, double seconds, const std::string& text);
  // A whole line (eval result, warning) printed without garbling the status line.
  void message(const std::string& line);
  // Clears the status line; later updates start a new one.
  void finish();

  // Seconds left: mean of the last eta_window step times x steps remaining; NaN before the first step.
  double eta_seconds() const;
  std::string status_line(const StepReport& r) const;
  // Data-parallel ranks of the run; more than one adds " | N ranks" to the status line.
  void set_ranks(int n) { ranks_ = n; }
  bool is_tty() const { return tty_; }

 private:
  int64_t total_, logging_steps_;
  std::FILE* out_;
  bool tty_;
  size_t window_;
  std::deque<double> recent_;  // last step times, seconds
  double recent_sum_ = 0;
  int64_t last_step_ = 0;
  bool line_open_ = false;  // a status line is on screen
  int ranks_ = 1;
  void record(int64_t done, double seconds);
  void show(int64_t done, const std::string& line);
};

}  // namespace qlora
