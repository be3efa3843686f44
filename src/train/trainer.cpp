// The training loop, read top to bottom: data -> model -> steps {micro-batches, clip, AdamW} ->
// metrics / eval / checkpoints. Loss is normalized by the trained tokens of the whole step, so
// gradient accumulation equals the large batch exactly.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/host_memory.h"
#include "io/atomic_file.h"
#include "io/json_util.h"
#include "model/peft_io.h"
#include "model/trained_model_io.h"
#include "train/loss_plot.h"
#include "train/metrics.h"
#include "train/model_source.h"
#include "train/progress.h"
#include "train/router_metrics.h"
#include "train/sample_answers.h"
#include "train/schedule.h"
#include "train/tensorboard.h"
#include "train/data_parallel.h"
#include "train/engine_config.h"
#include "train/step.h"
#include "train/train_data.h"

namespace fs = std::filesystem;

namespace qlora {

std::atomic<bool> g_stop_requested{false};

static void on_stop_signal(int) { g_stop_requested.store(true); }

void install_stop_signal_handlers() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

LoadedModel load_model_for_training(const EngineSpec& spec, Backend& be, const ModelSource& src, uint64_t seed,
                                    Comm* comm) {
  const EngineTarget target{be.compute_dtype(), comm ? comm->size() : 1, comm ? comm->rank() : 0};
  ModelPlanOptions po = resolve_engine(spec, target);  // the model resolves the GEMM dtype against the base and device
  adopt_stored_quantization(po, src.tensors);  // a bnb-4bit checkpoint keeps its own format
  fit_to_budget(spec, src.config, po, be.device(), be.memory_available());
  LoadedModel lm;
  lm.model = std::make_unique<DecoderModel>(src.config, be, po, spec.lora);
  if (spec.sharding == Sharding::Fsdp && comm) lm.model->set_base_comm(*comm);
  lm.model->load_base(src.tensors);
  lm.model->init_trainable(seed);
  lm.encoder = src.encoder;
  lm.source = src.tensors.description;
  return lm;
}

Trainer::Trainer(TrainConfig cfg, Backend& be, Comm* comm, DeviceReducer* device)
    : cfg_(std::move(cfg)), be_(be), own_comm_(comm ? nullptr : make_single_comm()), comm_(comm ? comm : own_comm_.get()),
      device_reducer_(device), lead_(comm_->rank() == 0) {}

void Trainer::log(const std::string& line) {
  if (lead_) std::fprintf(stderr, "%s\n", line.c_str());
}

EvalTotals evaluate_batches(DecoderModel& model, const std::vector<Batch>& batches,
                            const std::function<void(const EvalTotals&)>& on_batch) {
  EvalTotals t;
  for (const auto& b : batches) {
    t.loss_sum += model.forward_loss(b);
    t.tokens += b.n_trained();
    t.batches++;
    if (on_batch) on_batch(t);
  }
  return t;
}

// Several ranks: each evaluates its contiguous share of the batches; the per-batch loss sums are
// gathered (a sum of one value and zeros is exact) and added in batch order, so the result is the
// one process's bits. Under fsdp every rank runs the same number of forwards (each gathers the
// layers with the others): a rank with one batch fewer repeats its last and drops the result.
double Trainer::evaluate(const std::vector<Batch>& batches) {
  DecoderModel& model = *lm_.model;
  const int world = comm_->size();
  if (world == 1) return evaluate_batches(model, batches).mean();
  const Slice mine = slice_of(batches.size(), comm_->rank(), world);
  std::vector<double> loss(batches.size(), 0.0);
  for (size_t j = mine.begin; j < mine.end(); j++) loss[j] = model.forward_loss(batches[j]);
  if (model.base_sharded() && mine.count < (batches.size() + size_t(world) - 1) / size_t(world))
    model.forward_loss(batches[mine.count ? mine.end() - 1 : 0]);
  comm_->allreduce_sum(loss.data(), loss.size());
  EvalTotals t;
  for (size_t j = 0; j < batches.size(); j++) {
    t.loss_sum += loss[j];
    t.tokens += batches[j].n_trained();
  }
  return t.mean();
}

PrefEvalTotals Trainer::evaluate_preference_batches(const std::vector<Batch>& batches) {
  DecoderModel& model = *lm_.model;
  const int world = comm_->size();
  if (world == 1) return evaluate_preference(model, *pref_, batches);
  const Slice mine = slice_of(batches.size(), comm_->rank(), world);
  std::vector<Batch> share(batches.begin() + std::ptrdiff_t(mine.begin), batches.begin() + std::ptrdiff_t(mine.end()));
  PrefEvalTotals part = evaluate_preference(model, *pref_, share);
  if (model.base_sharded() && mine.count < (batches.size() + size_t(world) - 1) / size_t(world))
    evaluate_preference(model, *pref_, {batches[mine.count ? mine.end() - 1 : 0]});  // lockstep gathers
  std::vector<double> v = part.metrics.flat();
  v.push_back(part.loss * double(share.size()));  // this rank's sum of batch objectives
  comm_->allreduce_sum(v.data(), v.size());
  PrefEvalTotals t;
  t.loss = v.back() / double(std::max<size_t>(1, batches.size()));
  v.pop_back();
  t.metrics = PrefMetricMeans::from_flat(v);
  return t;
}

bool Trainer::state_finite_everywhere() {
  double broken = optimizer_state_finite(*lm_.model) ? 0.0 : 1.0;  // ZeRO-1: each rank checks its share
  comm_->allreduce_sum(&broken, 1);
  return broken == 0;
}

void Trainer::save_checkpoint(const std::string& dir, int64_t step, const DataStream& stream) {
  Zero1Optimizer* zero1 = dp_ ? dp_->zero1() : nullptr;
  std::vector<std::vector<float>> moments;  // ZeRO-1: every rank's shares, assembled
  if (zero1) moments = zero1->gather_moments();
  if (!lead_) return;
  bool finite = optimizer_state_finite(*lm_.model);
  for (const auto& t : moments)
    for (float x : t) finite = finite && std::isfinite(x);
  if (!finite)  // never a checkpoint of a broken state
    fail(ErrorKind::Data, dir, "not written: a trained weight or optimizer moment is not finite",
         "lower learning_rate; resume from an earlier checkpoint");
  try {
    AtomicDir d(dir);  // built under a temporary name; deleted again if anything below fails
    if (lm_.model->full()) write_trained_model(d.temp_path(), *lm_.model, cfg_.model_name_or_path);
    else write_peft_adapter(d.temp_path(), *lm_.model, cfg_.model_name_or_path);
    if (zero1) write_gathered_optimizer_state(d.path("optimizer.safetensors"), *lm_.model, moments);
    else write_optimizer_state(d.path("optimizer.safetensors"), *lm_.model);
    nlohmann::json st;
    st["global_step"] = step;
    // Every rank reads the same global stream of micro-batches and takes its share of each step,
    // so this one cursor is every rank's data position, at any world size.
    st["data_epoch"] = stream.epoch();
    st["data_index"] = stream.index();
    st["world_size"] = comm_->size();
    st["global_batch_rows"] = cfg_.per_device_train_batch_size * cfg_.gradient_accumulation_steps * comm_->size();
    st["seed"] = cfg_.seed;
    st["config"] = dump_train_config(cfg_);
    d.write("trainer_state.json", st.dump(2));
    d.commit();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Io) throw;
    fail(ErrorKind::Io, e.where(), e.message() + "; " + fs::path(dir).filename().string() + " was not saved",
         (e.hint().empty() ? "" : e.hint() + "; ") + "the checkpoints saved before it are intact");
  }
}

