// loss.svg: train loss, eval loss and learning rate against step, drawn from a run's metrics.jsonl
// as a self-contained SVG (no scripts, no fonts, no dependencies), readable in any browser.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace qlora {

// The series of a metrics.jsonl, sorted by step; a step logged twice keeps its last record.
struct LossSeries {
  std::vector<std::pair<int64_t, double>> train, eval, lr;  // (step, loss / eval_loss / learning_rate)
  // Preference runs: rewards/accuracies and eval_rewards/accuracies, drawn on the loss axis.
  std::vector<std::pair<int64_t, double>> accuracy, eval_accuracy;
  std::vector<int64_t> skipped;                              // steps without a finite loss (nan_policy: skip)
};

// Reads <path>; a torn last line (a killed run) is ignored. Errors: missing file -> Io; a
// malformed line before the last -> Format naming path:line.
LossSeries read_loss_series(const std::string& metrics_path);

// The SVG text. Linear axes with 1-2-2.5-5 tick steps: step (x), loss (left), learning rate
// (right, dashed line); preference runs' reward accuracy on the loss axis (dotted lines). Train-loss lines break at skipped steps (red marks on the x axis). The
// <rect id="plot-area"> carries the axis ranges as data-* attributes (data-step-min/max,
// data-loss-min/max, data-lr-min/max) so that a reader can map coordinates back to values.
std::string loss_plot_svg(const LossSeries& s, const std::string& title, const std::string& subtitle = "");

// "<run name> | <model>": the output directory's name and model_name_or_path from its
// train_config.yaml (left out when that file is missing or unreadable).
std::string loss_plot_title(const std::string& output_dir);

// Reads <output_dir>/metrics.jsonl and writes the plot to out_path (default
// <output_dir>/loss.svg) atomically. Io error when there is no metrics.jsonl; Data error when it
// holds no loss or eval_loss to plot. Returns the series it drew.
LossSeries write_loss_plot(const std::string& output_dir, const std::string& out_path = "");

}  // namespace qlora
