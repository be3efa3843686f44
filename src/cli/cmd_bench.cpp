// `qlora bench`: synthetic training benchmark of a real model shape (random weights, random tokens).
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/strings.h"
#include "plan/cpu_device.h"
#include "tasks/bench_run.h"
#ifdef QLORA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qlora {

int cmd_bench(int argc, char** argv) {
  CLI::App app{"qlora bench: trains a model of a preset's real shape (or a model's config) with random weights on\n"
               "random tokens and reports tokens/s, the forward/backward/optimizer split, MFU and peak memory\n"
               "next to the planner's prediction. Nothing is downloaded or read but the config.\n"
               "Example: qlora bench --model smollm2-135m --seq-len 256 --micro-batch 1 --steps 3 --json"};
  app.name("qlora bench");
  BenchOptions o;
  std::string device = "auto";
  int threads = 0;
  bool dq = false, no_dq = false, json = false;
  std::string method, base_precision, targets = "all-linear", target_parameters, checkpointing = "none", gemm_dtype = "bf16";
  app.add_option("--model,-m", o.model, "preset name (qlora plan --list-models), HF model directory, config.json or .gguf");
  app.add_option("--method", method, "lora | qlora (default: qlora for a quantized base precision)");
  app.add_option("--base-precision", base_precision,
                 "bf16 | fp32 | nf4 | fp4 | nvfp4 | mxfp4 | fp8 (default: nf4 for qlora, else the backend's compute dtype)");
  app.add_flag("--double-quant", dq, "double-quantize nf4/fp4 block scales (default on for nf4/fp4)");
  app.add_flag("--no-double-quant", no_dq, "store nf4/fp4 block scales in fp32");
  app.add_option("--r,--lora-r,-r", o.lora.r, "LoRA rank")->capture_default_str();
  app.add_option("--lora-alpha", o.lora.alpha, "LoRA alpha")->capture_default_str();
  app.add_option("--target-modules", targets, "comma list of projections or all-linear")->capture_default_str();
  app.add_option("--target-parameters", target_parameters,
                 "a mixture of experts' stacked experts with LoRA, as PEFT's target_parameters: comma list of "
                 "mlp.experts.gate_up_proj,mlp.experts.down_proj");
  app.add_option("--seq-len,-t", o.seq_len, "tokens per sequence")->capture_default_str();
  app.add_option("--micro-batch,-b", o.micro_batch, "sequences per step")->capture_default_str();
  app.add_option("--gradient-checkpointing", checkpointing, "none | full | offload")->capture_default_str();
  app.add_option("--gemm-dtype", gemm_dtype,
                 "bf16 | fp8 (an fp8 base, sm_89+) | fp4 (an nvfp4/mxfp4 base, sm_100): the base's forward GEMMs")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "steps run before timing starts")->capture_default_str();
  app.add_option("--device", device, "auto | cpu | cuda")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0 = OpenMP default)")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the weights and tokens")->capture_default_str();
  app.add_flag("--json", json, "print one JSON object on stdout (progress stays on stderr)");
  bool recalibrate = false;
  app.add_flag("--recalibrate", recalibrate,
               "CPU: measure the machine's rates now (for the planned step time) instead of using the cached ones");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;  // --help is success; malformed options are bad input
  }
  if (dq && no_dq) fail(ErrorKind::Config, "--double-quant/--no-double-quant", "give at most one of them");
  if (dq) o.double_quant = true;
  if (no_dq) o.double_quant = false;
  // Each flag parsed once, here (the error names the flag). Without --method: qlora for a quantized base.
  o.base_precision = optional_base_precision(base_precision, "--base-precision");
  o.method = method.empty() ? default_method(o.base_precision) : parse_method(method, "--method");
  o.lora.targets = split_commas(targets);
  if (!target_parameters.empty())
    o.lora.expert_targets = LoraSpec::resolve_expert_targets(split_commas(target_parameters), "--target-parameters");
  o.checkpointing = parse_checkpointing(checkpointing, "--gradient-checkpointing");
  o.gemm_dtype = parse_gemm_dtype(gemm_dtype, "--gemm-dtype");
  if (device != "auto" && device != "cpu" && device != "cuda")
    fail(ErrorKind::Config, "--device " + device, "unknown device", "choose auto, cpu or cuda");

  normalize_bench_options(o, DType::BF16);  // bad options fail before a backend is started (run_bench normalizes for real)

  auto be = select_backend(device, threads);
  // Right before the run, so the prediction and the measurement see the same machine state.
  if (recalibrate && be->device() == DeviceKind::Cpu) cpu_calibration(/*refresh=*/true);
  BenchDevice dev;
  dev.name = be->name();
#ifdef QLORA_HAVE_CUDA
  if (be->device() == DeviceKind::Cuda) {
    const CudaDeviceInfo info = cuda_device_info();  // the backend runs on device 0
    dev.name = info.name;
    dev.mem_bytes = int64_t(info.total_bytes);
    dev.gpu = gpu_for_device_name(info.name, dev.mem_bytes);
    dev.used_bytes = [] { return cuda_device_used_bytes(); };
  }
#endif
  const BenchResult r = run_bench(o, *be, dev, [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  if (json) std::cout << bench_json(r).dump(2) << "\n";
  else std::cout << bench_text(r);
  return 0;
}

}  // namespace qlora
