// `qlora plot OUTPUT_DIR` (and the loss.svg `qlora train` writes): well-formed SVG whose train-loss
// polyline has one point per logged loss and whose points map back to the logged values through
// the axis ranges it states; eval markers, the learning-rate axis, skipped steps, clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "cli_util.h"

using namespace qlora::cli_test;
namespace fs = std::filesystem;

namespace {

// Balanced tags, quoted attributes, escaped '&' and '<': enough XML for any SVG viewer. Returns
// "" or what is wrong.
std::string xml_problem(const std::string& s) {
  std::vector<std::string> stack;
  size_t i = 0;
  if (s.rfind("<?xml", 0) == 0) i = s.find("?>") + 2;
  while (i < s.size()) {
    const size_t lt = s.find('<', i);
    const std::string text = s.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    for (size_t a = text.find('&'); a != std::string::npos; a = text.find('&', a + 1))
      if (!std::regex_search(text.substr(a), std::regex("^&(amp|lt|gt|quot|apos|#[0-9]+);")))
        return "unescaped & in text: " + text;
    if (lt == std::string::npos) break;
    const size_t gt = s.find('>', lt);
    if (gt == std::string::npos) return "unterminated tag at " + std::to_string(lt);
    std::string tag = s.substr(lt + 1, gt - lt - 1);
    if (std::count(tag.begin(), tag.end(), '"') % 2) return "odd quotes in <" + tag + ">";
    if (tag.find('<') != std::string::npos) return "'<' inside <" + tag + ">";
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) return "</" + name + "> closes " + (stack.empty() ? "nothing" : stack.back());
      stack.pop_back();
    } else if (tag.empty() || tag.back() != '/') {
      stack.push_back(tag.substr(0, tag.find_first_of(" \t\n")));
    }
    i = gt + 1;
  }
  if (!stack.empty()) return "<" + stack.back() + "> never closed";
  return "";
}

std::string attr(const std::string& tag, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(tag, m, std::regex("\\s" + name + "=\"([^\"]*)\""))) return "";
  return m[1];
}

std::vector<std::string> tags(const std::string& svg, const std::string& pattern) {
  std::vector<std::string> v;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) v.push_back(it->str());
  return v;
}

std::vector<std::pair<double, double>> points(const std::string& polyline) {
  std::vector<std::pair<double, double>> v;
  std::istringstream in(attr(polyline, "points"));
  for (std::string p; in >> p;) {
    const size_t c = p.find(',');
    v.emplace_back(std::stod(p.substr(0, c)), std::stod(p.substr(c + 1)));
  }
  return v;
}

// The axis mapping the plot states: pixel <-> (step, loss, lr).
struct Mapping {
  double x, y, w, h, s0, s1, l0, l1, r0 = 0, r1 = 0;
  explicit Mapping(const std::string& svg) {
    const auto area = tags(svg, "<rect id=\"plot-area\"[^>]*>");
    EXPECT_EQ(area.size(), 1u);
    const std::string& t = area.at(0);
    x = std::stod(attr(t, "x")), y = std::stod(attr(t, "y")), w = std::stod(attr(t, "width")), h = std::stod(attr(t, "height"));
    s0 = std::stod(attr(t, "data-step-min")), s1 = std::stod(attr(t, "data-step-max"));
    l0 = std::stod(attr(t, "data-loss-min")), l1 = std::stod(attr(t, "data-loss-max"));
    if (!attr(t, "data-lr-max").empty()) r0 = std::stod(attr(t, "data-lr-min")), r1 = std::stod(attr(t, "data-lr-max"));
  }
  double step(double px) const { return s0 + (px - x) / w * (s1 - s0); }
  double loss(double py) const { return l0 + (y + h - py) / h * (l1 - l0); }
  double lr(double py) const { return r0 + (y + h - py) / h * (r1 - r0); }
};

