// `qlora data CONFIG.yaml [key=value ...] [--show N] [--json]`: the dataset exactly as training
// would see it: rows, tokens, lengths, truncation, packing and which tokens get loss.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "text/packing.h"
#include "text/tokenizer.h"
#include "train/train_config.h"
#include "train/data_report.h"
#include "train/train_data.h"

namespace qlora {

namespace {

using json = nlohmann::json;

std::string fmt_pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * x);
  return buf;
}

std::string ids_text(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
  return s;
}

}  // namespace

int cmd_data(int argc, char** argv) {
  CLI::App app{"Dataset statistics and a token/label preview, exactly as `qlora train` would load the data.\n"
               "Example: qlora data config.yaml --show 3",
               "qlora data"};
  std::string config;
  std::vector<std::string> overrides;
  int64_t show = 0;
  bool as_json = false;
  app.add_option("config", config, "YAML training config")->required();
  app.add_option("overrides", overrides, "key=value overrides, applied after the file");
  app.add_option("--show", show, "print N examples with the tokens that get loss marked")->check(CLI::NonNegativeNumber);
  app.add_flag("--json", as_json, "print the statistics as one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::vector<std::string> notes;
  const TrainConfig cfg = load_train_config(config, overrides, &notes);
  const TokenizerSource ts = open_tokenizer_source(cfg.model_name_or_path);
  std::vector<std::string> lines;
  // The summary prints after the notes; progress on a long file goes to stderr as it comes.
  const TrainData d = load_train_data(cfg, ts, [&](const std::string& l) { lines.push_back(l); },
                                      [](const std::string& l) { std::fprintf(stderr, "%s\n", l.c_str()); });
  const DatasetStats& st = d.stats;
  const PackStats pack = packing_of(d, cfg);  // what packing gives, or would give
  const std::vector<LengthBucket> hist = length_histogram(st);
  std::vector<Example> samples = show > 0 ? preview_examples(cfg, ts, show) : std::vector<Example>{};

  if (as_json) {
    json j = train_data_json(d, cfg);
    j["config"] = config;
    j["notes"] = notes;
    j["samples"] = json::array();
    for (const auto& e : samples) {
      json s = {{"ids", e.ids}, {"labels", e.labels}};
      if (ts.tokenizer) s["marked"] = render_example(e, *ts.tokenizer, false);
      j["samples"].push_back(s);
    }
    std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
  }

  for (const auto& n : notes) std::printf("config: %s\n", n.c_str());
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  std::printf("trained tokens: %s of all tokens\n", fmt_pct(st.tokens ? double(st.trained_tokens) / double(st.tokens) : 0).c_str());
  std::printf("packing: %s, %lld train examples -> %lld rows of %lld tokens (efficiency %s)\n",
              cfg.packing ? "on" : "off (if enabled)", (long long)pack.documents, (long long)pack.rows,
              (long long)pack.capacity, fmt_pct(pack.efficiency()).c_str());
  std::printf("length histogram (tokens per example):\n");
  int64_t top = 1;
  for (const auto& b : hist) top = std::max(top, b.count);
  for (const auto& b : hist)
    std::printf("  %6lld-%-6lld %8lld %s\n", (long long)b.lo, (long long)b.hi, (long long)b.count,
                std::string(size_t(40 * b.count / top), '#').c_str());
  const bool ansi = isatty(fileno(stdout));
  for (size_t i = 0; i < samples.size(); i++) {
    const Example& e = samples[i];
    std::printf("\n--- example %zu: %zu tokens, %lld trained %s\n", i + 1, e.ids.size(), (long long)e.n_trained(),
                ansi ? "(trained text in green)" : "(trained text in [[...]])");
    if (ts.tokenizer) std::printf("%s\n", render_example(e, *ts.tokenizer, ansi).c_str());
    std::printf("ids:    %s\nlabels: %s\n", ids_text(e.ids).c_str(), ids_text(e.labels).c_str());
  }
  return 0;
}

}  // namespace qlora
