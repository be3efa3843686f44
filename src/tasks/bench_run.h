// `qlora bench`: trains a real model shape with random weights on random tokens and measures
// tokens/s, the forward/backward/optimizer split, MFU and peak memory next to the planner's figures.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/modes.h"
#include "model/engine_spec.h"
#include "model/llama_config.h"
#include "model/decoder_model.h"
#include "plan/flops.h"
#include "plan/gpu_catalog.h"

namespace qlora {

// The engine spec benchmarked (model/engine_spec.h; lora.targets as given, "all-linear" expands),
// the model's shape, and the run's length.
struct BenchOptions : EngineSpec {
  BenchOptions() {
    micro_batch = 4;
    lora.targets = {"all-linear"};
  }
  std::string model;           // preset name, HF model dir, config.json or .gguf: only the config is read
  int64_t steps = 10, warmup_steps = 2;
  uint64_t seed = 0;
  double learning_rate = 2e-4;  // constant; AdamW and clipping at the trainer's defaults
};

// What the CLI knows about the device (the CUDA helpers live outside this library).
struct BenchDevice {
  std::string name = "cpu";              // "cpu" or the CUDA device name
  const GpuSpec* gpu = nullptr;          // catalog entry (bf16 peak, memory) when recognized
  int64_t mem_bytes = 0;                 // device memory, for the planner's driver-reserve line
  std::function<int64_t()> used_bytes;   // device memory in use now; null: peak host RSS is measured
};

struct BenchResult {
  BenchOptions opts;  // normalized
  std::string device;
  std::optional<std::string> git_sha;
  double tokens_per_second = 0;
  double step_mean_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0;  // means over timed steps
  double flops_per_token = 0, achieved_flops = 0;  // counted FLOPs: forward + backward + recompute
  std::optional<double> peak_flops, mfu;  // mfu: model FLOPs (no recompute) / peak; null without a catalogued peak (CPU, unknown GPU)
  std::string peak_flops_note;            // why peak_flops is null (text output only)
  int64_t peak_memory_bytes = 0;
  std::string peak_memory_kind;           // device | host_rss
  int64_t planned_arena_bytes = 0;        // the MemoryPlan the model allocated from
  int64_t planned_peak_memory_bytes = 0;  // arena + the planner's library-overhead lines (CUDA)
  double loss_first = 0, loss_last = 0;   // mean token loss of the first step run (warmup included) and the last
  int64_t trainable_params = 0, base_params = 0;
  double load_s = 0;                      // building the model and its random weights (text output only)
  // The planner's speed model for the same request: on the CPU with the calibrated `cpu` device,
  // on a GPU with its catalog entry; null without one. planned_step_error = planned / measured - 1.
  std::optional<double> planned_step_time_s, planned_step_error;
  std::string planned_device;             // the device the prediction was made for
  nlohmann::ordered_json planned_parts;   // the model's terms: gemm, attention, memory/elementwise seconds
  nlohmann::ordered_json host;            // CPU backend: cpu model, threads, simd, blas
  // Data movement of a quantized base, per timed step: layers the engine dequantized (counted by
  // the model) and their bytes (stored bytes read + compute-dtype operand written), beside the
  // planner's "base weight dequant/cast" line for the same request (null on a device without a
  // catalog entry; on the CPU, the planner's layer count at the same bytes per layer).
  double dequant_layers_per_step = 0, dequant_bytes_per_step = 0;
  std::optional<double> planned_dequant_bytes_per_step;
};

// Resolves defaults and rejects bad values (Error(Config) naming the option, with a hint).
// `compute` is the backend's compute dtype, whose float is the default base (fp32 on the CPU
// backend, bf16 on CUDA); a bf16 base on the fp32 CPU backend is refused (its matmul takes f32
// weights only), and so is full fine-tuning (planned, not implemented by the engine).
BenchOptions normalize_bench_options(const BenchOptions& o, DType compute);

// The FLOP counts the bench divides by: the planner's counter for this shape, attention over the
// whole sequence (one document per row), recompute when checkpointing.
FlopCounts bench_flop_counts(const LlamaConfig& c, const BenchOptions& normalized);

// Seeded random weights: normal-shaped (Irwin-Hall of 4 uniforms, std 0.02) for embeddings and
// projections, ones for RMSNorm weights, zeros for biases; the same values on any thread count.
TensorSource random_tensor_source(uint64_t seed);

// Runs the benchmark; `progress` gets one line per phase and step (may be null).
BenchResult run_bench(const BenchOptions& opts, Backend& be, const BenchDevice& dev,
                      const std::function<void(const std::string&)>& progress);

nlohmann::ordered_json bench_json(const BenchResult& r);
std::string bench_text(const BenchResult& r);

}  // namespace qlora
