// The planner's assumptions in one place: speed efficiencies and estimated library overhead.
// None is measured on our engine yet; update each from bench/ results and flip `measured`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace qlora {

struct PlanAssumptions {
  // True once these constants come from our own benchmarks (bench/RESULTS.md). Until then the
  // planner labels every speed figure as an estimate resting on placeholders.
  bool measured = false;

  // --- speed: fraction of the datasheet peak that each kind of work reaches ---
  // Dense bf16 GEMM: a GEMM microbenchmark reached ~790 of 989 TFLOP/s on this project's H100
  // (reference/perf_anchors.md header). Kernel-level only, not our end-to-end training step.
  double gemm_efficiency = 0.80;
  // FP8/FP4 GEMMs (--gemm-dtype): placeholder guess, lower than bf16 because scaling/casting
  // epilogues and smaller tiles rarely reach the doubled peak. Not measured. The only anchors are
  // end-to-end, not GEMM microbenchmarks: NVIDIA's NVFP4 training blog (NVIDIA Technical Blog,
  // "Using NVFP4 Low-Precision Model Training", Feb 2026, as summarized) reports Llama-3-8B on
  // GB200 at 1,850 TFLOP/s per GPU in NVFP4 against 1,165 in bf16 (1.59x where the dense peaks
  // differ 4x), and NeMo's FP8 LoRA on H100 (NeMo 24.12 performance summary) stays below 2x bf16.
  // bench/device_lowp_ctx.sh measures the engine's own FP8/FP4 GEMMs to replace it.
  double lowp_gemm_efficiency = 0.65;
  // Causal flash attention, by the path the engine takes (plan/attention_path.h):
  // cuDNN's fused attention on sm_90/sm_100: cuDNN 9 causal head-dim-128 forward 484-539 and
  // backward 465-516 TFLOP/s on H100 SXM5 at 2k-16k tokens in the FlashAttention-3 paper's
  // figures (Shah et al. 2024, arXiv:2407.08608), about half of the 989 TFLOP/s peak.
  double attention_efficiency = 0.50;
  // The own FA2-style kernel (mma.sync; sm_80 and GPUs without the cuDNN path): FlashAttention-2
  // reaches 50-73% of A100's peak (Dao 2023, arXiv:2307.08691), but only ~35% on H100 (the
  // FlashAttention-3 abstract); the planner uses it where cuDNN is not taken, mostly sm_80.
  double own_attention_efficiency = 0.50;
  // Memory-bound kernels (dequant, norms, RoPE, SwiGLU, CE, AdamW): ~2.5 of 3.35 TB/s on H100 for
  // a good dequant kernel (perf_anchors §9, DeepSpeed PR #5373).
  double memory_bw_efficiency = 0.75;
  // Collectives: fraction of link / NIC bandwidth NCCL reaches as bus bandwidth. Placeholder.
  double comm_efficiency = 0.70;
  // Fraction of compute time under which communication can hide (prefetched all-gathers,
  // bucketed reduce-scatter). Placeholder.
  double comm_overlap = 0.50;
  // Fraction of the compute beside it under which one offloaded layer input's copy hides (the
  // engine copies a layer's input while that layer runs forward, and back while the layer above
  // runs backward): Unsloth reports ~1-2% overhead for asynchronous offload (perf_anchors §2,
  // vendor claim).
  double offload_overlap = 0.90;
  // Fraction of the base GEMMs' time under which the next layer's dequantization, issued on a side
  // stream (DequantizeArgs::prefetch), hides: the GEMMs of a training-size micro-batch are
  // compute-bound and leave most of the memory bandwidth free. Placeholder until a device run.
  double dequant_overlap = 0.90;

  // --- memory: estimated library/runtime overhead, one named line each ---
  int64_t cuda_context_bytes = int64_t(512) << 20;   // CUDA context + our kernels' modules (typical 0.4-0.6 GiB)
  int64_t nccl_bytes = int64_t(512) << 20;           // NCCL communicators and channel buffers (world > 1)
  double fragmentation_fraction = 0.02;              // allocator slack over planned bytes (one block per category)
  double driver_reserve_fraction = 0.005;            // memory the driver/ECC keeps out of reach (nvidia-smi
                                                     // shows ~79.65 of 80 GiB on H100)
};

// The assumptions in force (the defaults above).
const PlanAssumptions& plan_assumptions();

// Human-readable list "name = value (basis)" for reports.
std::vector<std::string> describe_assumptions(const PlanAssumptions& a);

}  // namespace qlora
