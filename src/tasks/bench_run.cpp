// The synthetic training benchmark: random weights of a real shape, random tokens, the trainer's
// own step (train/step.h), timed; FLOPs, MFU and planned memory come from src/plan.
#include "tasks/bench_run.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/rng.h"
#include "core/strings.h"
#include "io/json_util.h"
#include "model/lora.h"
#include "plan/model_presets.h"
#include "plan/plan_request.h"
#include "plan/cpu_device.h"
#include "plan/planner.h"
#include "train/step.h"

namespace qlora {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void require(bool ok, const std::string& option, int64_t v, const char* what) {
  if (!ok) fail(ErrorKind::Config, option + " " + std::to_string(v), what);
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull);
  x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}

uint64_t name_hash(const std::string& s) {  // FNV-1a: a tensor's values depend on its name, not on load order
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// n values of std `std` with an approximately normal shape: the sum of four 16-bit uniforms
// (Irwin-Hall, variance 4/12) from one 64-bit draw, rescaled. Blocks are seeded by their index so
// the values do not depend on the thread count; one draw per value keeps a 1B model at seconds.
void fill_normalish(float* dst, int64_t n, float std, uint64_t seed) {
  constexpr int64_t kBlock = 1 << 14;
  const float k = std * std::sqrt(3.0f) / 65536.0f;  // sqrt(12/4) * std, per 16-bit unit
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    Rng rng(mix(seed, uint64_t(b)));
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; i++) {
      const uint64_t u = rng.next_u64();
      // Each 16-bit part is uniform on 0..65535 (mean 32767.5, std 65536/sqrt(12)): the sum of
      // four has mean 131070 and std 65536/sqrt(3).
      const int64_t sum = int64_t(u & 0xffff) + int64_t((u >> 16) & 0xffff) + int64_t((u >> 32) & 0xffff) + int64_t(u >> 48);
      dst[i] = float(sum - 131070) * k;
    }
  }
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Rows of uniform random token ids; every position is trained on the next id (one document per row).
Batch random_batch(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  Batch x;
  x.b = b;
  x.t = t;
  x.tokens.resize(size_t(b * t));
  x.targets.resize(size_t(b * t));
  x.positions.resize(size_t(b * t));
  std::vector<int32_t> row(size_t(t + 1));
  for (int64_t i = 0; i < b; i++) {
    for (auto& id : row) id = int32_t(rng.below(uint64_t(vocab)));
    for (int64_t j = 0; j < t; j++) {
      x.tokens[size_t(i * t + j)] = row[size_t(j)];
      x.targets[size_t(i * t + j)] = row[size_t(j + 1)];
      x.positions[size_t(i * t + j)] = int32_t(j);
    }
  }
  return x;
}

// PEFT starts B at zero, which would leave the LoRA path's output (and dA) zero: give B small
// random values so every LoRA matmul does real work.
void randomize_lora_b(DecoderModel& m, uint64_t seed) {
  std::vector<float> host;
  for (auto& p : m.trainable_params()) {
    if (!ends_with(p.name, "lora_B")) continue;
    host.resize(size_t(p.w.numel()));
    fill_normalish(host.data(), p.w.numel(), 0.02f, mix(seed, name_hash(p.name)));
    m.backend().copy_to_device(p.w.data, host.data(), host.size() * 4);
  }
}

int64_t host_peak_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;  // Linux reports KiB
}

