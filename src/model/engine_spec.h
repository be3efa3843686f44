// EngineSpec: what the engine runs, as one typed value. Each command makes it once from its input
// (a training config: train/engine_config.h; command-line flags: qlora plan, qlora bench) and
// everything downstream takes it: the model's options (resolve_engine), the planner's request, the
// benchmark. A new mode is a field here, its parser in model/modes.h and the place that uses it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "model/lora.h"
#include "model/model_plan.h"
#include "model/modes.h"

namespace qlora {

enum class DeviceKind;  // backend/backend.h

struct EngineSpec {
  Method method = Method::Lora;
  // Sft, or a preference objective: rows of seq_len tokens hold two documents (prompt + chosen and
  // prompt + rejected; KTO: a rated completion and its KL probe), and Dpo/Kto add a forward of the
  // reference (adapters off, no activations kept) to every micro-batch.
  Objective objective = Objective::Sft;
  bool reference_precomputed = false;  // Dpo/Kto: the reference log-probs come with the data (no forward in the step)
  // Unset: the compute dtype's float (fp32 on the CPU, bf16 on a GPU) for lora and full, nf4 for
  // qlora; a pre-quantized checkpoint keeps its own format (adopt_stored_quantization).
  std::optional<BasePrecision> base_precision;
  int64_t quant_blocksize = 64;        // nf4/fp4 block (the other formats have fixed blocks)
  std::optional<bool> double_quant;    // nf4/fp4 only; unset: on for those
  LoraSpec lora;                       // rank, alpha, dropout, rsLoRA, target projections (layer order)
  DType optimizer_dtype = DType::F32;  // AdamW moments: F32 | BF16
  int64_t micro_batch = 1;             // sequences per micro-step
  int64_t seq_len = 2048;              // tokens per sequence
  Checkpointing checkpointing = Checkpointing::None;
  // Tokens per MLP tile under checkpointing (mlp_tile_tokens); 0: auto, tiles of
  // kAutoMlpTileTokens when a micro-batch holds more tokens, else untiled (resolved_mlp_tile), and
  // smaller tiles where the device's memory asks for them (mlp_tile_for_budget).
  int64_t mlp_tile = 0;
  // How the CUDA attention backward forms dQ (attention_dq); unset: auto, Accumulate unless the
  // plan does not fit the device's memory with it (fit_to_budget).
  std::optional<AttnDq> attn_dq;
  int64_t ce_chunk = 1024;             // tokens per cross-entropy chunk
  GemmDtype gemm_dtype = GemmDtype::Bf16;
  Sharding sharding = Sharding::None;
  int64_t kv_cache_tokens = 0;         // sample answers' KV cache (positions); 0: none
};

// The method a base implies when none is asked for: qlora for a quantized base, else lora.
inline Method default_method(std::optional<BasePrecision> base) {
  return base && is_quantized(*base) ? Method::Qlora : Method::Lora;
}

inline constexpr int64_t kAutoMlpTileTokens = 8192;
inline constexpr int64_t kMinAutoMlpTileTokens = 1024;  // below this the MLP's GEMMs lose efficiency
// The MLP tile a spec runs with (ModelPlanOptions::mlp_tile) before memory is known: 0 without
// checkpointing.
int64_t resolved_mlp_tile(const EngineSpec& s);

// The auto MLP tile for a memory budget. `o` is the spec's resolved options (o.mlp_tile the default
// of resolved_mlp_tile). When the plan of `o` on `device` is over `budget` bytes, tiles of half the
// default (or of kAutoMlpTileTokens when the default is untiled), a quarter, ... down to
// kMinAutoMlpTileTokens are planned, and the largest that fits is returned; the smallest when none
// fits (the memory check then refuses the run with the sizes). An explicit s.mlp_tile, no
// checkpointing or budget <= 0 (unknown) return o.mlp_tile unchanged; a mixture-of-experts model
// runs untiled (0) unless the spec asks for a tile, which the model then refuses.
int64_t mlp_tile_for_budget(const EngineSpec& s, const LlamaConfig& c, const ModelPlanOptions& o, DeviceKind device,
                            int64_t budget);

// The options' memory choices for a budget (the device's free memory; <= 0: unknown): the MLP tile
// (mlp_tile_for_budget), then on the CUDA backend the attention backward's dQ: the spec's, else
// Accumulate while the plan fits the budget and Recompute (no f32 dQ accumulator) when it does not.
void fit_to_budget(const EngineSpec& s, const LlamaConfig& c, ModelPlanOptions& o, DeviceKind device, int64_t budget);

// The base precision a spec runs with on a backend computing in `compute`.
BasePrecision resolved_base(const EngineSpec& s, DType compute);

// Defaults filled (base precision, double quant, targets in layer order) and impossible
// combinations refused, as Error(Config) naming the command-line flags (--method,
// --base-precision, --double-quant, --quant-blocksize) with a hint.
EngineSpec normalize_engine_spec(const EngineSpec& in, DType compute);

// Whether the AdamW moments are split over `world` ranks: zero1, and fsdp (which implies it).
inline bool splits_optimizer(const EngineSpec& s, int world) {
  return (s.sharding == Sharding::Zero1 || s.sharding == Sharding::Fsdp) && world > 1;
}

// Where the engine runs: the backend's compute dtype and, for sharding, this rank of `world`.
struct EngineTarget {
  DType compute_dtype = DType::F32;
  int world = 1;
  int rank = 0;
};

// The model's options for a spec on a target: the one place they are filled from a spec.
// Sharding fsdp splits the optimizer and the base over the world; zero1 the optimizer only.
ModelPlanOptions resolve_engine(const EngineSpec& s, const EngineTarget& t);

}  // namespace qlora