int64_t Trainer::restore_checkpoint(const std::string& dir, DataStream& stream) {
  const nlohmann::json st = read_json_file(dir + "/trainer_state.json");
  const std::string where = dir + "/trainer_state.json";
  if (lm_.model->full()) lm_.model->load_base(open_model_source(dir).tensors);  // the trained weights
  else load_peft_adapter(dir, *lm_.model);
  if (dp_ && dp_->zero1()) dp_->zero1()->load_moments(dir + "/optimizer.safetensors");  // this rank's shares
  else load_optimizer_state(dir + "/optimizer.safetensors", *lm_.model);
  stream.seek(json_int(st, "data_epoch", where), json_int(st, "data_index", where));
  if (st.contains("world_size") && json_int(st, "world_size", where) != comm_->size())
    log("note: " + dir + " was written by " + std::to_string(json_int(st, "world_size", where)) +
        " rank(s) with a global batch of " + std::to_string(json_int(st, "global_batch_rows", where)) +
        " rows; this run has " + std::to_string(comm_->size()) + " with " +
        std::to_string(cfg_.per_device_train_batch_size * cfg_.gradient_accumulation_steps * comm_->size()) +
        " (the data continues where it stopped)");
  if (json_int(st, "seed", where) != cfg_.seed)
    log("warning: resuming with seed " + std::to_string(cfg_.seed) + " but the checkpoint used " +
        std::to_string(json_int(st, "seed", where)));
  return json_int(st, "global_step", where);
}

static std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& out) {
  std::vector<std::pair<int64_t, std::string>> v;
  if (!fs::is_directory(out)) return v;
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string n = e.path().filename().string();
    // Exactly "checkpoint-<digits>": never a temporary "checkpoint-N.tmp-XXXXXX" of an unfinished save.
    if (!e.is_directory() || n.rfind("checkpoint-", 0) != 0 || n.size() == 11 || n.size() > 29 ||
        n.find_first_not_of("0123456789", 11) != std::string::npos)
      continue;
    v.emplace_back(std::stoll(n.substr(11)), e.path().string());
  }
  std::sort(v.begin(), v.end());
  return v;
}

// A run killed in the middle of a save leaves its temporary "checkpoint-N.tmp-XXXXXX" directory
// (or "<output file>.tmp-XXXXXX"); never a checkpoint, removed when the next run starts here.
static void remove_unfinished_outputs(const std::string& out, const std::function<void(const std::string&)>& log) {
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return;
  static const char* const kOutputs[] = {"checkpoint-", "adapter", "train_config.yaml", "samples.json", "metrics.jsonl",
                                        "loss.svg"};
  std::vector<std::string> removed;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    bool ours = false;
    for (const char* o : kOutputs) ours = ours || n.rfind(o, 0) == 0;
    if (!ours || n.find(".tmp-") == std::string::npos) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm) removed.push_back(n);
  }
  if (removed.empty()) return;
  std::sort(removed.begin(), removed.end());
  std::string list;
  for (const auto& n : removed) list += (list.empty() ? "" : ", ") + n;
  log("removed " + std::to_string(removed.size()) + " unfinished output(s) of an interrupted run in " + out + ": " + list);
}