// "all-linear" for the seven projections, else the comma list.
std::string targets_text(const std::vector<std::string>& targets) {
  if (targets.size() == all_linear_targets().size()) return "all-linear";
  std::string s;
  for (const auto& t : targets) s += (s.empty() ? "" : ",") + t;
  return s;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

BenchOptions normalize_bench_options(const BenchOptions& in, DType compute) {
  BenchOptions o = in;
  if (o.model.empty())
    fail(ErrorKind::Config, "--model", "no model given", "add --model smollm2-135m (a preset), a model directory or a .gguf file");
  if (o.method == Method::Full)
    fail(ErrorKind::Unsupported, "--method full", "a full fine-tuning benchmark is not implemented yet (qlora train trains it on the cpu)",
         "bench lora or qlora");
  if (o.base_precision == BasePrecision::Fp16)
    fail(ErrorKind::Unsupported, "--base-precision fp16",
         "the engine keeps a float base in fp32 (CPU) or bf16 (CUDA); an fp16 base is planned by qlora plan but not run",
         "use --base-precision bf16 (CUDA) or fp32 (CPU), or a quantized format");
  if (o.base_precision == BasePrecision::Bf16 && compute == DType::F32)
    fail(ErrorKind::Unsupported, "--base-precision bf16", "the CPU backend computes in fp32 and keeps a float base in fp32",
         "use --base-precision fp32 (or a quantized format) on the CPU, or --device cuda");
  static_cast<EngineSpec&>(o) = normalize_engine_spec(o, compute);
  require(o.lora.r >= 1, "--r", o.lora.r, "the LoRA rank must be at least 1");
  if (!(o.lora.alpha > 0)) fail(ErrorKind::Config, "--lora-alpha", "must be positive");
  require(o.seq_len >= 1, "--seq-len", o.seq_len, "must be at least 1");
  require(o.micro_batch >= 1, "--micro-batch", o.micro_batch, "must be at least 1");
  require(o.steps >= 1, "--steps", o.steps, "must be at least 1 (timed steps)");
  require(o.warmup_steps >= 0, "--warmup-steps", o.warmup_steps, "must not be negative");
  o.lora.targets = LoraSpec::resolve_targets(o.lora.targets);  // throws on a name that is no projection
  return o;
}

FlopCounts bench_flop_counts(const LlamaConfig& c, const BenchOptions& o) {
  FlopOptions f;
  f.method = o.method;
  f.lora_r = o.lora.r;
  f.targets = o.lora.targets;
  f.expert_targets = o.lora.expert_targets;
  f.attn_len = o.seq_len;  // one random document fills each row
  f.recompute = recomputes(o.checkpointing);
  return flops_per_token(c, f);
}

TensorSource random_tensor_source(uint64_t seed) {
  TensorSource s;
  s.description = "random weights (seed " + std::to_string(seed) + ")";
  s.has = [](const std::string&) { return true; };
  s.read_f32 = [seed](const std::string& name, const std::vector<int64_t>& shape, float* dst) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (ends_with(name, "norm.weight")) {  // RMSNorm gains start at 1, as in transformers
      std::fill(dst, dst + n, 1.0f);
    } else if (ends_with(name, ".bias")) {
      std::fill(dst, dst + n, 0.0f);
    } else {
      fill_normalish(dst, n, 0.02f, mix(seed, name_hash(name)));
    }
  };
  return s;
}

