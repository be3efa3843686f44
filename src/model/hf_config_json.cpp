// hf_config_json: the config.json transformers reads for a model known only by its LlamaConfig.
#include "model/llama_config.h"

#include <cmath>

#include "core/error.h"
#include "core/strings.h"
#include "io/json_util.h"

namespace qlora {

// Gemma 2 / Gemma 3 text: the keys Gemma2Config / Gemma3TextConfig read (Hub layout: rope_theta,
// rope_local_base_freq and rope_scaling for the global layers), the sliding layers as layer_types.
static void gemma_config_json(const LlamaConfig& c, json& j) {
  const bool gemma2 = c.model_type == "gemma2";
  j["architectures"] = json::array({gemma2 ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM"});
  j.erase("hidden_act");
  j["hidden_activation"] = "gelu_pytorch_tanh";
  const double q = c.query_pre_attn_scalar;  // an int to transformers' Gemma configs (strictly typed)
  j["query_pre_attn_scalar"] = q == std::floor(q) && std::fabs(q) < 9e15 ? json(int64_t(q)) : json(q);
  j["attention_bias"] = false;
  auto cap = [](double v) { return v > 0 ? json(v) : json(nullptr); };
  j["attn_logit_softcapping"] = cap(c.attn_logit_softcapping);
  j["final_logit_softcapping"] = cap(c.final_logit_softcapping);
  j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  json types = json::array();
  for (int64_t l = 0; l < c.n_layer; l++) types.push_back(c.window_of(l) > 0 ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  if (!gemma2) j["rope_local_base_freq"] = c.rope_local_theta > 0 ? c.rope_local_theta : c.rope_theta;
}

// Phi-3 / Phi-4: Phi3Config's keys, partial_rotary_factor so that int(head_dim * factor) is the
// rotary dims, LongRoPE's factors with the pretraining context at the top level, and its
// attention_factor only where it is not the one transformers derives.
static void phi3_config_json(const LlamaConfig& c, json& j) {
  j["architectures"] = json::array({"Phi3ForCausalLM"});
  for (const char* k : {"resid_pdrop", "embd_pdrop", "attention_dropout"}) j[k] = 0.0;
  j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  j.erase("head_dim");
  if (c.rotary_dim > 0) {
    double p = double(c.rotary_dim) / double(c.head_dim);
    while (int64_t(double(c.head_dim) * p) < c.rotary_dim) p = std::nextafter(p, 2.0);
    j["partial_rotary_factor"] = p;
  }
  const RopeScaling& r = c.rope_scaling;
  if (r.type != "longrope") return;
  j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  json rs = {{"type", "longrope"}, {"short_factor", r.short_factor}, {"long_factor", r.long_factor}};
  const double f = double(c.max_position_embeddings) / double(r.original_max_position_embeddings);
  const double derived = longrope_attention_factor(f, r.original_max_position_embeddings);
  if (std::fabs(r.factor - f) > 1e-12 * f) rs["factor"] = r.factor;
  if (std::fabs(r.attention_factor - derived) > 1e-6 * derived) rs["attention_factor"] = r.attention_factor;
  j["rope_scaling"] = rs;
}

// MixtralConfig's and Qwen3MoeConfig's experts and router, as parse_moe reads them back: every layer
// sparse, no router noise, the load-balancing loss on exactly when the model adds it.
static void moe_config_json(const LlamaConfig& c, json& j) {
  const bool mixtral = c.model_type == "mixtral";
  j[mixtral ? "num_local_experts" : "num_experts"] = c.n_experts;
  j["num_experts_per_tok"] = c.experts_per_tok;
  j["output_router_logits"] = c.router_aux_loss_coef > 0;
  if (c.router_aux_loss_coef > 0) j["router_aux_loss_coef"] = c.router_aux_loss_coef;
  if (mixtral) {  // MixtralAttention: the window on every layer
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    j["router_jitter_noise"] = 0.0;
    return;
  }
  if (c.sliding_window > 0)  // Qwen3-MoE's windows (use_sliding_window, max_window_layers) are not written
    fail(ErrorKind::Unsupported, "model_type 'qwen3_moe': sliding_window", "writing a config.json with sliding layers is not implemented",
         "keep the base model's own config.json");
  j["sliding_window"] = nullptr;
  j["moe_intermediate_size"] = c.expert_intermediate_size;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = json::array();
  j["attention_bias"] = false;
  j["use_sliding_window"] = false;
}

// GptOssConfig's keys, as parse_gpt_oss reads them back: the experts and router, the windows per
// layer, the clamped SwiGLU's limit (its alpha is GptOssExperts' constant 1.702: another is refused),
// the load-balancing loss on exactly when the model adds it.
static void gpt_oss_config_json(const LlamaConfig& c, json& j) {
  if (c.swiglu_clamp.alpha != 1.702f)
    fail(ErrorKind::Unsupported, "model_type 'gpt_oss': swiglu_alpha " + float_decimal(c.swiglu_clamp.alpha),
         "GptOssConfig has no key for it (transformers fixes 1.702)", "keep the base model's own config.json");
  j["architectures"] = json::array({"GptOssForCausalLM"});
  j["num_local_experts"] = c.n_experts;
  j["num_experts_per_tok"] = c.experts_per_tok;
  j["output_router_logits"] = c.router_aux_loss_coef > 0;
  if (c.router_aux_loss_coef > 0) j["router_aux_loss_coef"] = c.router_aux_loss_coef;
  j["swiglu_limit"] = c.swiglu_clamp.limit;
  j["attention_bias"] = true;
  j["attention_dropout"] = 0.0;
  j["sliding_window"] = c.sliding_window;
  json types = json::array();
  for (int64_t l = 0; l < c.n_layer; l++) types.push_back(c.window_of(l) > 0 ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
}

json hf_config_json(const LlamaConfig& c, const std::string& torch_dtype) {
  const bool experts = c.model_type == "mixtral" || c.model_type == "qwen3_moe", gpt_oss = c.model_type == "gpt_oss";
  const bool yarn_ok = c.model_type == "llama" || c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "qwen3_moe" || gpt_oss;
  if ((c.moe() && !experts && !gpt_oss) || !c.multimodal.empty() || (c.attention_sinks && !gpt_oss) ||
      (c.rope_scaling.type == "yarn" && !yarn_ok))
    fail(ErrorKind::Unsupported, "model_type '" + c.model_type + "'",
         "writing a config.json for this model is not implemented", "keep the base model's own config.json");
  const std::string arch = c.model_type == "qwen2"       ? "Qwen2ForCausalLM"
                           : c.model_type == "qwen3"     ? "Qwen3ForCausalLM"
                           : c.model_type == "mistral"   ? "MistralForCausalLM"
                           : c.model_type == "mixtral"   ? "MixtralForCausalLM"
                           : c.model_type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                                                         : "LlamaForCausalLM";
  json j = {{"architectures", json::array({arch})}, {"model_type", c.model_type}, {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.n_layer}, {"num_attention_heads", c.n_head},
            {"num_key_value_heads", c.n_head_kv}, {"head_dim", c.head_dim},
            {"max_position_embeddings", c.max_position_embeddings}, {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta}, {"hidden_act", "silu"}, {"tie_word_embeddings", c.tie_word_embeddings},
            {"torch_dtype", torch_dtype}};
  if (c.model_type == "llama") j["attention_bias"] = c.attention_bias, j["mlp_bias"] = false;
  if (c.model_type == "qwen3") j["attention_bias"] = false, j["use_sliding_window"] = false;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  // null rather than a class default past a small vocabulary (Phi3Config's is 32000)
  j["pad_token_id"] = c.pad_token_id >= 0 && c.pad_token_id < c.vocab_size ? json(c.pad_token_id) : json(nullptr);
  if (c.rope_scaling.type == "none" || c.rope_scaling.type == "longrope") {
    j["rope_scaling"] = nullptr;
  } else if (c.rope_scaling.type == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
  } else if (c.rope_scaling.type == "yarn") {  // its attention_factor only where it is not the derived one
    const RopeScaling& r = c.rope_scaling;
    if (r.mscale != 0 || r.mscale_all_dim != 0)
      fail(ErrorKind::Unsupported, "rope_scaling.mscale", "writing a config.json with YaRN's mscale is not implemented",
           "keep the base model's own config.json");
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", r.factor},
                         {"original_max_position_embeddings", r.original_max_position_embeddings},
                         {"beta_fast", r.beta_fast}, {"beta_slow", r.beta_slow}, {"truncate", r.truncate}};
    if (!yarn_attention_factor_is_derived(r)) j["rope_scaling"]["attention_factor"] = r.attention_factor;
  } else {
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  if (c.model_type == "gemma2" || c.model_type == "gemma3_text") gemma_config_json(c, j);
  if (c.model_type == "phi3") phi3_config_json(c, j);
  if (experts) moe_config_json(c, j);
  if (gpt_oss) gpt_oss_config_json(c, j);
  return j;
}

}  // namespace qlora