// A run's metrics as the trainer logs them: eval before training, loss + lr every step, eval every
// 5 steps (step 5 without its own loss row, as with logging_steps that do not divide eval_steps),
// and step 4 skipped as nan_policy: skip records it.
struct Row {
  int64_t step;
  double loss, lr;
};
const std::vector<Row> kTrain = {{1, 3.2, 1e-4}, {2, 2.9, 2e-4}, {3, 2.71, 3e-4}, {6, 2.4, 2.5e-4},
                                 {7, 2.35, 2e-4}, {8, 2.2, 1.5e-4}, {9, 2.25, 1e-4}, {10, 2.05, 5e-5}};
const std::vector<std::pair<int64_t, double>> kEval = {{0, 3.3}, {5, 2.6}, {10, 2.1}};

std::string make_run(const std::string& name) {
  const std::string d = temp_dir(name);
  std::ofstream m(d + "/metrics.jsonl");
  m << "{\"step\":0,\"eval_loss\":3.3}\n";
  for (const Row& r : kTrain) {
    if (r.step == 6) m << "{\"step\":4,\"skipped\":true,\"loss\":null,\"grad_norm\":null,\"reason\":\"loss\"}\n"
                       << "{\"step\":5,\"eval_loss\":2.6}\n";
    m << "{\"step\":" << r.step << ",\"loss\":" << r.loss << ",\"learning_rate\":" << r.lr
      << ",\"grad_norm\":1.0,\"tokens_per_second\":100.0" << (r.step == 10 ? ",\"eval_loss\":2.1" : "") << "}\n";
  }
  std::ofstream(d + "/train_config.yaml") << "model_name_or_path: models/Some-Model & <Co>\noutput_dir: x\n";
  return d;
}

}  // namespace

TEST(PlotCli, PointsMapBackToTheLoggedValues) {
  const std::string d = make_run("plot_run");
  RunResult r = run_qlora("plot " + d);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("8 train-loss points, 3 eval points"), std::string::npos) << r.output;
  const std::string svg = read_file(d + "/loss.svg");
  ASSERT_EQ(xml_problem(svg), "") << svg;
  EXPECT_EQ(svg.find("<?xml"), 0u);
  EXPECT_NE(svg.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  // title: run name and model, escaped
  EXPECT_NE(svg.find(fs::path(d).filename().string() + " | models/Some-Model &amp; &lt;Co&gt;"), std::string::npos) << svg;
  const Mapping map(svg);

  // train loss: one point per logged loss, broken at the skipped step 4 (steps 1-3 and 6-10)
  const auto lines = tags(svg, "<polyline class=\"train-loss\"[^>]*>");
  ASSERT_EQ(lines.size(), 2u) << svg;
  std::vector<std::pair<double, double>> pts;
  for (const auto& l : lines)
    for (const auto& p : points(l)) pts.push_back(p);
  ASSERT_EQ(pts.size(), kTrain.size());
  const double step_tol = 0.006 / map.w * (map.s1 - map.s0), loss_tol = 0.006 / map.h * (map.l1 - map.l0);
  for (size_t i = 0; i < kTrain.size(); i++) {
    EXPECT_NEAR(map.step(pts[i].first), double(kTrain[i].step), step_tol) << i;
    EXPECT_NEAR(map.loss(pts[i].second), kTrain[i].loss, loss_tol) << i;
  }
  // axis ranges hold every value and start at step 0
  EXPECT_EQ(map.s0, 0.0);
  EXPECT_GE(map.s1, 10.0);
  EXPECT_LE(map.l0, 2.05);
  EXPECT_GE(map.l1, 3.3);

  // eval: a marker per eval_loss (with a line through them)
  const auto marks = tags(svg, "<g id=\"eval-loss\"[\\s\\S]*?</g>");
  ASSERT_EQ(marks.size(), 1u);
  const auto circles = tags(marks[0], "<circle [^>]*>");
  ASSERT_EQ(circles.size(), kEval.size());
  for (size_t i = 0; i < kEval.size(); i++) {
    EXPECT_NEAR(map.step(std::stod(attr(circles[i], "cx"))), double(kEval[i].first), step_tol);
    EXPECT_NEAR(map.loss(std::stod(attr(circles[i], "cy"))), kEval[i].second, loss_tol);
  }
  EXPECT_EQ(tags(svg, "<polyline id=\"eval-loss-line\"[^>]*>").size(), 1u);

  // learning rate: dashed, on its own right-hand axis
  EXPECT_NE(svg.find("<g id=\"lr-axis\""), std::string::npos);
  EXPECT_NE(svg.find(">learning rate</text>"), std::string::npos);
  const auto lr = tags(svg, "<polyline id=\"lr\"[^>]*>");
  ASSERT_EQ(lr.size(), 1u);
  EXPECT_FALSE(attr(lr[0], "stroke-dasharray").empty());
  const auto lr_pts = points(lr[0]);
  ASSERT_EQ(lr_pts.size(), kTrain.size());
  for (size_t i = 0; i < kTrain.size(); i++)
    EXPECT_NEAR(map.lr(lr_pts[i].second), kTrain[i].lr, 0.006 / map.h * (map.r1 - map.r0)) << i;
  EXPECT_EQ(map.r0, 0.0);
  EXPECT_GE(map.r1, 3e-4);

  // axis labels, legend, the skipped step marked
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_NE(svg.find(">loss (per trained token)</text>"), std::string::npos);
  for (const char* s : {">train loss</text>", ">eval loss</text>", ">learning rate (right axis)</text>"})
    EXPECT_NE(svg.find(s), std::string::npos) << s;
  const auto skipped = tags(svg, "<g id=\"skipped-steps\"[\\s\\S]*?</g>");
  ASSERT_EQ(skipped.size(), 1u);
  const auto skip_line = tags(skipped[0], "<line [^>]*>");
  ASSERT_EQ(skip_line.size(), 1u);
  EXPECT_NEAR(map.step(std::stod(attr(skip_line[0], "x1"))), 4.0, step_tol);
  fs::remove_all(d);
}