// Deletes a checkpoint so that a kill part-way never leaves a checkpoint-N with some files gone:
// renamed to a temporary name first (one atomic step), then deleted.
static void remove_checkpoint(const std::string& dir) {
  const std::string doomed = dir + ".tmp-rm" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(doomed, ec);
  fs::rename(dir, doomed, ec);
  fs::remove_all(ec ? dir : doomed, ec);
}

// Prints the model's greedy answers to cfg.sample_prompts under `when` ("before training", ...)
// and returns them as JSON for samples.json.
nlohmann::ordered_json Trainer::print_sample_answers(const ChatRenderFn& render, const std::string& when) {
  const auto answers = sample_answers(*lm_.model, *tokenizer_, render, cfg_.sample_prompts, cfg_.sample_max_new_tokens);
  log("sample answers " + when + ":");
  std::string text = format_sample_answers(answers);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  log(text);
  log("  (" + sample_answers_speed(answers) + ")");
  return sample_answers_json(answers);
}

// samples.json: {"before": [...], "after": [...]}; a key is left out when that block did not run.
static void write_samples_json(const std::string& out_dir, const nlohmann::ordered_json& before,
                               const nlohmann::ordered_json& after) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!before.is_null()) j["before"] = before;
  if (!after.is_null()) j["after"] = after;
  // A byte-level model can emit bytes that are not UTF-8; the answers are already lossy-decoded,
  // and `replace` keeps the writer from throwing on anything that slipped through.
  write_file_atomic(out_dir + "/samples.json", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

// The "before" answers a resumed run keeps from the samples.json of the run it continues.
static nlohmann::ordered_json earlier_before_samples(const std::string& out_dir) {
  try {
    const auto j = nlohmann::ordered_json::parse(read_text_file(out_dir + "/samples.json"));
    if (j.contains("before")) return j["before"];
  } catch (const std::exception&) {  // missing or unreadable: the resumed run has no "before"
  }
  return nlohmann::ordered_json();
}

// loss.svg from metrics.jsonl; the run's results do not depend on it, so a failure is a warning.
static void write_run_plot(const std::string& out_dir, const std::function<void(const std::string&)>& log) {
  try {
    const LossSeries s = write_loss_plot(out_dir);
    log("loss plot: " + out_dir + "/loss.svg (" + std::to_string(s.train.size()) + " train, " +
        std::to_string(s.eval.size()) + " eval points)");
  } catch (const Error& e) {
    log(std::string("warning: loss.svg not written: ") + e.what());
  }
}

void Trainer::rotate_checkpoints() {
  if (cfg_.save_total_limit <= 0) return;
  auto v = list_checkpoints(cfg_.output_dir);
  while (int64_t(v.size()) > cfg_.save_total_limit) {
    remove_checkpoint(v.front().second);
    v.erase(v.begin());
  }
}

// What one run carries from step to step of Trainer::run.
struct Trainer::Run {
  TrainData data;
  ChatRenderFn sample_render;  // sample prompts rendered as the data pipeline renders chat rows
  std::optional<DataStream> stream;
  std::vector<Batch> eval_batches;
  bool fsdp = false, zero1 = false, fsdp_nccl = false;
  int world = 1;
  int64_t micro_per_step = 1;  // the global batch: bs x ga x world rows
  int64_t total = 0, start = 0;
  std::optional<MetricsWriter> metrics;  // rank 0 writes every file; the other ranks only train
  std::optional<TensorBoardWriter> tensorboard;  // report_to: tensorboard
  std::optional<ProgressReporter> progress;
  nlohmann::ordered_json samples_before;
  TrainSummary sum;

  void write_metrics(const nlohmann::json& rec) {
    if (metrics) metrics->write(rec);
    if (tensorboard) tensorboard->record(rec);
  }
};

TrainSummary Trainer::run() {
  Run r;
  ModelSource source = prepare_data(r);
  apply_router_aux_loss(cfg_, source.config);  // router_aux_loss_coef over the model's own
  load_model(r, source);
  precompute_reference(r);
  resume(r);
  open_outputs(r);
  before_training(r);
  train_loop(r);
  return finish(r);
}

ModelSource Trainer::prepare_data(Run& r) {
  ModelSource probe = open_model_source(cfg_.model_name_or_path);
  r.data = load_train_data(cfg_, probe, [this](const std::string& l) { log(l); }, comm_);
  if (!cfg_.sample_prompts.empty()) {
    tokenizer_ = probe.tokenizer;
    if (!tokenizer_)
      fail(ErrorKind::Config, "sample_prompts", "the model has no tokenizer to encode the prompts with",
           "add the model's tokenizer.json, or remove sample_prompts");
    r.sample_render = resolve_chat_template(cfg_.chat_template, tokenizer_.get());  // raw text without a template
  }
  return probe;
}

void Trainer::load_model(Run& r, const ModelSource& source) {
  pref_ = preference_spec(cfg_);
  if (pref_ && source.config.router_aux_loss_coef > 0)  // before the reference pass and the weights
    fail(ErrorKind::Unsupported,
         router_aux_loss_coef_value(cfg_) ? std::string("router_aux_loss_coef")
                                          : source.config.name + "/config.json: key 'output_router_logits'",
         "the router's load-balancing loss beside a preference objective is not implemented",
         "set router_aux_loss_coef: 0 in the training config");
  const int64_t bs = cfg_.per_device_train_batch_size, ga = cfg_.gradient_accumulation_steps;
  const int64_t ebs = cfg_.per_device_eval_batch_size;
  // fsdp implies ZeRO-1's split of the AdamW moments; with one rank its gather is a copy.
  const EngineSpec spec = with_shapes(engine_spec(cfg_), cfg_, std::max(bs, ebs), std::min(row_tokens_cap(cfg_), r.data.longest));
  r.fsdp = spec.sharding == Sharding::Fsdp;
  r.zero1 = splits_optimizer(spec, comm_->size());
  lm_ = load_model_for_training(spec, be_, source, uint64_t(cfg_.seed), comm_);
  DecoderModel& model = *lm_.model;
  // GPU ranks with NCCL: fsdp's layer gathers go device to device (its gradients stay ZeRO-1's, over the Comm).
  r.fsdp_nccl = r.fsdp && device_reducer_ && comm_->size() > 1 && be_.device() == DeviceKind::Cuda;
  if (r.fsdp_nccl) model.set_base_device(device_reducer_);
  if (comm_->size() > 1) dp_ = std::make_unique<DataParallelStep>(model, *comm_, r.zero1, r.zero1 ? nullptr : device_reducer_);
  const int32_t pad = r.data.pad_id;
  r.stream.emplace(&r.data.train, bs, uint64_t(cfg_.seed), pad);
  r.eval_batches = make_batches(r.data.eval, ebs, pad);
  r.world = comm_->size();
  r.micro_per_step = ga * r.world;
  r.total = total_optimizer_steps(cfg_, r.stream->batches_per_epoch(), r.world);
  const int world = r.world;
  if (model.full() && world > 1)
    fail(ErrorKind::Unsupported, "finetuning_type full", "full fine-tuning over " + std::to_string(world) +
         " ranks is not implemented yet", "run it as one process, or use finetuning_type: lora");
  int64_t n_trainable = 0;
  for (auto& p : model.trainable_params()) n_trainable += p.w.numel();
  log("model: " + lm_.source + " | " + std::to_string(model.config().n_layer) + " layers, " +
      std::to_string(model.config().n_params()) + " base params, " + std::to_string(n_trainable) +
      (model.full() ? " trained (full fine-tuning, every weight)" : " trainable LoRA params") + " | backend " +
      be_.name());
  if (world > 1)
    log("dist: " + comm_->describe() + " | data parallel, global batch " + std::to_string(bs) + " x " +
        std::to_string(ga) + " x " + std::to_string(world) + " = " + std::to_string(bs * r.micro_per_step) +
        " rows per step; " +
        (r.zero1 ? "ZeRO-1 (AdamW moments split across ranks): reduce-scatter of " + std::to_string(n_trainable * 4) +
                       " bytes of fp32 LoRA gradients and all-gather of the updated weights per step"
                 : "all-reduce of " + std::to_string(n_trainable * 4) + " bytes of fp32 LoRA gradients per step" +
                       (device_reducer_ ? " (NCCL, in device memory)" : "")));
  if (r.fsdp) {  // what each rank keeps of the decoder layers' frozen base
    std::vector<double> shard(size_t(world), 0.0);
    shard[size_t(comm_->rank())] = double(model.base_shard_bytes());
    comm_->allreduce_sum(shard.data(), shard.size());
    std::string list;
    for (int q = 0; q < world; q++) list += (q ? ", " : "") + std::to_string(int64_t(shard[size_t(q)]));
    log("fsdp: the decoder layers' frozen base is " + std::to_string(model.base_blob_bytes() * model.config().n_layer) +
        " bytes; each rank holds its share of every layer (bytes per rank: " + list +
        "), all-gathered a layer ahead of use" + (r.fsdp_nccl ? " (NCCL, into the device slot)" : ""));
  }
  {
    const int64_t host = model.plan().host_bytes();
    std::string line = "memory plan: " + std::to_string(model.plan().total_bytes()) + " bytes";
    if (host > 0)
      line += " (" + std::to_string(host) + " of them in pinned host memory; " +
              std::to_string(available_host_bytes()) + " bytes available)";
    if (model.options().mlp_tile > 0)
      line += "; the MLP runs in tiles of " + std::to_string(model.options().mlp_tile) + " tokens";
    log(line);
  }
  if (world > 1) {  // what each rank's arena holds, against `qlora plan --gpus-per-node N`
    std::vector<double> per_rank(size_t(world), 0.0);
    for (const auto& [cat, bytes] : model.arena().allocated()) per_rank[size_t(comm_->rank())] += double(bytes);
    comm_->allreduce_sum(per_rank.data(), per_rank.size());
    std::string list;
    for (int q = 0; q < world; q++) list += (q ? ", " : "") + std::to_string(int64_t(per_rank[size_t(q)]));
    log("memory allocated per rank (bytes): " + list);
  }
}

namespace {

// What the reference log-probs depend on: the base model as held and every example's tokens.
std::string reference_fingerprint(const TrainConfig& c, const ExampleSet& train, const ExampleSet& eval) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  };
  const std::string gemm = gemm_dtype_name(c.gemm_dtype), base = base_storage_name(c.base_precision);
  for (const std::string* s : {&c.model_name_or_path, &base, &gemm}) mix(s->data(), s->size() + 1);
  for (const auto* set : {&train, &eval})
    for (const Example& e : *set) {
      mix(e.ids.data(), e.ids.size() * 4);
      mix(e.labels.data(), e.labels.size() * 4);
      mix(e.doc_lens.data(), e.doc_lens.size() * 4);
    }
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

}  // namespace

