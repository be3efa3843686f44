// `qlora plan`: memory and speed plan for any model, configuration, GPU and GPU count; no GPU needed.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <omp.h>

#include "cli/commands.h"
#include "core/error.h"
#include "core/strings.h"
#include "plan/cpu_device.h"
#include "plan/fit.h"
#include "plan/model_presets.h"
#include "plan/report.h"
#include "train/engine_config.h"
#include "train/train_config.h"

namespace {

// The training config's engine spec (train/engine_config.h, as `qlora train` makes it) becomes the
// plan's, option by option, unless the command line sets that option.
void apply_train_config(const qlora::TrainConfig& t, qlora::PlanRequest& r, std::string& model, const CLI::App& app) {
  auto unset = [&](const char* opt) { return app.count(opt) == 0; };
  const qlora::EngineSpec s = qlora::engine_spec(t);
  if (unset("--model")) model = t.model_name_or_path;
  if (unset("--method")) r.method = s.method;
  if (unset("--base-precision")) r.base_precision = s.base_precision;
  if (unset("--double-quant") && unset("--no-double-quant")) r.double_quant = s.double_quant;
  if (unset("--quant-blocksize")) r.quant_blocksize = s.quant_blocksize;
  if (unset("--lora-r")) r.lora.r = s.lora.r;
  if (unset("--targets")) r.lora.targets = s.lora.targets;
  if (unset("--target-parameters")) r.lora.expert_targets = s.lora.expert_targets;
  if (unset("--lora-dropout")) r.lora.dropout = s.lora.dropout;
  if (unset("--micro-batch")) r.micro_batch = s.micro_batch;
  if (unset("--grad-accum")) r.grad_accum = t.gradient_accumulation_steps;
  if (unset("--seq-len")) r.seq_len = s.seq_len;
  if (unset("--packing") && unset("--no-packing")) r.packing = t.packing;
  if (unset("--ce-chunk")) r.ce_chunk = s.ce_chunk;
  if (unset("--mlp-tile-tokens")) r.mlp_tile = s.mlp_tile;
  if (unset("--checkpointing")) r.checkpointing = s.checkpointing;
  if (unset("--gemm-dtype")) r.gemm_dtype = s.gemm_dtype;
  if (unset("--attention-dq")) r.attn_dq = s.attn_dq;
  if (unset("--sharding")) r.sharding = s.sharding;  // what training does
  if (unset("--rl")) r.objective = s.objective;
  r.reference_precomputed = s.reference_precomputed;
  r.router_aux_loss_coef = qlora::router_aux_loss_coef_value(t);
  // Sample answers decode through the training forward with a KV cache, as the trainer plans it.
  r.kv_cache_tokens = qlora::sample_kv_tokens(t, r.seq_len);
}

void print_lists(bool gpus, bool models) {
  if (gpus) {
    std::printf("GPUs (dense peaks; sources in src/plan/gpu_catalog.cpp):\n");
    for (const auto& g : qlora::gpu_catalog()) {
      std::string aliases;
      for (const auto& a : g.aliases) aliases += (aliases.empty() ? "" : ", ") + a;
      std::printf("  %-12s %-30s %7.1f GiB %5.2f TB/s bf16 %6.0f fp8 %6.0f fp4 %6.0f TFLOP/s  (%s)\n", g.name.c_str(),
                  g.display.c_str(), double(g.mem_bytes) / double(1 << 30), g.mem_bw / 1e12, g.bf16_tflops,
                  g.fp8_tflops, g.fp4_tflops, aliases.c_str());
    }
  }
  if (models) {
    std::printf("model presets:\n");
    for (const auto& n : qlora::preset_names()) std::printf("  %s\n", n.c_str());
  }
}

}  // namespace

namespace qlora {

namespace {

// `qlora plan`'s command line: the options' values, the request they make, and its run.
struct PlanCommand {
  CLI::App app{"qlora plan: memory and speed plan for a model, configuration and GPU; allocates nothing.\n"
               "Exit status: 0 fits, 3 does not fit, 1 bad input."};
  qlora::PlanRequest r;
  std::string model, gpu, config, targets, target_parameters, compare, base_precision;
  std::string method = "lora", objective = "sft", optimizer_dtype = "fp32";
  std::string sharding = "none", checkpointing = "none", gemm_dtype = "bf16", attention_dq = "auto";
  std::string expert_precision;
  std::vector<std::string> overrides;
  bool dq = false, no_dq = false, lora_dropout = false, packing = false, no_packing = false, json = false, fit = false,
       buffers = false;
  bool list_gpus = false, list_models = false;
  bool recalibrate = false;
  int threads = 0;

  PlanCommand() { app.name("qlora plan"); }