TEST(PlotCli, OutOptionOnePointAndTornLastLine) {
  const std::string d = temp_dir("plot_one");
  // one logged step, then the torn line of a killed run
  std::ofstream(d + "/metrics.jsonl") << "{\"step\":1,\"loss\":2.5,\"learning_rate\":0.001}\n{\"step\":2,\"lo";
  RunResult r = run_qlora("plot " + d + " --out " + d + "/one.svg");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(fs::exists(d + "/loss.svg"));
  const std::string svg = read_file(d + "/one.svg");
  ASSERT_EQ(xml_problem(svg), "") << svg;
  const Mapping map(svg);
  EXPECT_LT(map.l0, 2.5);
  EXPECT_GT(map.l1, 2.5);
  const auto lines = tags(svg, "<polyline class=\"train-loss\"[^>]*>");
  ASSERT_EQ(lines.size(), 1u);
  const auto pts = points(lines[0]);
  ASSERT_EQ(pts.size(), 1u);
  EXPECT_NEAR(map.loss(pts[0].second), 2.5, 1e-3);
  EXPECT_EQ(tags(svg, "<circle class=\"train-loss-dot\"[^>]*>").size(), 1u) << "a lone point is marked";
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  // no leftover temporary file
  for (const auto& e : fs::directory_iterator(d)) EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  fs::remove_all(d);
}

TEST(PlotCli, ClearErrors) {
  const std::string d = temp_dir("plot_err");
  RunResult r = run_qlora("plot " + d);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("no metrics.jsonl in " + d), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(d + "/loss.svg"));

  r = run_qlora("plot " + d + "/nope");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;

  std::ofstream(d + "/metrics.jsonl") << "{\"step\":0}\n";
  r = run_qlora("plot " + d);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("no loss or eval_loss to plot"), std::string::npos) << r.output;

  std::ofstream(d + "/metrics.jsonl") << "{\"step\":1,\"loss\":2}\nnot json\n{\"step\":2,\"loss\":1}\n";
  r = run_qlora("plot " + d);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("metrics.jsonl:2"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(d + "/loss.svg"));

  r = run_qlora("plot");
  EXPECT_NE(r.code, 0);
  fs::remove_all(d);
}
