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
#include "train/train_data.h"

namespace qlora {

namespace {

using json = nlohmann::json;

struct Bucket {
  int64_t lo, hi, count;
};

// Powers of two: 1-16, 17-32, ... up to the longest example.
std::vector<Bucket> histogram(const std::vector<int32_t>& lengths, int64_t longest) {
  std::vector<Bucket> b;
  for (int64_t lo = 1, hi = 16; lo <= std::max<int64_t>(1, longest); lo = hi + 1, hi *= 2) b.push_back({lo, hi, 0});
  for (int32_t n : lengths)
    for (auto& k : b)
      if (n >= k.lo && n <= k.hi) {
        k.count++;
        break;
      }
  return b;
}

std::string fmt_pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * x);
  return buf;
}

// The first n examples in file order, unpacked, for --show.
std::vector<Example> preview(const TrainConfig& cfg, const TokenizerSource& ts, int64_t n) {
  std::vector<Example> out;
  DatasetOptions o = dataset_options(cfg, ts);
  for (const DatasetSpec& s : dataset_specs(cfg)) {
    if (int64_t(out.size()) >= n) break;
    o.limit_rows = n - int64_t(out.size());
    for (auto& e : load_dataset(s, ts.tokenizer.get(), o, nullptr)) out.push_back(std::move(e));
  }
  return out;
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

  // What packing gives (or would give) for the train examples as the trainer gets them.
  PackStats pack = d.pack;
  if (!cfg.packing) {
    std::vector<int64_t> lens;
    for (size_t i = 0; i < d.train.size(); i++) lens.push_back(d.train.length(i)), pack.tokens += lens.back();
    pack.documents = int64_t(lens.size());
    pack.capacity = cfg.max_length;
    pack.rows = int64_t(pack_ffd(lens, cfg.max_length, uint64_t(cfg.seed)).size());
  }
  const std::vector<Bucket> hist = histogram(st.lengths, st.longest);
  std::vector<Example> samples = show > 0 ? preview(cfg, ts, show) : std::vector<Example>{};

  if (as_json) {
    json j;
    j["config"] = config;
    j["tokenizer"] = d.tokenizer_name;
    j["chat_template"] = d.template_name;
    j["notes"] = notes;
    j["rows"] = st.rows;
    j["examples"] = st.examples;
    j["train_examples"] = pack.documents;  // after weights and the eval split
    j["eval_examples"] = int64_t(d.eval.size());
    j["tokens"] = st.tokens;
    j["trained_tokens"] = st.trained_tokens;
    j["trained_share"] = st.tokens ? double(st.trained_tokens) / double(st.tokens) : 0.0;
    j["longest"] = st.longest;
    j["max_length"] = cfg.max_length;
    j["truncation"] = cfg.truncation;
    j["truncated"] = st.truncated;
    j["dropped"] = st.dropped;
    j["no_trained_token"] = st.no_loss;
    j["bad_rows"] = st.bad_rows;
    j["bad_row_messages"] = st.bad_row_messages;
    j["split_mismatch"] = st.split_mismatch;
    j["double_bos"] = st.double_bos;
    j["eos_added"] = st.eos_added;
    j["threads"] = d.threads;
    j["prepare_seconds"] = d.prepare_s;  // reading, templating and tokenizing the train files
    j["pack_seconds"] = d.pack_s;
    j["cache"] = {{"path", d.cache.path}, {"reused", d.cache.reused}, {"bytes", d.cache.bytes},
                  {"load_seconds", d.cache.load_s}, {"write_seconds", d.write_s}, {"note", d.cache.note},
                  {"prepared_at", d.cache.prepared_at}};
    j["files"] = json::array();
    for (const auto& f : d.files)
      j["files"].push_back({{"path", f.spec.path}, {"format", f.stats.format}, {"weight", f.spec.weight},
                            {"rows", f.stats.rows}, {"examples", f.stats.examples}, {"weighted", f.weighted}});
    j["histogram"] = json::array();
    for (const auto& b : hist) j["histogram"].push_back({{"lo", b.lo}, {"hi", b.hi}, {"count", b.count}});
    j["packing"] = {{"enabled", cfg.packing}, {"documents", pack.documents}, {"rows", pack.rows},
                    {"capacity", pack.capacity}, {"efficiency", pack.efficiency()}};
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