namespace {

using ProgressFn = std::function<void(const std::string&)>;

void say(const ProgressFn& progress, const std::string& s) {
  if (progress) progress(s);
}

// Random base weights of the model's shape and random LoRA weights, B included.
void load_random_weights(DecoderModel& model, uint64_t seed) {
  model.load_base(random_tensor_source(seed));  // quantized on load for a quantized base
  model.init_trainable(seed);
  randomize_lora_b(model, seed);
}

// Sums over the timed (not warmup) steps, and the most device memory in use after any step.
struct StepTotals {
  double step_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0;
  int64_t dequant_layers = 0;
  int64_t peak_used = 0;
};

// The warmup and timed steps, each on a fresh random batch; the first and last loss into res.
StepTotals run_steps(DecoderModel& model, Backend& be, const BenchDevice& dev, const LlamaConfig& cfg,
                     BenchResult& res, const ProgressFn& progress) {
  const BenchOptions& o = res.opts;
  StepTotals tot;
  tot.peak_used = dev.used_bytes ? dev.used_bytes() : 0;
  OptimHyper h;  // the trainer's defaults: betas (0.9, 0.999), eps 1e-8, no weight decay, clip at 1.0
  StepTimes times;
  model.set_step_times(&times);
  const int64_t total = o.warmup_steps + o.steps;
  for (int64_t s = 0; s < total; s++) {
    const std::vector<Batch> mbs = {random_batch(o.micro_batch, o.seq_len, cfg.vocab_size, mix(o.seed, uint64_t(s)))};
    times = {};
    be.synchronize();
    const double t0 = now_s();
    const int64_t dq0 = model.dequantized_layers();
    StepResult r = accumulate_grads(model, mbs, s, o.seed);
    be.synchronize();
    const double t1 = now_s();
    apply_optimizer(model, h, o.learning_rate, s, r);  // exactly the trainer's clip + AdamW
    be.synchronize();
    const double t2 = now_s();
    if (dev.used_bytes) tot.peak_used = std::max(tot.peak_used, dev.used_bytes());
    if (s == 0) res.loss_first = r.loss;
    res.loss_last = r.loss;
    const bool warm = s < o.warmup_steps;
    if (!warm) {
      tot.step_s += t2 - t0;
      tot.forward_s += times.forward_s;
      tot.backward_s += times.backward_s;
      tot.optimizer_s += t2 - t1;
      tot.dequant_layers += model.dequantized_layers() - dq0;
    }
    say(progress, "step " + std::to_string(s + 1) + "/" + std::to_string(total) + (warm ? " (warmup)" : "") +
                      " | loss " + fmt("%.4f", r.loss) + " | " + fmt("%.3f", t2 - t0) + " s (fwd " +
                      fmt("%.3f", times.forward_s) + ", bwd " + fmt("%.3f", times.backward_s) + ", opt " +
                      fmt("%.3f", t2 - t1) + ")");
  }
  model.set_step_times(nullptr);
  return tot;
}

// One layer of the quantized base: stored bytes + the dequantized copy (0 for a float base).
double quantized_layer_bytes(const DecoderModel& model, const LlamaConfig& cfg, const Backend& be) {
  double layer_bytes = 0;
  if (model.quantized_base())
    for (const auto& proj : all_linear_targets()) {
      const auto [out, in] = projection_shape(cfg, proj);
      layer_bytes += double(model.plan().find("layers.0." + proj)->bytes) + double(out * in * dtype_size(be.compute_dtype()));
    }
  return layer_bytes;
}

// Per-step means, throughput, FLOPs and (on a catalogued GPU) MFU.
void record_speed(BenchResult& res, const StepTotals& tot, double layer_bytes, const LlamaConfig& cfg,
                  const BenchDevice& dev, bool cuda) {
  const BenchOptions& o = res.opts;
  const double n = double(o.steps);
  res.dequant_layers_per_step = double(tot.dequant_layers) / n;
  res.dequant_bytes_per_step = res.dequant_layers_per_step * layer_bytes;
  res.step_mean_s = tot.step_s / n;
  res.forward_s = tot.forward_s / n;
  res.backward_s = tot.backward_s / n;
  res.optimizer_s = tot.optimizer_s / n;
  res.tokens_per_second = double(o.micro_batch * o.seq_len) / res.step_mean_s;
  // As the planner's speed model: the step's counted FLOPs include recompute, MFU counts model
  // FLOPs only (forward + backward), so checkpointing lowers MFU but not achieved_flops.
  const FlopCounts fc = bench_flop_counts(cfg, o);
  res.flops_per_token = fc.total();
  res.achieved_flops = res.tokens_per_second * res.flops_per_token;
  if (!cuda) {
    res.peak_flops_note = "no catalogued peak for CPU";
  } else if (!dev.gpu) {
    res.peak_flops_note = "no catalog entry for '" + dev.name + "' (see qlora plan --list-gpus)";
  } else {
    // All GEMMs run in bf16 (a quantized base is dequantized to bf16 first): the bf16 dense peak.
    res.peak_flops = dev.gpu->peak_tflops(GemmDtype::Bf16) * 1e12;
    res.mfu = res.tokens_per_second * fc.model() / *res.peak_flops;
  }
}

// The measured peak (device memory, else the host's peak RSS) and the planned one.
void record_memory(BenchResult& res, int64_t peak_used, const DecoderModel& model, const LlamaConfig& cfg,
                   const BenchDevice& dev, bool cuda) {
  if (dev.used_bytes) {
    res.peak_memory_bytes = peak_used;
    res.peak_memory_kind = "device";
  } else {
    res.peak_memory_bytes = host_peak_rss();
    res.peak_memory_kind = "host_rss";
  }
  res.planned_arena_bytes = model.plan().total_bytes();
  res.planned_peak_memory_bytes = res.planned_arena_bytes;
  if (cuda) {  // the planner's estimated library overhead (CUDA context, cuBLASLt, fragmentation, reserve)
    PlanRequest req;
    req.model = cfg;
    if (dev.gpu) req.gpu = *dev.gpu;
    if (!dev.gpu && dev.mem_bytes > 0) req.gpu.mem_bytes = dev.mem_bytes;
    for (const auto& [name, bytes] : overhead_lines(req, res.planned_arena_bytes)) res.planned_peak_memory_bytes += bytes;
  }
}

// What `qlora plan` predicts for this very step.
void record_plan_prediction(BenchResult& res, const DecoderModel& model, const LlamaConfig& cfg, const BenchDevice& dev,
                            bool cuda, double layer_bytes) {
  const BenchOptions& o = res.opts;
  const std::optional<CpuCalibration> cal = cuda ? std::nullopt : std::optional(cpu_calibration());
  if (!cuda || dev.gpu) {
    PlanRequest req;
    static_cast<EngineSpec&>(req) = o;
    req.model = cfg;
    req.gpu = cuda ? *dev.gpu : cpu_device_spec(*cal);
    req.packing = true;
    req.avg_doc_len = 0;
    const PlanResult plan = make_plan(req);
    res.planned_step_time_s = plan.speed.step_time_s;
    res.planned_step_error = plan.speed.step_time_s / res.step_mean_s - 1.0;
    res.planned_device = req.gpu.display;
    if (cuda) {
      res.planned_dequant_bytes_per_step = 0.0;
      for (const auto& [what, bytes] : plan.speed.memory_bytes)
        if (what == "base weight dequant/cast") res.planned_dequant_bytes_per_step = bytes;
    } else if (model.quantized_base()) {  // the CPU term counts elements at a calibrated rate
      res.planned_dequant_bytes_per_step = double(dequant_layers_per_micro_step(cfg.n_layer, o.gemm_dtype)) * layer_bytes;
    }
    res.planned_parts = {{"gemm_s", plan.speed.t_gemm}, {"attention_s", plan.speed.t_attn},
                         {"dequant_side_stream_s", plan.speed.t_dequant}, {"dequant_exposed_s", plan.speed.t_dequant_exposed},
                         {"memory_and_elementwise_s", plan.speed.t_memory}, {"source", req.gpu.source}};
  }
  if (cal)
    res.host = {{"cpu_model", cal->cpu_model}, {"threads", cal->threads}, {"simd", cal->simd}, {"blas", cal->blas},
                {"calibrated_sgemm_flops", cal->gemm_flops}};
}

}  // namespace

