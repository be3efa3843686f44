// Trainer: the fine-tuning loop (accumulation, clipping, AdamW, schedule, eval, checkpoints, resume).
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/engine_spec.h"
#include "model/decoder_model.h"
#include "core/comm.h"
#include "train/data.h"
#include "train/data_parallel.h"
#include "train/model_source.h"
#include "train/preference_step.h"
#include "train/train_config.h"

namespace qlora {

struct TrainSummary {
  int64_t steps_done = 0, total_steps = 0;
  double last_loss = 0, eval_loss = -1;
  bool interrupted = false;
  int64_t skipped_steps = 0;  // nan_policy: skip
  std::string adapter_dir;
};

// Set by SIGINT/SIGTERM; the loop saves a checkpoint at the next step boundary and stops.
extern std::atomic<bool> g_stop_requested;
void install_stop_signal_handlers();

// The model of `src` on `be` as `spec` describes it (train/engine_config.h makes the spec of a
// training config), its base loaded and its adapters initialized from `seed`; used by train and eval.
struct LoadedModel {
  std::unique_ptr<DecoderModel> model;
  TextEncoder encoder;
  std::string source;
};
// comm: the ranks the spec's sharding splits over (zero1: the AdamW moments; fsdp: also each decoder
// layer's frozen base, gathered over it); null: one process.
LoadedModel load_model_for_training(const EngineSpec& spec, Backend& be, const ModelSource& src, uint64_t seed,
                                    Comm* comm = nullptr);

// Forward-only loss over a fixed list of batches (no dropout), in order: the trainer's eval_loss
// is loss_sum / tokens. on_batch (optional) is called after each batch with the totals so far.
struct EvalTotals {
  double loss_sum = 0;  // summed token loss
  int64_t tokens = 0;   // tokens that produce loss (the trained tokens)
  int64_t batches = 0;
  double mean() const { return tokens ? loss_sum / double(tokens) : 0.0; }
};
EvalTotals evaluate_batches(DecoderModel& model, const std::vector<Batch>& batches,
                            const std::function<void(const EvalTotals&)>& on_batch = {});

class Trainer {
 public:
  // comm: the ranks of a data-parallel job (null = this process alone). Every rank runs the same
  // steps; only rank 0 logs and writes files. Several ranks evaluate their shares of the eval set
  // (sharded eval); under fsdp all ranks also decode the sample answers in lockstep.
  // device: sums gradients in device memory (NCCL) for a GPU backend; null: through `comm`.
  Trainer(TrainConfig cfg, Backend& be, Comm* comm = nullptr, DeviceReducer* device = nullptr);
  TrainSummary run();

 private:
  // Trainer::run's steps, in order, over the state one run carries (trainer.cpp).
  struct Run;
  ModelSource prepare_data(Run& r);                     // data, sample prompts' template
  void load_model(Run& r, const ModelSource& source);   // the engine spec, the model, data parallel
  void precompute_reference(Run& r);                    // precompute_ref_log_probs: into the examples
  void resume(Run& r);                                  // from resume_from_checkpoint, if set
  void open_outputs(Run& r);                            // output_dir, metrics.jsonl, progress
  void before_training(Run& r);                         // baseline eval and sample answers
  void train_loop(Run& r);                              // the optimizer steps until done or stopped
  TrainSummary finish(Run& r);                          // checkpoint if stopped, else adapter and plot

  // train_loop's parts, in the order one step runs them (trainer.cpp).
  StepResult run_step(Run& r, const std::vector<Batch>& mbs, const OptimHyper& hyper, double lr, int64_t step,
                      bool* stop_agreed, PrefMetricMeans* pref_metrics);
  std::map<std::string, double> reduced_step_metrics(Run& r, const PrefMetricMeans& pref_metrics);
  void skip_non_finite_step(Run& r, int64_t step, double loss, double gnorm, int64_t& consecutive_skips);
  void report_step(Run& r, int64_t done, const StepResult& res, double lr, double dt,
                   const std::map<std::string, double>& step_metrics);
  nlohmann::json step_record(Run& r, int64_t done, const StepResult& res, double lr, double dt, int64_t gathered,
                             const std::map<std::string, double>& step_metrics);
  void eval_and_save(Run& r, int64_t done, bool ends_epoch, nlohmann::json& rec);
  void progress_message(Run& r, const std::string& line);  // rank 0: a line beside the progress

  double evaluate(const std::vector<Batch>& batches);
  double eval_into(Run& r, nlohmann::json& rec);  // the eval loss (and preference metrics) into rec
  // Preference objectives: the mean objective over the batches and the means of their metrics,
  // sharded over ranks as evaluate() is.
  PrefEvalTotals evaluate_preference_batches(const std::vector<Batch>& batches);
  // Called on every rank (ZeRO-1 gathers the moments); rank 0 writes.
  void save_checkpoint(const std::string& dir, int64_t step, const DataStream& stream);
  // Every rank's LoRA weights and moments are finite (the same answer on every rank).
  bool state_finite_everywhere();
  int64_t restore_checkpoint(const std::string& dir, DataStream& stream);
  void rotate_checkpoints();
  void log(const std::string& line);
  nlohmann::ordered_json print_sample_answers(const ChatRenderFn& render, const std::string& when);

  TrainConfig cfg_;
  Backend& be_;
  std::unique_ptr<Comm> own_comm_;  // the single-process Comm when none was given
  Comm* comm_;
  DeviceReducer* device_reducer_ = nullptr;
  bool lead_;  // rank 0: logs, evaluates, writes
  LoadedModel lm_;
  std::unique_ptr<DataParallelStep> dp_;  // more than one rank
  std::shared_ptr<const Tokenizer> tokenizer_;  // set when sample_prompts is
  std::optional<PreferenceSpec> pref_;          // rl: dpo, orpo, simpo, kto
};

}  // namespace qlora