  void add_options();
  void build_request();
  int compare_gpus() const;
  void set_device();
  int print_fit() const;
  int print_plan() const;
};

// The options, in the order --help lists them, bound to the fields above.
void PlanCommand::add_options() {
  app.add_option("--model,-m", model, "preset name, HF model directory, config.json or .gguf");
  app.add_option("--gpu,-g", gpu,
                 "catalog GPU (see --list-gpus), cpu (this machine, calibrated) or "
                 "custom:mem=80GB,bw=3.35TB/s,bf16=989,...");
  app.add_flag("--recalibrate", recalibrate, "--gpu cpu: measure this machine again instead of using the cached rates");
  app.add_option("--threads", threads, "--gpu cpu: CPU threads to plan for (0 = all cores)");
  app.add_option("--config,-c", config, "training YAML: its model, LoRA, batch and memory options become the defaults");
  app.add_option("--set", overrides, "key=value override of the training YAML (repeatable)");
  app.add_option("--method", method, "full | lora | qlora")->capture_default_str();
  app.add_option("--rl", objective,
                 "objective: sft | dpo | orpo | simpo | kto (preference rows hold two documents: --seq-len is both, "
                 "twice max_length)")
      ->capture_default_str();
  app.add_option("--base-precision", base_precision,
                 "bf16 | fp16 | fp32 | fp8 | nf4 | fp4 | nvfp4 | mxfp4 (default bf16, nf4 for qlora)");
  app.add_option("--expert-precision", expert_precision,
                 "a mixture-of-experts model's experts: any base precision (default: the base's; gpt-oss: mxfp4, as "
                 "shipped)");
  app.add_flag("--double-quant", dq, "double-quantize nf4/fp4 block scales (default on for nf4/fp4)");
  app.add_flag("--no-double-quant", no_dq, "store nf4/fp4 block scales in fp32");
  app.add_option("--quant-blocksize", r.quant_blocksize, "nf4/fp4 block size")->capture_default_str();
  app.add_option("--lora-r,-r", r.lora.r, "LoRA rank")->capture_default_str();
  app.add_option("--targets", targets,
                 "comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj (Phi-3: "
                 "qkv_proj,o_proj,gate_up_proj,down_proj) or all-linear");
  app.add_option("--target-parameters", target_parameters,
                 "a mixture of experts' stacked experts that get LoRA, as PEFT's target_parameters: comma list of "
                 "mlp.experts.gate_up_proj,mlp.experts.down_proj");
  app.add_flag("--lora-dropout", lora_dropout, "LoRA dropout on (keeps the dropped input)");
  app.add_option("--optimizer-dtype", optimizer_dtype, "AdamW m/v dtype: fp32 | bf16")->capture_default_str();
  app.add_option("--micro-batch,-b", r.micro_batch, "sequences per GPU per micro-step")->capture_default_str();
  app.add_option("--seq-len,-t", r.seq_len, "tokens per sequence")->capture_default_str();
  app.add_option("--grad-accum", r.grad_accum, "micro-steps per optimizer step")->capture_default_str();
  app.add_flag("--packing", packing, "pack examples into full sequences (default)");
  app.add_flag("--no-packing", no_packing, "one example per sequence, padded");
  app.add_option("--avg-doc-len", r.avg_doc_len,
                 "mean example length in tokens (attention span when packed, padding when not)");
  app.add_option("--checkpointing", checkpointing, "activation checkpointing: none | full | offload")
      ->capture_default_str();
  app.add_option("--ce-chunk", r.ce_chunk, "tokens per cross-entropy chunk")->capture_default_str();
  app.add_option("--mlp-tile-tokens", r.mlp_tile,
                 "with checkpointing: tokens per MLP tile (0 = auto: 8192 when a micro-batch holds more, smaller down "
                 "to 1024 when that does not fit)")
      ->capture_default_str();
  app.add_option("--sharding", sharding, "none | zero1 | zero2 | zero3 | fsdp")->capture_default_str();
  app.add_option("--gpus-per-node", r.topo.gpus_per_node, "GPUs per node")->capture_default_str();
  app.add_option("--nodes", r.topo.nodes, "nodes")->capture_default_str();
  app.add_option("--gemm-dtype", gemm_dtype, "tensor-core dtype of base-weight GEMMs: bf16 | fp8 | fp4")
      ->capture_default_str();
  app.add_option("--attention-dq", attention_dq,
                 "the GPU attention backward's dQ: auto | accumulate (an f32 buffer of every token) | recompute (its "
                 "own pass, no such buffer)")
      ->capture_default_str();
  app.add_flag("--json", json, "machine-readable output");
  app.add_flag("--fit", fit, "search the longest sequence, largest micro-batch and fastest configuration that fit");
  app.add_option("--compare", compare, "comma list of GPUs (or 'all') side by side");
  app.add_flag("--buffers", buffers, "list every planned buffer");
  app.add_flag("--list-gpus", list_gpus, "print the GPU catalog");
  app.add_flag("--list-models", list_models, "print the model presets");
}

// The request from the training config (if any), then the flags over it, and the model resolved.
void PlanCommand::build_request() {
  if (dq && no_dq)
    qlora::fail(qlora::ErrorKind::Config, "--double-quant/--no-double-quant", "give at most one of them");
  if (packing && no_packing)
    qlora::fail(qlora::ErrorKind::Config, "--packing/--no-packing", "give at most one of them");
  if (!config.empty()) {
    std::vector<std::string> notes;
    qlora::TrainConfig t = qlora::load_train_config(config, overrides, &notes, false);
    apply_train_config(t, r, model, app);
  } else if (!overrides.empty()) {
    qlora::fail(qlora::ErrorKind::Config, "--set", "overrides need a training YAML", "add --config CONFIG.yaml");
  }
  // Each flag the command line gives is parsed here, once (the error names the flag).
  auto given = [&](const char* opt) { return app.count(opt) > 0 || config.empty(); };
  if (given("--method")) r.method = qlora::parse_method(method, "--method");
  if (given("--rl")) r.objective = qlora::parse_objective(objective, "--rl");
  if (app.count("--base-precision")) r.base_precision = qlora::parse_base_precision(base_precision, "--base-precision");
  if (app.count("--expert-precision"))
    r.expert_precision = qlora::parse_base_precision(expert_precision, "--expert-precision");
  if (dq) r.double_quant = true;
  if (no_dq) r.double_quant = false;
  if (lora_dropout) r.lora.dropout = 0.1;  // any rate: the plan keeps the dropped input
  r.optimizer_dtype = qlora::parse_optimizer_dtype(optimizer_dtype, "--optimizer-dtype");
  if (no_packing) r.packing = false;
  if (packing) r.packing = true;
  if (!targets.empty()) r.lora.targets = split_commas(targets);
  if (!target_parameters.empty())
    r.lora.expert_targets =
        qlora::LoraSpec::resolve_expert_targets(split_commas(target_parameters), "--target-parameters");
  if (given("--sharding")) r.sharding = qlora::parse_sharding(sharding, "--sharding");
  if (given("--checkpointing")) r.checkpointing = qlora::parse_checkpointing(checkpointing, "--checkpointing");
  if (given("--gemm-dtype")) r.gemm_dtype = qlora::parse_gemm_dtype(gemm_dtype, "--gemm-dtype");
  if (given("--attention-dq") && attention_dq != "auto")
    r.attn_dq = qlora::parse_attn_dq(attention_dq, "--attention-dq");
  if (model.empty())
    qlora::fail(qlora::ErrorKind::Config, "--model", "no model given",
                "add --model llama3-8b (see --list-models), a model directory, config.json or .gguf");
  r.model = qlora::resolve_model(model);
  r.model_label = model;
}

// --compare: the request planned on each GPU, printed side by side.
int PlanCommand::compare_gpus() const {
  std::vector<std::string> names = compare == "all" ? qlora::gpu_names() : split_commas(compare);
  std::vector<qlora::PlanResult> plans;
  for (const auto& n : names) {
    qlora::PlanRequest q = r;
    q.gpu = qlora::resolve_gpu(n);
    plans.push_back(qlora::make_plan(q));
  }
  if (json) std::cout << qlora::compare_json(plans).dump(2) << "\n";
  else std::cout << qlora::compare_text(plans);
  return 0;
}

// The device the request plans for (--gpu cpu: with the thread count and calibration asked for).
void PlanCommand::set_device() {
  if (gpu.empty())
    qlora::fail(qlora::ErrorKind::Config, "--gpu", "no GPU given",
                "add --gpu h100 (see --list-gpus) or --gpu custom:mem=...,bw=...,bf16=...");
  if (threads > 0) omp_set_num_threads(threads);
  if (recalibrate) qlora::cpu_calibration(/*refresh=*/true);
  r.gpu = qlora::resolve_gpu(gpu);
}

// --fit: the search's report; exit status 3 when nothing fits.
int PlanCommand::print_fit() const {
  qlora::FitReport f = qlora::fit_search(r);
  if (json) std::cout << qlora::fit_json(f).dump(2) << "\n";
  else std::cout << qlora::fit_text(f, r);
  return f.has_fastest ? 0 : 3;
}

// The plan's report (with fixes to try when it does not fit); exit status 3 when it does not fit.
int PlanCommand::print_plan() const {
  qlora::PlanResult p = qlora::make_plan(r);
  qlora::ReportOptions o;
  o.buffers = buffers;
  if (!p.fits) o.suggestions = qlora::suggest_fixes(r);
  if (json) std::cout << qlora::plan_json(p, o).dump(2) << "\n";
  else std::cout << qlora::plan_text(p, o);
  return p.fits ? 0 : 3;
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  PlanCommand cmd;
  cmd.add_options();
  try {
    cmd.app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cmd.app.exit(e) == 0 ? 0 : 1;  // --help is success; malformed options are bad input
  }
  if (cmd.list_gpus || cmd.list_models) {
    print_lists(cmd.list_gpus, cmd.list_models);
    return 0;
  }
  cmd.build_request();
  if (!cmd.compare.empty()) return cmd.compare_gpus();
  cmd.set_device();
  if (cmd.fit) return cmd.print_fit();
  return cmd.print_plan();
}

}  // namespace qlora