BenchResult run_bench(const BenchOptions& in, Backend& be, const BenchDevice& dev,
                      const std::function<void(const std::string&)>& progress) {
  const bool cuda = be.device() == DeviceKind::Cuda;
  BenchResult res;
  res.opts = normalize_bench_options(in, be.compute_dtype());
  const BenchOptions& o = res.opts;
  res.device = dev.name;
  if (const char* sha = std::getenv("QLORA_GIT_SHA"); sha && *sha) res.git_sha = sha;

  const LlamaConfig cfg = resolve_model(o.model);  // a path contributes its config only
  const double t_load = now_s();
  // The model resolves the GEMM dtype against the base and the device.
  ModelPlanOptions po = resolve_engine(o, {be.compute_dtype()});
  fit_to_budget(o, cfg, po, be.device(), be.memory_available());  // as training chooses
  DecoderModel model(cfg, be, po, o.lora);
  load_random_weights(model, o.seed);
  be.synchronize();
  res.load_s = now_s() - t_load;
  res.base_params = cfg.n_params();
  for (const auto& p : model.trainable_params()) res.trainable_params += p.w.numel();
  say(progress, "bench: " + o.model + " (" + std::to_string(cfg.n_layer) + " layers, " +
                    std::to_string(res.base_params) + " base params, " + std::to_string(res.trainable_params) +
                    " LoRA params, " + base_precision_name(*o.base_precision) + " base) on " + dev.name +
                    ": random weights ready in " + fmt("%.2f", res.load_s) + " s");

  const StepTotals tot = run_steps(model, be, dev, cfg, res, progress);
  const double layer_bytes = quantized_layer_bytes(model, cfg, be);
  record_speed(res, tot, layer_bytes, cfg, dev, cuda);
  record_memory(res, tot.peak_used, model, cfg, dev, cuda);
  record_plan_prediction(res, model, cfg, dev, cuda, layer_bytes);
  return res;
}

