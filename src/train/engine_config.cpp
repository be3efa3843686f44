// TrainConfig -> EngineSpec (train/engine_config.h).
#include "train/engine_config.h"

#include "core/error.h"

namespace qlora {

EngineSpec engine_spec(const TrainConfig& c) {
  EngineSpec s;
  // The config's own checks made load_in_4bit and base_precision agree (base_precision nf4/fp4).
  s.base_precision = c.base_precision;
  s.method = c.finetuning_type == FinetuningType::Full ? Method::Full : default_method(s.base_precision);
  s.quant_blocksize = c.quant_blocksize;
  if (s.base_precision && is_bnb_4bit(*s.base_precision)) s.double_quant = c.bnb_4bit_use_double_quant;
  s.lora.r = c.r;
  s.lora.alpha = c.lora_alpha;
  s.objective = c.rl;
  s.reference_precomputed = uses_reference(s.objective) && c.precompute_ref_log_probs;
  // TRL's preference trainers run without dropout unless disable_dropout: false; SFT keeps it unless true.
  const bool no_dropout =
      c.disable_dropout == DisableDropout::Auto ? is_preference(s.objective) : c.disable_dropout == DisableDropout::Yes;
  s.lora.dropout = no_dropout ? 0.0 : c.lora_dropout;
  s.lora.use_rslora = c.use_rslora;
  s.lora.expert_targets = LoraSpec::resolve_expert_targets(c.target_parameters, "target_parameters");
  // LoRA on the experts alone: no projection adapted (PEFT's target_modules null).
  if (!c.target_modules.empty() || s.lora.expert_targets.empty()) s.lora.targets = LoraSpec::resolve_targets(c.target_modules);
  s.checkpointing = c.gradient_checkpointing;
  s.ce_chunk = c.ce_chunk_size;
  s.mlp_tile = c.mlp_tile_tokens;
  if (s.mlp_tile > 0 && !recomputes(s.checkpointing))
    fail(ErrorKind::Config, "mlp_tile_tokens", "MLP tiles apply to the recompute of a checkpointed layer, and "
                                               "gradient_checkpointing is none",
         "set gradient_checkpointing: full (or offload), or remove mlp_tile_tokens");
  s.gemm_dtype = c.gemm_dtype;
  s.attn_dq = c.attention_dq;
  s.sharding = c.sharding;
  return with_shapes(s, c, c.per_device_train_batch_size, row_tokens_cap(c));
}

std::optional<PreferenceSpec> preference_spec(const TrainConfig& c) {
  const Objective o = c.rl;
  if (!is_preference(o)) return std::nullopt;
  PreferenceSpec p;
  p.method = o;
  p.loss = c.loss_type;
  p.beta = c.beta;
  p.label_smoothing = c.label_smoothing;
  p.simpo_gamma = c.simpo_gamma;
  p.cpo_alpha = c.cpo_alpha;
  p.desirable_weight = c.desirable_weight;
  p.undesirable_weight = c.undesirable_weight;
  return p;
}

int64_t row_tokens_cap(const TrainConfig& c) { return is_preference(c.rl) ? 2 * c.max_length : c.max_length; }

int64_t sample_kv_tokens(const TrainConfig& c, int64_t seq_len) {
  return c.sample_prompts.empty() ? 0 : seq_len + c.sample_max_new_tokens;
}

EngineSpec with_shapes(EngineSpec s, const TrainConfig& c, int64_t micro_batch, int64_t seq_len) {
  s.micro_batch = micro_batch;
  s.seq_len = seq_len;
  s.kv_cache_tokens = sample_kv_tokens(c, seq_len);
  return s;
}

void apply_router_aux_loss(const TrainConfig& c, LlamaConfig& model) {
  if (const std::optional<double> coef = router_aux_loss_coef_value(c))
    override_router_aux_loss_coef(model, *coef, "router_aux_loss_coef");
}

}  // namespace qlora
