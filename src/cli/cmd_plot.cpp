// `qlora plot OUTPUT_DIR [--out FILE]`: loss.svg (train and eval loss, learning rate, against
// step) from a run's metrics.jsonl; `qlora train` writes the same plot when it ends.
#include <cstdio>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "train/loss_plot.h"

namespace qlora {

int cmd_plot(int argc, char** argv) {
  CLI::App app{"Plot a run's metrics.jsonl as an SVG: train loss and eval loss against step, the learning rate\n"
               "on a second axis. qlora train writes OUTPUT_DIR/loss.svg itself at the end of a run.\n"
               "Example: qlora plot runs/tiny --out tiny.svg",
               "qlora plot"};
  std::string dir, out;
  app.add_option("output_dir", dir, "a training run's output_dir (with metrics.jsonl)")->required();
  app.add_option("--out", out, "where to write the SVG (default: OUTPUT_DIR/loss.svg)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::string path = out.empty() ? (std::filesystem::path(dir) / "loss.svg").string() : out;
  const LossSeries s = write_loss_plot(dir, path);
  std::printf("wrote %s: %zu train-loss points, %zu eval points, %zu learning-rate points", path.c_str(), s.train.size(),
              s.eval.size(), s.lr.size());
  if (!s.skipped.empty()) std::printf(", %zu skipped steps", s.skipped.size());
  std::printf("\n");
  return 0;
}

}  // namespace qlora