nlohmann::ordered_json bench_json(const BenchResult& r) {
  using J = nlohmann::ordered_json;
  auto opt = [](const std::optional<double>& v) { return v ? J(*v) : J(nullptr); };
  const BenchOptions& o = r.opts;
  J j;
  j["tool"] = "qlora.cpp";
  j["git_sha"] = r.git_sha ? J(*r.git_sha) : J(nullptr);
  j["device"] = r.device;
  j["model"] = o.model;
  j["config"] = {{"method", method_name(o.method)},
                 {"base_precision", base_precision_name(*o.base_precision)},
                 {"double_quant", o.double_quant.value_or(false)},
                 {"r", o.lora.r},
                 {"lora_alpha", o.lora.alpha},
                 {"target_modules", targets_text(o.lora.targets)},
                 {"target_parameters", peft_target_parameters(o.lora)},
                 {"seq_len", o.seq_len},
                 {"micro_batch", o.micro_batch},
                 {"gradient_checkpointing", checkpointing_name(o.checkpointing)},
                 {"gemm_dtype", gemm_dtype_name(o.gemm_dtype)},
                 {"steps", o.steps},
                 {"warmup_steps", o.warmup_steps},
                 {"seed", o.seed}};
  j["tokens_per_second"] = r.tokens_per_second;
  j["step_time_s"] = {{"mean", r.step_mean_s}, {"forward", r.forward_s}, {"backward", r.backward_s}, {"optimizer", r.optimizer_s}};
  j["flops_per_token"] = r.flops_per_token;
  j["achieved_flops"] = r.achieved_flops;
  j["peak_flops"] = opt(r.peak_flops);
  j["mfu"] = opt(r.mfu);
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["peak_memory_kind"] = r.peak_memory_kind;
  j["planned_peak_memory_bytes"] = r.planned_peak_memory_bytes;
  j["planned_arena_bytes"] = r.planned_arena_bytes;
  j["loss_first"] = r.loss_first;
  j["loss_last"] = r.loss_last;
  j["trainable_params"] = r.trainable_params;
  j["base_params"] = r.base_params;
  j["planned_step_time_s"] = opt(r.planned_step_time_s);
  j["planned_step_error"] = opt(r.planned_step_error);
  j["planned_device"] = r.planned_device.empty() ? J(nullptr) : J(r.planned_device);
  j["planned_parts"] = r.planned_parts.is_null() ? J(nullptr) : r.planned_parts;
  j["data_movement"] = {{"dequant_layers_per_step", r.dequant_layers_per_step},
                        {"dequant_bytes_per_step", r.dequant_bytes_per_step},
                        {"planned_dequant_bytes_per_step", opt(r.planned_dequant_bytes_per_step)}};
  if (!r.host.is_null()) {
    j["host"] = r.host;
    j["achieved_fraction_of_sgemm"] = r.achieved_flops / r.host["calibrated_sgemm_flops"].get<double>();
  }
  return j;
}

std::string bench_text(const BenchResult& r) {
  const BenchOptions& o = r.opts;
  const double gib = double(int64_t(1) << 30);
  std::string s;
  s += "model      " + o.model + " | " + method_name(o.method) + ", " + base_precision_name(*o.base_precision) + " base" +
       (o.double_quant.value_or(false) ? " (double quant)" : "") + ", r " + std::to_string(o.lora.r) + ", alpha " +
       fmt("%g", o.lora.alpha) + ", targets " + targets_text(o.lora.targets) + "\n";
  s += "shape      micro-batch " + std::to_string(o.micro_batch) + " x seq " + std::to_string(o.seq_len) +
       ", checkpointing " + checkpointing_name(o.checkpointing) + ", base GEMMs " + gemm_dtype_name(o.gemm_dtype) + ", " + std::to_string(o.steps) +
       " timed steps after " +
       std::to_string(o.warmup_steps) + " warmup\n";
  s += "device     " + r.device + "\n";
  s += "speed      " + fmt("%.1f", r.tokens_per_second) + " tokens/s, step " + fmt("%.4f", r.step_mean_s) +
       " s = forward " + fmt("%.4f", r.forward_s) + " + backward " + fmt("%.4f", r.backward_s) + " + optimizer " +
       fmt("%.4f", r.optimizer_s) + " (+ rest)\n";
  s += "flops      " + fmt("%.4g", r.flops_per_token) + " per token (fwd + bwd" +
       (recomputes(o.checkpointing) ? " + recompute" : "") + "), achieved " +
       fmt("%.4g", r.achieved_flops / 1e12) + " TFLOP/s";
  if (r.mfu) s += ", peak " + fmt("%.1f", *r.peak_flops / 1e12) + " TFLOP/s, MFU " + fmt("%.1f", 100 * *r.mfu) + "%\n";
  else s += ", MFU n/a (" + r.peak_flops_note + ")\n";
  s += "memory     peak " + fmt("%.3f", double(r.peak_memory_bytes) / gib) + " GiB (" + r.peak_memory_kind +
       "), planned " + fmt("%.3f", double(r.planned_peak_memory_bytes) / gib) + " GiB (arena " +
       fmt("%.3f", double(r.planned_arena_bytes) / gib) + " GiB)\n";
  if (r.dequant_layers_per_step > 0 || (r.planned_dequant_bytes_per_step && *r.planned_dequant_bytes_per_step > 0)) {
    s += "dequant    " + fmt("%.1f", r.dequant_layers_per_step) + " layers/step, " +
         fmt("%.4g", r.dequant_bytes_per_step / 1e9) + " GB/step";
    if (r.planned_dequant_bytes_per_step) s += " (plan: " + fmt("%.4g", *r.planned_dequant_bytes_per_step / 1e9) + " GB)";
    s += "\n";
  }
  s += "loss       first " + fmt("%.4f", r.loss_first) + ", last " + fmt("%.4f", r.loss_last) + "\n";
  s += "params     " + std::to_string(r.base_params) + " base, " + std::to_string(r.trainable_params) + " trainable\n";
  return s;
}

}  // namespace qlora