// precompute_ref_log_probs: each train and eval document's reference log-prob, computed once (or
// read back from output_dir/reference_logps.json when it was made for this model and data).
void Trainer::precompute_reference(Run& r) {
  if (!pref_ || !pref_->uses_reference() || !cfg_.precompute_ref_log_probs) return;
  const std::string path = cfg_.output_dir + "/reference_logps.json";
  const std::string fp = reference_fingerprint(cfg_, r.data.train, r.data.eval);
  auto count = [](const ExampleSet& v) {
    size_t n = 0;
    for (size_t i = 0; i < v.size(); i++) n += size_t(v.docs(i));
    return n;
  };
  bool loaded = false;
  if (std::error_code ec; fs::exists(path, ec)) {
    try {
      std::ifstream in(path);
      const nlohmann::json j = nlohmann::json::parse(in);
      const auto train = j.at("train").get<std::vector<double>>(), eval = j.at("eval").get<std::vector<double>>();
      if (j.at("fingerprint") != fp) {
        log("reference log-probs: " + path + " was made for other data, model or settings; computing them again");
      } else if (train.size() != count(r.data.train) || eval.size() != count(r.data.eval)) {
        log("reference log-probs: " + path + " holds " + std::to_string(train.size()) + " train and " +
            std::to_string(eval.size()) + " eval values, not " + std::to_string(count(r.data.train)) + " and " +
            std::to_string(count(r.data.eval)) + "; computing them again");
      } else {
        for (auto [set, values] : {std::pair{&r.data.train, &train}, std::pair{&r.data.eval, &eval}}) {
          size_t at = 0;
          for (size_t i = 0; i < set->size(); i++) {
            const size_t n = size_t(set->docs(i));
            set->set_ref_logps(i, std::vector<double>(values->begin() + std::ptrdiff_t(at), values->begin() + std::ptrdiff_t(at + n)));
            at += n;
          }
        }
        loaded = true;
        log("reference log-probs: read " + std::to_string(train.size() + eval.size()) + " from " + path);
      }
    } catch (const std::exception& e) {  // unreadable or from another version: computed again below
      log("reference log-probs: cannot read " + path + " (" + e.what() + "); computing them again");
    }
  }
  if (comm_->size() > 1) {  // computing is collective: all ranks read the file, or all compute
    double read = loaded ? 1.0 : 0.0;
    comm_->allreduce_sum(&read, 1);
    if (loaded && read < double(comm_->size()))
      log("reference log-probs: not every rank could read " + path + "; computing them again on every rank");
    loaded = read == double(comm_->size());
  }
  if (!loaded) {
    DecoderModel& model = *lm_.model;
    const auto t0 = std::chrono::steady_clock::now();
    Comm* comm = comm_->size() > 1 ? comm_ : nullptr;
    const int64_t bs = std::max(cfg_.per_device_train_batch_size, cfg_.per_device_eval_batch_size);
    const auto report = [&](int64_t done, int64_t total) {
      if (lead_ && (done == total || done % 50 == 0))
        std::fprintf(stderr, "reference log-probs: batch %lld/%lld\n", (long long)done, (long long)total);
    };
    precompute_reference_logps(model, *pref_, r.data.train, bs, r.data.pad_id, comm, report);
    if (!r.data.eval.empty()) precompute_reference_logps(model, *pref_, r.data.eval, bs, r.data.pad_id, comm, report);
    nlohmann::json j = {{"fingerprint", fp}, {"model", cfg_.model_name_or_path}, {"train", nlohmann::json::array()},
                        {"eval", nlohmann::json::array()}};
    for (const Example& e : r.data.train)
      for (double v : e.ref_logps) j["train"].push_back(v);
    for (const Example& e : r.data.eval)
      for (double v : e.ref_logps) j["eval"].push_back(v);
    if (lead_) {
      fs::create_directories(cfg_.output_dir);
      write_file_atomic(path, j.dump() + "\n");
    }
    log("reference log-probs: computed " + std::to_string(count(r.data.train) + count(r.data.eval)) + " in " +
        format_duration(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) + ", kept in " + path);
  }
  // The eval batches were built before: again, now with the values.
  r.eval_batches = make_batches(r.data.eval, cfg_.per_device_eval_batch_size, r.data.pad_id);
}

