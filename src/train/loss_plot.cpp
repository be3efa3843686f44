// loss.svg from metrics.jsonl: a small hand-written SVG writer (linear scales, nice ticks, legend).
#include "train/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "core/error.h"
#include "io/atomic_file.h"

namespace fs = std::filesystem;

namespace qlora {

namespace {

std::vector<std::pair<int64_t, double>> sorted(const std::map<int64_t, double>& m) { return {m.begin(), m.end()}; }

// A finite number at key, or nothing (absent, null for NaN/inf, or not a number).
bool number_at(const nlohmann::json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return false;
  *out = it->get<double>();
  return std::isfinite(*out);
}

}  // namespace

LossSeries read_loss_series(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(ErrorKind::Io, path, "file does not exist");
  std::ifstream in(path);
  if (!in) fail(ErrorKind::Io, path, "cannot read file");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::map<int64_t, double> train, eval, lr, acc, eval_acc;
  std::map<int64_t, bool> skipped;
  for (size_t i = 0; i < lines.size(); i++) {
    if (lines[i].find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    double step_d = 0;
    if (!j.is_object() || !number_at(j, "step", &step_d)) {
      if (i + 1 == lines.size()) break;  // torn last line of a killed run
      fail(ErrorKind::Format, path + ":" + std::to_string(i + 1), "not a metrics record (a JSON object with a step)",
           "metrics.jsonl is written by qlora train; was it edited?");
    }
    const int64_t step = int64_t(std::llround(step_d));
    double v = 0;
    const bool has_loss_key = j.contains("loss");
    if (number_at(j, "loss", &v)) {
      train[step] = v;
      skipped.erase(step);
    } else if (has_loss_key || j.value("skipped", false)) {
      skipped[step] = true;  // a step without a finite loss
      train.erase(step);
    }
    if (number_at(j, "eval_loss", &v)) eval[step] = v;
    if (number_at(j, "learning_rate", &v)) lr[step] = v;
    if (number_at(j, "rewards/accuracies", &v)) acc[step] = v;
    if (number_at(j, "eval_rewards/accuracies", &v)) eval_acc[step] = v;
  }
  LossSeries s;
  s.train = sorted(train);
  s.eval = sorted(eval);
  s.lr = sorted(lr);
  s.accuracy = sorted(acc);
  s.eval_accuracy = sorted(eval_acc);
  for (const auto& [step, _] : skipped) s.skipped.push_back(step);
  return s;
}

namespace {

struct Axis {
  double lo = 0, hi = 1, tick = 0.2;
  std::vector<double> ticks;
};

// Linear axis over [lo, hi] with about `target` ticks at multiples of 1, 2, 2.5 or 5 x 10^k.
Axis nice_axis(double lo, double hi, int target, bool integer) {
  if (!(hi > lo)) {  // one value (or none): a band around it
    const double pad = lo != 0 ? std::fabs(lo) * 0.1 : 1.0;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double tick = mag * 10;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      tick = m * mag;
      break;
    }
  if (integer) tick = std::max(1.0, std::round(tick));
  Axis a;
  a.tick = tick;
  a.lo = std::floor(lo / tick + 1e-9) * tick;
  a.hi = std::ceil(hi / tick - 1e-9) * tick;
  if (!(a.hi > a.lo)) a.hi = a.lo + tick;
  for (int64_t k = 0;; k++) {
    double v = a.lo + double(k) * tick;
    if (v > a.hi + tick * 1e-6) break;
    v = std::round(v / tick) * tick;
    if (std::fabs(v) < tick * 1e-9) v = 0;
    a.ticks.push_back(v);
  }
  return a;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Tick labels: plain decimals ("2.5", "0.001"), or "2.5e-4" for small learning rates.
std::string tick_label(double v, double tick) {
  if (v == 0) return "0";
  if (tick < 1e-3 || std::fabs(v) >= 1e6) {
    const int e = int(std::floor(std::log10(std::fabs(v)) + 1e-9));
    std::string m = fmt("%.3g", v / std::pow(10.0, e));
    return m + "e" + std::to_string(e);
  }
  return fmt("%.6g", v);
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v) { return fmt("%.2f", v); }
// Axis range attributes: full precision, so that coordinates map back exactly.
std::string exact(double v) { return fmt("%.17g", v); }

constexpr double kWidth = 860, kHeight = 500;
constexpr double kLeft = 80, kRight = kWidth - 90, kTop = 78, kBottom = kHeight - 62;
const char* const kTrainColor = "#1f77b4";
const char* const kEvalColor = "#ff7f0e";
const char* const kLrColor = "#2ca02c";
const char* const kSkipColor = "#d62728";
const char* const kAccColor = "#9467bd";

using Series = std::vector<std::pair<int64_t, double>>;

// One loss.svg being written: the series, its three axes (step, loss, learning rate) and the
// text so far; each member function writes one part of the picture, in document order.
struct LossPlot {
  const LossSeries& s;
  Axis ax, ay, ar;
  bool has_acc = false, has_lr = false;
  static constexpr double pw = kRight - kLeft, ph = kBottom - kTop;
  std::ostringstream o;

  explicit LossPlot(const LossSeries& series);

  double x_of(double step) const { return kLeft + (step - ax.lo) / (ax.hi - ax.lo) * pw; }
  double y_of(double loss) const { return kBottom - (loss - ay.lo) / (ay.hi - ay.lo) * ph; }
  double y_lr_of(double lr) const { return kBottom - (lr - ar.lo) / (ar.hi - ar.lo) * ph; }

  // "x,y x,y ..." of v[begin, end), against the loss axis or the learning-rate axis.
  void points(const Series& v, size_t begin, size_t end, bool lr_axis);

  void header(const std::string& title, const std::string& subtitle);
  void grid_and_frame();
  void x_axis();
  void loss_axis();
  void lr_axis_and_line();
  void train_loss();
  void eval_loss();
  void accuracy_lines();
  void skipped_steps();
  void legend();
};

// The axes: steps from 0, loss (and reward accuracy) over every value drawn, learning rate from 0.
LossPlot::LossPlot(const LossSeries& series) : s(series) {
  int64_t max_step = 1;
  double lmin = INFINITY, lmax = -INFINITY, lr_max = 0;
  for (const auto& [st, v] : s.train) max_step = std::max(max_step, st), lmin = std::min(lmin, v), lmax = std::max(lmax, v);
  for (const auto& [st, v] : s.eval) max_step = std::max(max_step, st), lmin = std::min(lmin, v), lmax = std::max(lmax, v);
  for (const auto& [st, v] : s.lr) max_step = std::max(max_step, st), lr_max = std::max(lr_max, v);
  for (int64_t st : s.skipped) max_step = std::max(max_step, st);
  for (const auto* acc : {&s.accuracy, &s.eval_accuracy})
    for (const auto& [st, v] : *acc) max_step = std::max(max_step, st), lmin = std::min(lmin, v), lmax = std::max(lmax, v);
  has_acc = !s.accuracy.empty() || !s.eval_accuracy.empty();
  if (!std::isfinite(lmin)) lmin = 0, lmax = 1;
  ax = nice_axis(0, double(max_step), 8, true);
  ay = nice_axis(lmin, lmax, 6, false);
  has_lr = !s.lr.empty();
  ar = nice_axis(0, lr_max > 0 ? lr_max : 1.0, 6, false);
}

void LossPlot::points(const Series& v, size_t begin, size_t end, bool lr_axis) {
  for (size_t i = begin; i < end; i++)
    o << (i > begin ? " " : "") << num(x_of(double(v[i].first))) << ","
      << num(lr_axis ? y_lr_of(v[i].second) : y_of(v[i].second));
}

void LossPlot::header(const std::string& title, const std::string& subtitle) {
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight << "\" viewBox=\"0 0 "
    << kWidth << " " << kHeight << "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
    << "<title>" << xml_escape(title) << "</title>\n"
    << "<rect width=\"" << kWidth << "\" height=\"" << kHeight << "\" fill=\"white\"/>\n"
    << "<text x=\"" << num(kWidth / 2) << "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">"
    << xml_escape(title) << "</text>\n";
  if (!subtitle.empty())
    o << "<text x=\"" << num(kWidth / 2) << "\" y=\"42\" text-anchor=\"middle\" fill=\"#555\">" << xml_escape(subtitle)
      << "</text>\n";
}

// grid and axes
void LossPlot::grid_and_frame() {
  o << "<g id=\"grid\" stroke=\"#e6e6e6\" stroke-width=\"1\">\n";
  for (double t : ax.ticks)
    o << "<line x1=\"" << num(x_of(t)) << "\" y1=\"" << num(kTop) << "\" x2=\"" << num(x_of(t)) << "\" y2=\""
      << num(kBottom) << "\"/>\n";
  for (double t : ay.ticks)
    o << "<line x1=\"" << num(kLeft) << "\" y1=\"" << num(y_of(t)) << "\" x2=\"" << num(kRight) << "\" y2=\""
      << num(y_of(t)) << "\"/>\n";
  o << "</g>\n";
  o << "<rect id=\"plot-area\" x=\"" << num(kLeft) << "\" y=\"" << num(kTop) << "\" width=\"" << num(pw) << "\" height=\""
    << num(ph) << "\" fill=\"none\" stroke=\"#444\" data-step-min=\"" << exact(ax.lo) << "\" data-step-max=\""
    << exact(ax.hi) << "\" data-loss-min=\"" << exact(ay.lo) << "\" data-loss-max=\"" << exact(ay.hi) << "\"";
  if (has_lr) o << " data-lr-min=\"" << exact(ar.lo) << "\" data-lr-max=\"" << exact(ar.hi) << "\"";
  o << "/>\n";
}

void LossPlot::x_axis() {
  o << "<g id=\"x-axis\" text-anchor=\"middle\">\n";
  for (double t : ax.ticks)
    o << "<line x1=\"" << num(x_of(t)) << "\" y1=\"" << num(kBottom) << "\" x2=\"" << num(x_of(t)) << "\" y2=\""
      << num(kBottom + 5) << "\" stroke=\"#444\"/><text x=\"" << num(x_of(t)) << "\" y=\"" << num(kBottom + 19) << "\">"
      << tick_label(t, ax.tick) << "</text>\n";
  o << "<text x=\"" << num(kLeft + pw / 2) << "\" y=\"" << num(kBottom + 42) << "\" font-size=\"13\">step</text>\n</g>\n";
}

void LossPlot::loss_axis() {
  o << "<g id=\"loss-axis\" text-anchor=\"end\">\n";
  for (double t : ay.ticks)
    o << "<line x1=\"" << num(kLeft - 5) << "\" y1=\"" << num(y_of(t)) << "\" x2=\"" << num(kLeft) << "\" y2=\""
      << num(y_of(t)) << "\" stroke=\"#444\"/><text x=\"" << num(kLeft - 8) << "\" y=\"" << num(y_of(t) + 4) << "\">"
      << tick_label(t, ay.tick) << "</text>\n";
  o << "<text transform=\"translate(" << num(kLeft - 58) << " " << num(kTop + ph / 2)
    << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">"
    << (has_acc ? "loss; reward accuracy" : "loss (per trained token)") << "</text>\n</g>\n";
}

// The right-hand learning-rate axis and the dashed learning-rate line (only when one was logged).
void LossPlot::lr_axis_and_line() {
  if (!has_lr) return;
  o << "<g id=\"lr-axis\" text-anchor=\"start\" fill=\"" << kLrColor << "\">\n";
  o << "<line x1=\"" << num(kRight) << "\" y1=\"" << num(kTop) << "\" x2=\"" << num(kRight) << "\" y2=\""
    << num(kBottom) << "\" stroke=\"" << kLrColor << "\"/>\n";
  for (double t : ar.ticks)
    o << "<line x1=\"" << num(kRight) << "\" y1=\"" << num(y_lr_of(t)) << "\" x2=\"" << num(kRight + 5) << "\" y2=\""
      << num(y_lr_of(t)) << "\" stroke=\"" << kLrColor << "\"/><text x=\"" << num(kRight + 8) << "\" y=\""
      << num(y_lr_of(t) + 4) << "\">" << tick_label(t, ar.tick) << "</text>\n";
  o << "<text transform=\"translate(" << num(kRight + 72) << " " << num(kTop + ph / 2)
    << ") rotate(90)\" text-anchor=\"middle\" font-size=\"13\">learning rate</text>\n</g>\n";
  o << "<polyline id=\"lr\" fill=\"none\" stroke=\"" << kLrColor
    << "\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\" points=\"";
  points(s.lr, 0, s.lr.size(), true);
  o << "\"/>\n";
}

// train loss: one polyline per run of consecutive logged steps without a skipped step between
void LossPlot::train_loss() {
  o << "<g id=\"train-loss\" fill=\"none\" stroke=\"" << kTrainColor << "\" stroke-width=\"1.8\">\n";
  size_t k = 0;
  while (k < s.train.size()) {
    size_t e = k + 1;
    while (e < s.train.size() && std::none_of(s.skipped.begin(), s.skipped.end(), [&](int64_t st) {
             return st > s.train[e - 1].first && st < s.train[e].first;
           }))
      e++;
    o << "<polyline class=\"train-loss\" points=\"";
    points(s.train, k, e, false);
    o << "\"/>\n";
    if (e == k + 1)  // a lone point draws no line: mark it
      o << "<circle class=\"train-loss-dot\" cx=\"" << num(x_of(double(s.train[k].first))) << "\" cy=\""
        << num(y_of(s.train[k].second)) << "\" r=\"2.5\" fill=\"" << kTrainColor << "\" stroke=\"none\"/>\n";
    k = e;
  }
  o << "</g>\n";
}

void LossPlot::eval_loss() {
  if (s.eval.empty()) return;
  o << "<polyline id=\"eval-loss-line\" fill=\"none\" stroke=\"" << kEvalColor << "\" stroke-width=\"1.8\" points=\"";
  points(s.eval, 0, s.eval.size(), false);
  o << "\"/>\n<g id=\"eval-loss\" fill=\"" << kEvalColor << "\" stroke=\"white\" stroke-width=\"1\">\n";
  for (const auto& [st, v] : s.eval)
    o << "<circle cx=\"" << num(x_of(double(st))) << "\" cy=\"" << num(y_of(v)) << "\" r=\"4\"><title>step " << st
      << ": eval_loss " << fmt("%.6f", v) << "</title></circle>\n";
  o << "</g>\n";
}

// Preference runs: the fraction of pairs whose chosen reward beats the rejected one.
void LossPlot::accuracy_lines() {
  const std::pair<const Series*, const char*> accs[] = {{&s.accuracy, "reward-accuracy"},
                                                        {&s.eval_accuracy, "eval-reward-accuracy"}};
  for (const auto& [acc, id] : accs) {
    if (acc->empty()) continue;
    o << "<polyline id=\"" << id << "\" fill=\"none\" stroke=\"" << kAccColor << "\" stroke-width=\"1.6\" stroke-dasharray=\""
      << (acc == &s.accuracy ? "2 3" : "8 3 2 3") << "\" points=\"";
    points(*acc, 0, acc->size(), false);
    o << "\"/>\n";
  }
}

void LossPlot::skipped_steps() {
  if (s.skipped.empty()) return;
  o << "<g id=\"skipped-steps\" stroke=\"" << kSkipColor << "\" stroke-width=\"2\">\n";
  for (int64_t st : s.skipped)
    o << "<line x1=\"" << num(x_of(double(st))) << "\" y1=\"" << num(kBottom - 8) << "\" x2=\"" << num(x_of(double(st)))
      << "\" y2=\"" << num(kBottom) << "\"><title>step " << st << " skipped: loss not finite</title></line>\n";
  o << "</g>\n";
}

// legend, above the plot area
void LossPlot::legend() {
  o << "<g id=\"legend\" font-size=\"12\">\n";
  double lx = kLeft;
  const double ly = kTop - 14;
  auto item = [&](const std::string& sample, const std::string& label) {
    o << sample << "<text x=\"" << num(lx + 30) << "\" y=\"" << num(ly + 4) << "\">" << label << "</text>\n";
    lx += 30 + 7.0 * double(label.size()) + 24;
  };
  auto seg = [&](const char* color, const char* extra) {
    return "<line x1=\"" + num(lx) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(lx + 24) + "\" y2=\"" + num(ly) + "\" stroke=\"" +
           color + "\" stroke-width=\"2\"" + extra + "/>";
  };
  item(seg(kTrainColor, ""), "train loss");
  if (!s.eval.empty())
    item(seg(kEvalColor, "") + "<circle cx=\"" + num(lx + 12) + "\" cy=\"" + num(ly) + "\" r=\"4\" fill=\"" + kEvalColor + "\"/>",
         "eval loss");
  if (!s.accuracy.empty()) item(seg(kAccColor, " stroke-dasharray=\"2 3\""), "accuracy");
  if (!s.eval_accuracy.empty()) item(seg(kAccColor, " stroke-dasharray=\"8 3 2 3\""), "eval accuracy");
  if (has_lr) item(seg(kLrColor, " stroke-dasharray=\"6 4\""), "learning rate (right axis)");
  if (!s.skipped.empty()) item(seg(kSkipColor, ""), "skipped step (not finite)");
  o << "</g>\n</svg>\n";
}

}  // namespace

std::string loss_plot_svg(const LossSeries& s, const std::string& title, const std::string& subtitle) {
  LossPlot p(s);
  p.header(title, subtitle);
  p.grid_and_frame();
  p.x_axis();
  p.loss_axis();
  p.lr_axis_and_line();
  p.train_loss();
  p.eval_loss();
  p.accuracy_lines();
  p.skipped_steps();
  p.legend();
  return p.o.str();
}

std::string loss_plot_title(const std::string& output_dir) {
  std::string name = fs::path(output_dir).lexically_normal().filename().string();
  if (name.empty() || name == ".") name = fs::absolute(output_dir).lexically_normal().parent_path().filename().string();
  if (name.empty()) name = output_dir;
  try {
    const YAML::Node cfg = YAML::LoadFile((fs::path(output_dir) / "train_config.yaml").string());
    if (cfg["model_name_or_path"] && cfg["model_name_or_path"].IsScalar())
      return name + " | " + cfg["model_name_or_path"].as<std::string>();
  } catch (const std::exception&) {  // no (readable) train_config.yaml: the run name alone
  }
  return name;
}

LossSeries write_loss_plot(const std::string& output_dir, const std::string& out_path) {
  const std::string metrics = (fs::path(output_dir) / "metrics.jsonl").string();
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) fail(ErrorKind::Io, output_dir, "directory does not exist", "pass a run's output_dir");
  if (!fs::is_regular_file(metrics, ec))
    fail(ErrorKind::Io, metrics, "no metrics.jsonl in " + output_dir,
         "pass the output_dir of a qlora train run (it writes metrics.jsonl there)");
  const LossSeries s = read_loss_series(metrics);
  if (s.train.empty() && s.eval.empty())
    fail(ErrorKind::Data, metrics, "no loss or eval_loss to plot", "train at least one logged step");
  std::string sub;
  if (!s.train.empty()) sub = "train loss " + fmt("%.4f", s.train.back().second) + " at step " + std::to_string(s.train.back().first);
  if (!s.eval.empty())
    sub += (sub.empty() ? "" : "; ") + std::string("eval loss ") + fmt("%.4f", s.eval.front().second) + " at step " +
           std::to_string(s.eval.front().first) +
           (s.eval.size() > 1 ? " -> " + fmt("%.4f", s.eval.back().second) + " at step " + std::to_string(s.eval.back().first) : "");
  if (!s.skipped.empty()) sub += "; " + std::to_string(s.skipped.size()) + " skipped step(s)";
  write_file_atomic(out_path.empty() ? (fs::path(output_dir) / "loss.svg").string() : out_path,
                    loss_plot_svg(s, loss_plot_title(output_dir), sub));
  return s;
}

}  // namespace qlora
