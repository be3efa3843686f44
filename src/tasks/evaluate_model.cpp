// `qlora eval CONFIG.yaml [key=value ...] [--adapter DIR] [--data FILE] [--json]`: loss and
// perplexity of a model (and adapter) on the config's eval data, built exactly as training builds
// its eval batches, with the trainer's definition of eval_loss (mean loss per trained token).
#include "tasks/evaluate_model.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/peft_io.h"
#include "train/engine_config.h"
#include "train/model_source.h"
#include "train/preference_step.h"
#include "train/progress.h"
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

void load_adapter(const std::string& dir, DecoderModel& model, const std::string& model_path) {
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

EvalReport evaluate_model(const TrainConfig& cfg, const std::string& adapter,
                          const std::function<std::unique_ptr<Backend>()>& make_backend) {
  const ModelSource src = open_model_source(cfg.model_name_or_path);
  const TokenizerSource ts{src.tokenizer, src.encoder.name, src.config.vocab_size};
  const EvalData ed = load_eval_data(cfg, ts, note);
  LoraSpec lora;  // no targets: the base model alone
  if (!adapter.empty()) lora = adapter_spec(adapter);

  auto be = make_backend();
  const int64_t ebs = cfg.per_device_eval_batch_size;
  // The training run's engine in one process, at the evaluation's shapes, with the adapter's LoRA.
  EngineSpec spec = with_shapes(engine_spec(cfg), cfg, ebs, std::min(row_tokens_cap(cfg), ed.longest));
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
  const std::optional<PreferenceSpec> pref = preference_spec(cfg);
  EvalTotals t;
  PrefEvalTotals pt;
  if (pref) {  // the objective and its metrics per batch, as the trainer's preference eval
    pt = evaluate_preference(*lm.model, *pref, batches, [&](size_t done, const PrefEvalTotals& so_far) {
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - last).count();
      last = now;
      t.tokens += batches[done - 1].n_trained();
      char buf[160];
      std::snprintf(buf, sizeof buf, "eval batch %lld/%lld | %s loss so far %.4f", (long long)done, (long long)n,
                    objective_name(cfg.rl), so_far.loss * double(n) / double(done));
      progress.update_text(int64_t(done), dt, buf);
    });
  } else {
    t = evaluate_batches(*lm.model, batches, [&](const EvalTotals& so_far) {
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - last).count();
      const double total_s = std::chrono::duration<double>(now - eval_start).count();
      last = now;
      char buf[160];
      std::snprintf(buf, sizeof buf, "eval batch %lld/%lld | loss %.4f | %.0f scored tok/s", (long long)so_far.batches,
                    (long long)n, so_far.mean(), total_s > 0 ? double(so_far.tokens) / total_s : 0.0);
      progress.update_text(so_far.batches, dt, buf);
    });
  }
  progress.finish();
  if (t.tokens == 0)
    fail(ErrorKind::Data, ed.source, "the eval data has no trained token to score",
         "check train_on_inputs / roles_to_train: eval scores the tokens training would train on");
  EvalReport r;
  r.loss = pref ? pt.loss : t.mean();
  r.objective = objective_name(cfg.rl);
  if (pref) r.metrics = pt.metrics.means();
  r.tokens = t.tokens;
  r.examples = ed.examples;
  r.rows = int64_t(ed.rows.size());
  r.batches = n;
  r.data = ed.source;
  return r;
}

}  // namespace qlora