void Trainer::resume(Run& r) {
  if (lead_) remove_unfinished_outputs(cfg_.output_dir, [this](const std::string& l) { log(l); });
  std::string from = cfg_.resume_from_checkpoint;
  if (from == "latest" || from == "true") {
    auto v = list_checkpoints(cfg_.output_dir);
    if (v.empty()) fail(ErrorKind::Config, "resume_from_checkpoint", "no checkpoint-N directory in " + cfg_.output_dir);
    from = v.back().second;
  }
  if (!from.empty()) {
    r.start = restore_checkpoint(from, *r.stream);
    log("resumed from " + from + " at step " + std::to_string(r.start));
  }
}

void Trainer::open_outputs(Run& r) {
  if (lead_) {
    fs::create_directories(cfg_.output_dir);
    write_file_atomic(cfg_.output_dir + "/train_config.yaml", dump_train_config(cfg_));
    // A resumed run keeps the records through its checkpoint's step; a fresh run starts the file anew
    // (keeping "step 0" would leave an earlier run's step-0 eval beside this one's).
    if (std::error_code ec; r.start == 0) fs::remove(cfg_.output_dir + "/metrics.jsonl", ec);
    r.metrics.emplace(cfg_.output_dir, r.start);
    if (reports_to_tensorboard(cfg_)) {
      std::string dir = cfg_.logging_dir;
      if (dir.empty()) {  // transformers: runs/<%b%d_%H-%M-%S>_<host>
        char stamp[64] = "", host[256] = "localhost";
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        std::strftime(stamp, sizeof stamp, "%b%d_%H-%M-%S", &tm);
        gethostname(host, sizeof host - 1);
        dir = cfg_.output_dir + "/runs/" + stamp + "_" + host;
      }
      r.tensorboard.emplace(dir);
      log("tensorboard: " + r.tensorboard->path() + " (tensorboard --logdir " + dir + ")");
    }
  }
  r.progress.emplace(r.total, cfg_.logging_steps, stderr, lead_ ? -1 : 0);
  r.progress->set_ranks(r.world);
  r.sum.total_steps = r.total;
}

