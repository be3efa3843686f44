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
#include "model/peft_io.h"
#include "train/model_source.h"
#include "train/progress.h"
#include "train/engine_config.h"
#include "train/train_config.h"
#include "train/train_data.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace qlora {

namespace {

void note(const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }

// The adapter's own LoRA settings (r, alpha, targets), so an adapter evaluates as it was trained.
LoraSpec adapter_spec(const std::string& dir) {
  if (!fs::is_directory(dir))
    fail(ErrorKind::Io, dir, "adapter directory does not exist",
         "pass a directory with adapter_config.json and adapter_model.safetensors (a run's output_dir)");
  return read_peft_adapter_config(dir + "/adapter_config.json");
}

void load_adapter(const std::string& dir, LlamaModel& model, const std::string& model_path) {
  try {
    load_peft_adapter(dir, model);
  } catch (const Error& e) {
    // A tensor of the wrong shape or a missing layer: an adapter trained on another model.
    if (e.kind() != ErrorKind::Shape && e.message().rfind("not found", 0) != 0) throw;
    fail(e.kind(), e.where(), e.message() + ": the adapter does not fit model " + model_path,
         "use the adapter with the base model it was trained on");
  }
}

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

  const ModelSource src = open_model_source(cfg.model_name_or_path);
  const TokenizerSource ts{src.tokenizer, src.encoder.name, src.config.vocab_size};
  const EvalData ed = load_eval_data(cfg, ts, note);
  LoraSpec lora;  // no targets: the base model alone
  if (!adapter.empty()) lora = adapter_spec(adapter);

  auto be = select_backend(cfg.device, int(cfg.threads));
  const int64_t ebs = cfg.per_device_eval_batch_size;
  // The training run's engine in one process, at the evaluation's shapes, with the adapter's LoRA.
  EngineSpec spec = with_shapes(engine_spec(cfg), cfg, ebs, std::min(cfg.max_length, ed.longest));
  spec.lora = lora;
  spec.sharding = Sharding::None;
  LoadedModel lm = load_model_for_training(spec, *be, src, uint64_t(cfg.seed));
  if (!adapter.empty()) load_adapter(adapter, *lm.model, cfg.model_name_or_path);
  note("model: " + lm.source + " | " + std::to_string(lm.model->config().n_layer) + " layers | " +
       (adapter.empty() ? std::string("no adapter: the base model alone")
                        : "adapter " + adapter + " (r=" + std::to_string(lora.r) + ", " + std::to_string(lora.targets.size()) +
                              " target modules)") +
       " | backend " + be->name());

  const std::vector<Batch> batches = make_batches(ed.rows, ebs, ed.pad_id);
  const int64_t n = int64_t(batches.size());
  ProgressReporter progress(n, std::max<int64_t>(1, n / 10));
  auto last = std::chrono::steady_clock::now();
  const auto eval_start = last;
  const EvalTotals t = evaluate_batches(*lm.model, batches, [&](const EvalTotals& so_far) {
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - last).count();
    const double total_s = std::chrono::duration<double>(now - eval_start).count();
    last = now;
    char buf[160];
    std::snprintf(buf, sizeof buf, "eval batch %lld/%lld | loss %.4f | %.0f scored tok/s", (long long)so_far.batches,
                  (long long)n, so_far.mean(), total_s > 0 ? double(so_far.tokens) / total_s : 0.0);
    progress.update_text(so_far.batches, dt, buf);
  });
  progress.finish();
  if (t.tokens == 0)
    fail(ErrorKind::Data, ed.source, "the eval data has no trained token to score",
         "check train_on_inputs / roles_to_train: eval scores the tokens training would train on");
  const double loss = t.mean(), ppl = std::exp(loss);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (as_json) {
    nlohmann::ordered_json j;
    j["loss"] = loss;
    j["perplexity"] = ppl;
    j["tokens"] = t.tokens;
    j["examples"] = ed.examples;
    j["rows"] = int64_t(ed.rows.size());
    j["batches"] = n;
    j["model"] = cfg.model_name_or_path;
    j["adapter"] = adapter.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(adapter);
    j["data"] = ed.source;
    j["seconds"] = secs;
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("model:         %s%s\n", cfg.model_name_or_path.c_str(),
              adapter.empty() ? " (no adapter: the base model)" : (" + adapter " + adapter).c_str());
  std::printf("data:          %s\n", ed.source.c_str());
  std::printf("examples:      %lld (%lld rows in %lld batches of up to %lld)\n", (long long)ed.examples,
              (long long)ed.rows.size(), (long long)n, (long long)ebs);
  std::printf("tokens scored: %lld (the tokens training puts loss on)\n", (long long)t.tokens);
  std::printf("loss:          %.6f (mean per scored token, as eval_loss in training)\n", loss);
  std::printf("perplexity:    %.4f (exp(loss))\n", ppl);
  std::printf("time:          %s\n", format_duration(secs).c_str());
  return 0;
}

}  // namespace qlora
