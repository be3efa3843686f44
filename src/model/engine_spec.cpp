// The engine spec's defaults, its checks and the model options it resolves to (model/engine_spec.h).
#include "model/engine_spec.h"

#include "backend/backend.h"
#include "core/error.h"
#include "model/backend_plan.h"

namespace qlora {

BasePrecision resolved_base(const EngineSpec& s, DType compute) {
  if (s.base_precision) return *s.base_precision;
  return s.method == Method::Qlora ? BasePrecision::Nf4 : float_base(compute);
}

int64_t resolved_mlp_tile(const EngineSpec& s) {
  if (!recomputes(s.checkpointing)) return 0;
  if (s.mlp_tile > 0) return s.mlp_tile;
  return s.micro_batch * s.seq_len > kAutoMlpTileTokens ? kAutoMlpTileTokens : 0;
}

int64_t mlp_tile_for_budget(const EngineSpec& s, const LlamaConfig& c, const ModelPlanOptions& o, DeviceKind device,
                            int64_t budget) {
  if (s.mlp_tile > 0 || !recomputes(s.checkpointing)) return o.mlp_tile;
  if (c.moe()) return 0;  // a mixture of experts runs its MLP untiled, over the routed rows
  if (budget <= 0) return o.mlp_tile;
  const int64_t n = o.micro_batch * o.seq_len;
  auto total = [&](int64_t tile) {
    ModelPlanOptions t = o;
    t.mlp_tile = tile;
    MemoryPlan p;
    plan_engine_buffers(p, c, t, device);
    return p.total_bytes();
  };
  if (total(o.mlp_tile) <= budget) return o.mlp_tile;
  int64_t tile = o.mlp_tile > 0 ? o.mlp_tile / 2 : kAutoMlpTileTokens;
  for (; tile >= kMinAutoMlpTileTokens; tile /= 2)
    if (tile < n && total(tile) <= budget) return tile;
  return std::min(n, kMinAutoMlpTileTokens);
}

void fit_to_budget(const EngineSpec& s, const LlamaConfig& c, ModelPlanOptions& o, DeviceKind device, int64_t budget) {
  o.mlp_tile = mlp_tile_for_budget(s, c, o, device, budget);
  o.attn_dq = s.attn_dq.value_or(AttnDq::Accumulate);
  if (s.attn_dq || device != DeviceKind::Cuda || budget <= 0) return;
  MemoryPlan p;
  plan_engine_buffers(p, c, o, device);
  if (p.total_bytes() > budget) o.attn_dq = AttnDq::Recompute;  // the smaller plan, fitting or not
}

EngineSpec normalize_engine_spec(const EngineSpec& in, DType compute) {
  EngineSpec s = in;
  const BasePrecision base = resolved_base(s, compute);
  s.base_precision = base;
  const std::string name = base_precision_name(base);
  const bool quant = is_quantized(base);
  const std::string combo = std::string("--method ") + method_name(s.method) + " --base-precision " + name;
  if (s.method == Method::Qlora && !quant)
    fail(ErrorKind::Config, combo, "QLoRA needs a quantized frozen base, not " + name,
         "use --base-precision nf4 (or fp4, nvfp4, mxfp4, fp8), or --method lora for a " + name + " base");
  if (s.method == Method::Lora && quant)
    fail(ErrorKind::Config, combo, "a " + name + " base is QLoRA, not LoRA",
         "use --method qlora --base-precision " + name + ", or --base-precision bf16 for LoRA");
  if (s.method == Method::Full && base != BasePrecision::Bf16 && base != BasePrecision::Fp32)
    fail(ErrorKind::Config, combo,
         "full fine-tuning trains fp32 weights, or bf16 weights with fp32 master copies (and AdamW state)",
         quant ? "quantized weights cannot be trained directly: use --method qlora to train adapters on a " + name + " base"
               : "drop --base-precision or set it to bf16 or fp32");
  if (s.double_quant.value_or(false) && !is_bnb_4bit(base))
    fail(ErrorKind::Config, "--double-quant", "double quantization applies to the bitsandbytes formats nf4 and fp4 only",
         name + " stores its own block scales; drop --double-quant");
  s.double_quant = is_bnb_4bit(base) && s.double_quant.value_or(true);
  if (is_bnb_4bit(base)) {
    const int64_t b = s.quant_blocksize;
    if (b < 32 || b > 4096 || (b & (b - 1)) != 0)
      fail(ErrorKind::Config, "--quant-blocksize " + std::to_string(b), "nf4/fp4 block size must be a power of two in [32, 4096]",
           "bitsandbytes uses 64 by default");
  }
  if (s.mlp_tile > 0 && !recomputes(s.checkpointing))
    fail(ErrorKind::Config, "--mlp-tile-tokens " + std::to_string(s.mlp_tile),
         "MLP tiles apply to the recompute of a checkpointed layer, and checkpointing is off",
         "add --checkpointing full (or offload), or drop --mlp-tile-tokens");
  if (s.method == Method::Full) s.lora.targets.clear();
  return s;
}

ModelPlanOptions resolve_engine(const EngineSpec& s, const EngineTarget& t) {
  ModelPlanOptions o;
  o.method = s.method;
  o.compute_dtype = t.compute_dtype;
  o.base_precision = s.base_precision;
  o.quant_blocksize = s.quant_blocksize;
  o.double_quant = s.double_quant.value_or(s.base_precision && is_bnb_4bit(*s.base_precision));
  o.lora = s.lora;
  o.optimizer_dtype = s.optimizer_dtype;
  o.micro_batch = s.micro_batch;
  o.seq_len = s.seq_len;
  o.checkpointing = s.checkpointing;
  o.mlp_tile = resolved_mlp_tile(s);
  o.attn_dq = s.attn_dq.value_or(AttnDq::Accumulate);
  o.ce_chunk = s.ce_chunk;
  o.kv_cache_tokens = s.kv_cache_tokens;
  o.gemm_dtype = s.gemm_dtype;
  o.optimizer_shards = splits_optimizer(s, t.world) ? t.world : 1;
  if (s.sharding == Sharding::Fsdp) {
    o.base_shards = t.world;
    o.base_shard_rank = t.rank;
  }
  return o;
}

}  // namespace qlora