// eval_loss, and for preference objectives eval_<metric> as TRL names them, into rec.
double Trainer::eval_into(Run& r, nlohmann::json& rec) {
  if (!pref_) {
    const double el = evaluate(r.eval_batches);
    rec["eval_loss"] = el;
    return el;
  }
  const PrefEvalTotals t = evaluate_preference_batches(r.eval_batches);
  rec["eval_loss"] = t.loss;
  for (const auto& [k, v] : t.metrics.means()) rec["eval_" + k] = v;
  return t.loss;
}

void Trainer::before_training(Run& r) {
  if ((lead_ || r.world > 1) && r.start == 0 && !r.eval_batches.empty() && cfg_.eval_strategy != EvalStrategy::No) {  // the baseline
    nlohmann::json rec = {{"step", 0}};
    const double el = eval_into(r, rec);
    r.write_metrics(rec);
    log("eval_loss " + std::to_string(el) + " before training");
  }
  // Sample answers before training (a resumed run keeps the first run's from samples.json).
  // fsdp: every rank decodes (each forward gathers layers with the others); rank 0 prints and writes.
  if ((lead_ || r.fsdp) && !cfg_.sample_prompts.empty()) {
    if (r.start == 0) {
      r.samples_before = print_sample_answers(r.sample_render, "before training");
      if (lead_) write_samples_json(cfg_.output_dir, r.samples_before, nullptr);
    } else {
      r.samples_before = earlier_before_samples(cfg_.output_dir);
    }
  }
}

namespace {

constexpr int64_t kMaxConsecutiveSkips = 10;  // nan_policy: skip gives up after this many in a row

}  // namespace

void Trainer::progress_message(Run& r, const std::string& line) {
  if (lead_) r.progress->message(line);
}

// One optimizer step over the global step's micro-batches mbs (on every rank); a preference
// objective adds this rank's micro-batches' metrics to *pref_metrics.
StepResult Trainer::run_step(Run& r, const std::vector<Batch>& mbs, const OptimHyper& hyper, double lr, int64_t step,
                             bool* stop_agreed, PrefMetricMeans* pref_metrics) {
  DecoderModel& model = *lm_.model;
  const MicroStepFn micro =
      pref_ ? preference_micro_step(model, *pref_, r.micro_per_step, pref_metrics) : MicroStepFn{};
  model.reset_routed_tokens();  // mixture of experts: this step's routing (router_metrics)
  return dp_ ? dp_->run(mbs, hyper, lr, step, uint64_t(cfg_.seed), g_stop_requested.load(), stop_agreed, micro)
             : train_step(model, mbs, hyper, lr, step, uint64_t(cfg_.seed), micro);
}

// The step's preference metrics and (mixture of experts) router metrics, over every rank.
std::map<std::string, double> Trainer::reduced_step_metrics(Run& r, const PrefMetricMeans& pref_metrics) {
  DecoderModel& model = *lm_.model;
  const int world = r.world;
  std::map<std::string, double> step_metrics;
  if (pref_) {
    std::vector<double> v = pref_metrics.flat();
    if (world > 1) comm_->allreduce_sum(v.data(), v.size());
    step_metrics = PrefMetricMeans::from_flat(v).means();
  }
  if (model.config().moe()) {  // the tokens each expert received, over every rank's micro-batches
    std::vector<double> routed(model.routed_tokens().begin(), model.routed_tokens().end());
    if (world > 1) comm_->allreduce_sum(routed.data(), routed.size());
    for (const auto& [k, v] : router_metrics(routed, model.config().n_layer, model.config().n_experts))
      step_metrics[k] = v;
    // The micro-batches' mean load-balancing loss (in `loss` times the coefficient).
    if (model.config().router_aux_loss_coef > 0) {
      double aux[2] = {model.aux_losses().first, double(model.aux_losses().second)};
      if (world > 1) comm_->allreduce_sum(aux, 2);
      if (aux[1] > 0) step_metrics["router/aux_loss"] = aux[0] / aux[1];
    }
  }
  return step_metrics;
}

