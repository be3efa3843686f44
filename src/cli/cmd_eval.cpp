// `qlora eval CONFIG.yaml [key=value ...] [--adapter DIR] [--data FILE] [--json]`: loss and
// perplexity of a model (and adapter) on the config's eval data, built exactly as training builds
// its eval batches, with the trainer's definition of eval_loss (mean loss per trained token).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "core/error.h"
#include "tasks/evaluate_model.h"
#include "train/progress.h"
#include "train/train_config.h"

namespace fs = std::filesystem;

namespace qlora {

namespace {

void note(const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }

}  // namespace

int cmd_eval(int argc, char** argv) {
  CLI::App app{"Loss and perplexity on the config's eval data (eval_file or the val_set_size split), with the\n"
               "tokenizer, chat template, loss masks, truncation and packing of training: the loss is the\n"
               "trainer's eval_loss (mean loss per trained token). Without --adapter: the base model alone.\n"
               "Example: qlora eval examples/tiny.yaml --adapter runs/tiny",
               "qlora eval"};
  std::string config, adapter, data;
  std::vector<std::string> overrides;
  bool as_json = false;
  app.add_option("config", config, "YAML training config (the same file `qlora train` used)")->required();
  app.add_option("overrides", overrides, "key=value overrides, applied after the file");
  app.add_option("--adapter", adapter, "PEFT adapter directory (a run's output_dir); default: no adapter, the base model");
  app.add_option("--data", data, "eval data file instead of the config's eval_file / val_set_size split");
  app.add_flag("--json", as_json, "print the result as one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> notes;
  TrainConfig cfg = load_train_config(config, overrides, &notes);
  for (const auto& n : notes) note("config: " + n);
  if (!data.empty()) {
    if (!fs::is_regular_file(data)) fail(ErrorKind::Io, data, "eval data file does not exist", "check --data");
    cfg.eval_file = data;
    cfg.val_set_size = 0;
  }

  const EvalReport r = evaluate_model(cfg, adapter, [&] { return select_backend(device_choice_name(cfg.device), int(cfg.threads)); });
  const double loss = r.loss, ppl = std::exp(loss);
  const bool pref = r.objective != "sft";  // a preference objective: no perplexity
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (as_json) {
    nlohmann::ordered_json j;
    j["objective"] = r.objective;
    j["loss"] = loss;
    j["perplexity"] = pref ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(ppl);
    for (const auto& [k, v] : r.metrics) j[k] = v;
    j["tokens"] = r.tokens;
    j["examples"] = r.examples;
    j["rows"] = r.rows;
    j["batches"] = r.batches;
    j["model"] = cfg.model_name_or_path;
    j["adapter"] = adapter.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(adapter);
    j["data"] = r.data;
    j["seconds"] = secs;
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("model:         %s%s\n", cfg.model_name_or_path.c_str(),
              adapter.empty() ? " (no adapter: the base model)" : (" + adapter " + adapter).c_str());
  std::printf("data:          %s\n", r.data.c_str());
  std::printf("examples:      %lld (%lld rows in %lld batches of up to %lld)\n", (long long)r.examples,
              (long long)r.rows, (long long)r.batches, (long long)cfg.per_device_eval_batch_size);
  std::printf("tokens scored: %lld (the tokens training puts loss on)\n", (long long)r.tokens);
  if (pref) {
    std::printf("loss:          %.6f (rl: %s, the mean over the eval batches, as eval_loss in training)\n", loss,
                r.objective.c_str());
    for (const auto& [k, v] : r.metrics) std::printf("%-14s %.6f\n", (k + ":").c_str(), v);
  } else {
    std::printf("loss:          %.6f (mean per scored token, as eval_loss in training)\n", loss);
    std::printf("perplexity:    %.4f (exp(loss))\n", ppl);
  }
  std::printf("time:          %s\n", format_duration(secs).c_str());
  return 0;
}

}  // namespace qlora