// A step whose loss or gradient norm is not finite: under nan_policy skip (up to
// kMaxConsecutiveSkips in a row) it is recorded as skipped and this returns; otherwise the last
// good state is saved as a checkpoint when it can be, and this fails.
void Trainer::skip_non_finite_step(Run& r, int64_t step, double loss, double gnorm, int64_t& consecutive_skips) {
  DecoderModel& model = *lm_.model;
  // train_step left the weights and moments untouched: the state is the last good one.
  const std::string culprit = first_non_finite(model, loss);
  const std::string what = "loss " + std::to_string(loss) + ", grad norm " + std::to_string(gnorm) +
                           (culprit.empty() ? std::string() : "; first non-finite: " + culprit);
  if (cfg_.nan_policy == NanPolicy::Skip && ++consecutive_skips <= kMaxConsecutiveSkips) {
    r.sum.skipped_steps++;
    progress_message(r, "step " + std::to_string(step + 1) + " skipped (" + what + ")");
    r.write_metrics({{"step", step + 1}, {"skipped", true}, {"loss", nullptr}, {"grad_norm", nullptr},
                     {"reason", culprit.empty() ? "grad norm overflow" : culprit}});
    return;
  }
  std::string hint = "lower learning_rate or set max_grad_norm";
  // Every rank sees the same reduced loss and norm, so all of them come here together.
  if (step > r.start && state_finite_everywhere()) {
    save_checkpoint(cfg_.output_dir + "/checkpoint-" + std::to_string(step), step, *r.stream);
    hint += "; the last good state was saved as checkpoint-" + std::to_string(step);
  }
  if (cfg_.nan_policy == NanPolicy::Skip)
    hint += "; " + std::to_string(kMaxConsecutiveSkips) + " steps in a row were skipped";
  if (lead_) write_run_plot(cfg_.output_dir, [this](const std::string& l) { log(l); });
  comm_->barrier();  // no rank ends the job before rank 0 has saved
  fail(ErrorKind::Data, "step " + std::to_string(step + 1), "loss or gradient is not finite (" + what + ")", hint);
}

// The progress line of step `done` (rank 0).
void Trainer::report_step(Run& r, int64_t done, const StepResult& res, double lr, double dt,
                          const std::map<std::string, double>& step_metrics) {
  if (!lead_) return;
  StepReport rep{done, res.loss, lr, double(res.tokens) / dt, dt, {}};
  if (auto it = step_metrics.find("rewards/accuracies"); it != step_metrics.end()) rep.extra = {{"acc", it->second}};
  if (auto it = step_metrics.find("rewards/margins"); it != step_metrics.end())
    rep.extra.push_back({"margin", it->second});
  r.progress->update(rep);
}

// Step `done`'s metrics record when it is a logging step (every logging_steps, and the last), else null.
nlohmann::json Trainer::step_record(Run& r, int64_t done, const StepResult& res, double lr, double dt, int64_t gathered,
                                    const std::map<std::string, double>& step_metrics) {
  nlohmann::json rec;
  const DataStream& stream = *r.stream;
  bool log_now = done % std::max<int64_t>(1, cfg_.logging_steps) == 0 || done == r.total;
  if (log_now) {
    const double n_train = double(std::max<int64_t>(1, int64_t(r.data.train.size())));
    rec = {{"step", done}, {"loss", res.loss}, {"learning_rate", lr}, {"grad_norm", res.grad_norm},
           {"tokens_per_second", double(res.tokens) / dt}, {"step_seconds", dt}, {"trained_tokens", res.trained_tokens},
           {"epoch", double(stream.epoch()) + double(stream.index()) / n_train}};
    if (r.fsdp) rec["fsdp_allgather_bytes"] = gathered;
    for (const auto& [k, v] : step_metrics) rec[k] = v;
  }
  return rec;
}

// After step `done`: the eval when one is due (its results into rec), rec into the metrics, and the
// checkpoint every save_steps.
void Trainer::eval_and_save(Run& r, int64_t done, bool ends_epoch, nlohmann::json& rec) {
  const bool due = cfg_.eval_strategy == EvalStrategy::Epoch ? ends_epoch
                                                             : cfg_.eval_steps > 0 && done % cfg_.eval_steps == 0;
  const bool eval_now = (lead_ || r.world > 1) && !r.eval_batches.empty() && cfg_.eval_strategy != EvalStrategy::No &&
                        (due || done == r.total);
  if (eval_now) {
    rec["step"] = done;
    const double el = eval_into(r, rec);
    r.sum.eval_loss = el;
    progress_message(r, "eval_loss " + std::to_string(el) + " at step " + std::to_string(done));
  }
  if (!rec.is_null()) r.write_metrics(rec);
  if (cfg_.save_steps > 0 && done % cfg_.save_steps == 0 && done < r.total) {
    save_checkpoint(cfg_.output_dir + "/checkpoint-" + std::to_string(done), done, *r.stream);
    if (lead_) rotate_checkpoints();
  }
}

void Trainer::train_loop(Run& r) {
  using clock = std::chrono::steady_clock;
  DecoderModel& model = *lm_.model;
  DataStream& stream = *r.stream;
  const int64_t total = r.total, start = r.start;
  const int world = r.world;
  bool stop_agreed = false;  // multi-rank: some rank was asked to stop, as of the last step's all-reduce
  ScheduleParams sp = schedule_from_config(cfg_, total);
  OptimHyper hyper{cfg_.adam_beta1, cfg_.adam_beta2, cfg_.adam_epsilon, cfg_.weight_decay, cfg_.max_grad_norm};
  install_stop_signal_handlers();
  int64_t consecutive_skips = 0;
  int64_t step = start;
  for (; step < total; step++) {
    // One process stops as soon as it is asked; ranks stop together, after the step whose
    // all-reduce carried the request (a signal reaches one rank, or all at different moments).
    if (world == 1 ? g_stop_requested.load() : stop_agreed) break;
    const auto t0 = clock::now();
    std::vector<Batch> mbs;  // the whole global step, on every rank
    const int64_t epochs_before = stream.completed_epochs();
    for (int64_t j = 0; j < r.micro_per_step; j++) mbs.push_back(stream.next());
    const bool ends_epoch = stream.completed_epochs() > epochs_before;  // eval_strategy: epoch
    const double lr = lr_at(sp, step);
    const int64_t gathered0 = model.gathered_base_bytes();
    PrefMetricMeans pref_metrics;  // this rank's micro-batches' metrics (preference objectives)
    const StepResult res = run_step(r, mbs, hyper, lr, step, &stop_agreed, &pref_metrics);
    const std::map<std::string, double> step_metrics = reduced_step_metrics(r, pref_metrics);
    if (!std::isfinite(res.grad_norm) || !std::isfinite(res.loss)) {
      skip_non_finite_step(r, step, res.loss, res.grad_norm, consecutive_skips);  // fails unless skipped
      continue;
    }
    consecutive_skips = 0;
    const int64_t gathered = model.gathered_base_bytes() - gathered0;  // fsdp: this step's all-gathers
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    const int64_t done = step + 1;
    r.sum.last_loss = res.loss;
    report_step(r, done, res, lr, dt, step_metrics);
    nlohmann::json rec = step_record(r, done, res, lr, dt, gathered, step_metrics);
    if (r.fsdp && done == start + 2)  // the first step after one in steady state (the first gathers every layer)
      progress_message(r, "fsdp: step " + std::to_string(done) + " all-gathered " + std::to_string(gathered) +
                              " bytes of base layers");
    eval_and_save(r, done, ends_epoch, rec);
  }
  r.progress->finish();
  r.sum.steps_done = step;
}

TrainSummary Trainer::finish(Run& r) {
  DecoderModel& model = *lm_.model;
  TrainSummary& sum = r.sum;
  const int64_t step = sum.steps_done;
  if (step < r.total) {  // stopped by a signal: leave a resumable checkpoint
    sum.interrupted = true;
    const std::string dir = cfg_.output_dir + "/checkpoint-" + std::to_string(step);
    save_checkpoint(dir, step, *r.stream);
    if (lead_) {
      log("stopped at step " + std::to_string(step) + (r.world > 1 ? " on all " + std::to_string(r.world) + " ranks" : "") +
          "; resume with resume_from_checkpoint=" + dir);
      write_run_plot(cfg_.output_dir, [this](const std::string& l) { log(l); });
    }
    comm_->barrier();  // every rank exits after the checkpoint exists
    return sum;
  }
  nlohmann::ordered_json samples_after;
  if ((lead_ || r.fsdp) && !cfg_.sample_prompts.empty()) samples_after = print_sample_answers(r.sample_render, "after training");
  if (!lead_) {
    sum.adapter_dir = cfg_.output_dir;
    comm_->barrier();  // rank 0 writes the adapter
    return sum;
  }
  if (model.full()) {  // a Hugging Face model directory at the top of output_dir, as HF Trainer's save_model
    for (const std::string& note : write_trained_model(cfg_.output_dir, model, cfg_.model_name_or_path))
      log("note: " + note);
  } else {
    AtomicDir d(cfg_.output_dir + "/adapter");
    write_peft_adapter(d.temp_path(), model, cfg_.model_name_or_path);
    d.commit();
    // PEFT also accepts the adapter at the top of output_dir.
    write_peft_adapter(cfg_.output_dir, model, cfg_.model_name_or_path);
  }
  sum.adapter_dir = cfg_.output_dir;
  if (!cfg_.sample_prompts.empty())
    write_samples_json(cfg_.output_dir, r.samples_before, samples_after);
  write_run_plot(cfg_.output_dir, [this](const std::string& l) { log(l); });
  log("done: " + std::to_string(step) + " steps" +
      (sum.skipped_steps ? " (" + std::to_string(sum.skipped_steps) + " skipped: not finite)" : "") + ", loss " +
      std::to_string(sum.last_loss) +
      (sum.eval_loss >= 0 ? ", eval_loss " + std::to_string(sum.eval_loss) : "") +
      (model.full() ? "; model in " : "; adapter in ") + cfg_.output_dir);
  comm_->barrier();
  return sum;
}

}  // namespace qlora
