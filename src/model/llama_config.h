// LlamaConfig: the decoder's shape and numerics, read from HF config.json, GGUF metadata or a preset.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/activation.h"

namespace qlora {

struct RopeScaling {
  std::string type = "none";  // none | linear | llama3 | longrope | yarn
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;       // llama3, longrope, yarn
  // YaRN (Qwen2.5/Qwen3's documented long-context setting; gpt-oss): each frequency blends its
  // original (extrapolation) and its value over `factor` (interpolation) by a linear ramp over
  // the dims between those making beta_fast and beta_slow turns over the original context
  // (floored and ceiled when truncate); cos and sin times attention_factor (resolved: the
  // config's, else 0.1 ln(factor) + 1, or the ratio of that with mscale and with mscale_all_dim).
  double beta_fast = 32, beta_slow = 1, mscale = 0, mscale_all_dim = 0;
  bool truncate = true;
  // LongRoPE (Phi-3/3.5/4's long-context variants): each rotary frequency divided by its factor,
  // the short ones while a forward's positions stay within original_max_position_embeddings
  // (its largest position + 1 <= it), the long ones past it; cos and sin times attention_factor
  // (resolved: the config's, else sqrt(1 + ln(factor) / ln(original_max_position_embeddings)),
  // factor then max_position_embeddings / original_max_position_embeddings when the file has none).
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
};

struct LlamaConfig {
  // llama | mistral | qwen2 | qwen3 | gemma2 | gemma3_text | phi3 | mixtral | qwen3_moe | gpt_oss
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;         // C
  int64_t intermediate_size = 0;   // F
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;            // hidden_size / n_head unless config says otherwise
  // RoPE rotates the first rotary_dim dims of each head (pairs j, j + rotary_dim/2) and passes the
  // rest (Phi-4-mini's partial_rotary_factor 0.75: 96 of 128); 0: all of head_dim.
  int64_t rotary_dim = 0;
  int64_t rope_dim() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool attention_bias = false;     // qwen2: q/k/v have bias
  // qwen3: an RMSNorm over each head of q and of k (weights q_norm, k_norm: head_dim each, eps
  // rms_norm_eps) after the projections and before RoPE.
  bool qk_norm = false;
  bool tie_word_embeddings = false;
  // Phi-3/Phi-4 store q, k, v as one qkv_proj (rows q, then k, then v) and gate, up as one
  // gate_up_proj (gate rows first). The engine keeps the seven projections apart; a LoRA adapter
  // targets the fused modules as PEFT does (one A for the fused outputs, B's rows split the same way).
  bool fused_qkv = false, fused_gate_up = false;
  // Gemma 3 (gemma3_text). Every RMSNorm multiplies by (1 + weight): the checkpoint stores the
  // offset from one (the engine keeps it so and the norm ops add 1 in f32).
  bool norm_unit_offset = false;
  // Norms on both sides of each block: post_attention_layernorm on o_proj's output and
  // post_feedforward_layernorm on down_proj's, each before its residual add;
  // pre_feedforward_layernorm is then the MLP's input norm.
  bool sandwich_norms = false;
  bool scale_embeddings = false;  // the embedding rows times sqrt(hidden_size), rounded to the compute dtype
  Activation hidden_act = Activation::Silu;  // the gated MLP's activation
  // Gemma 2's logit soft-capping: attention scores become c tanh(s / c) with c the first, the final
  // logits with the second (transformers' attn_logit_softcapping, final_logit_softcapping); 0: none.
  double attn_logit_softcapping = 0, final_logit_softcapping = 0;
  // Attention scores are scaled by query_pre_attn_scalar^-1/2 (Gemma); 0: head_dim^-1/2.
  double query_pre_attn_scalar = 0;
  float attn_scale() const;
  // RoPE base of the sliding-window layers, unscaled (Gemma 3's rope_local_base_freq); the other
  // layers use rope_theta with rope_scaling. 0: every layer uses rope_theta with rope_scaling.
  double rope_local_theta = 0;
  bool local_rope(int64_t layer) const {
    return rope_local_theta > 0 && !sliding_layers.empty() && sliding_layers[size_t(layer)];
  }
  // Attention to the last sliding_window keys only, the query's own included (Mistral v0.1's
  // sliding_window on every layer; Qwen2/Qwen3 with use_sliding_window on the layers that
  // layer_types or max_window_layers name); 0: every earlier key.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;  // per layer: windowed ("sliding_attention"); empty: every layer (when sliding_window > 0)
  // The window layer `layer` attends with (0: none).
  int64_t window_of(int64_t layer) const {
    if (sliding_window <= 0) return 0;
    return sliding_layers.empty() || sliding_layers[size_t(layer)] ? sliding_window : 0;
  }
  // Mixture of experts (mixtral, qwen3_moe): every layer's MLP is n_experts SwiGLU experts of
  // expert_intermediate_size, and a router (n_experts, hidden_size) sends each token to
  // experts_per_tok of them: p = softmax(router logits) in f32, the top experts_per_tok of p,
  // renormalised to sum 1 when norm_topk_prob (Mixtral always; Qwen3-MoE by its key), and the
  // token's output is the sum of the chosen experts' outputs times those weights. 0: dense.
  int64_t n_experts = 0, experts_per_tok = 0, expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  // The router's auxiliary load-balancing loss, as transformers adds it when output_router_logits
  // is set (load_balancing_loss_func over every layer's router logits of a forward, padding left
  // out): aux = E * sum_e f_e P_e, f_e the share of the (token, choice) pairs routed to expert e
  // per token-layer, P_e the mean router probability; the training loss adds this coefficient
  // (router_aux_loss_coef) times aux. 0: not added (output_router_logits false).
  double router_aux_loss_coef = 0;
  bool moe() const { return n_experts > 0; }
  // The format the checkpoint ships its experts in ("mxfp4": gpt-oss), "" = as the other weights.
  std::string experts_stored;
  // gpt-oss (GptOssForCausalLM): a learned logit per attention head that joins each row's softmax
  // and attends to nothing (self_attn.sinks); a bias on o_proj besides q/k/v's; biases on the
  // router's logits and on each expert's gate, up and down outputs (the checkpoint's
  // gate_up_proj_bias interleaves gate's and up's, as its gate_up_proj does); the experts'
  // activation is then Activation::ClampedSwiglu with these constants.
  bool attention_sinks = false, o_proj_bias = false, moe_biases = false;
  ClampedSwigluParams swiglu_clamp;
  // Parameters besides the projections, norms and experts' weights (gpt-oss's sinks and its o_proj,
  // expert and router biases), per layer and per expert of a layer: counted by n_params (an idle
  // expert's not by active_params).
  int64_t extra_params_per_layer = 0, extra_params_per_expert = 0;
  int64_t bos_token_id = -1, eos_token_id = -1;
  int64_t pad_token_id = -1;  // a GGUF's tokenizer.ggml.padding_token_id, for the config.json hf_config_json writes
  std::string torch_dtype = "float32";
  std::string name;                // preset name or source path, for messages
  // The text model of a multimodal checkpoint (its config.json's model_type, "gemma3":
  // Gemma3ForConditionalGeneration, this config read from its text_config), "" for a text-only
  // model. Its weights sit under "language_model." in the files and its modules under
  // "model.language_model." in transformers (the LoRA keys PEFT writes); the vision tower is not
  // loaded: the engine trains the text model.
  std::string multimodal;

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
  // Parameter count of the base model (embeddings + layers + norm + untied head), every expert counted.
  int64_t n_params() const;
  // Those a token computes with: the chosen experts only (n_params() for a dense model).
  int64_t active_params() const;
  // Throws Error(Config) naming the field when the shape is inconsistent.
  void validate(const std::string& where) const;
};

// Supported HF model_type values.
const std::vector<std::string>& supported_model_types();

// Parses a Hugging Face config.json (path to the file). Errors name the file and key.
LlamaConfig load_hf_config(const std::string& config_json_path);
// Same, from JSON text; `where` is used in error messages.
LlamaConfig parse_hf_config(const std::string& json_text, const std::string& where);
// The inverse, for a model known only by its LlamaConfig (a GGUF base): the config.json keys
// transformers' LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config read, with torch_dtype = `torch_dtype`.
nlohmann::json hf_config_json(const LlamaConfig& cfg, const std::string& torch_dtype);

// Built-in presets of real model shapes (llama3-8b, llama3-70b, llama3.1-405b, llama3.2-1b,
// llama3.2-3b, mistral-7b, qwen2.5-7b, qwen3-0.6b ... qwen3-32b, smollm2-135m, ...).
const std::vector<std::string>& preset_names();
bool has_preset(const std::string& name);
LlamaConfig preset_config(const std::string& name);  // Error(Config) with closest name when unknown

// What every gpt-oss shares, from its experts and shape: sinks, the biases, the clamped SwiGLU
// activation, expert width = intermediate_size, the even layers sliding (config.json, the presets
// and a GGUF of llama.cpp's gpt-oss architecture all end with it).
void apply_gpt_oss_layout(LlamaConfig& c);

// A training setting's load-balancing loss coefficient in place of the model's own (0: none), as
// transformers computes the loss with output_router_logits on. Error(Config) naming `key` for a
// model without experts.
void override_router_aux_loss_coef(LlamaConfig& c, double coef, const std::string& key);

// YaRN's magnitude scale as transformers computes it (get_mscale): 0.1 m ln(factor) + 1, 1 for
// factor <= 1. Its attention_factor, where a config names none, is yarn_mscale(factor, 1).
double yarn_mscale(double factor, double m);
// Whether a YaRN scaling's attention_factor is the one derived from its factor alone (what a
// config without attention_factor, mscale and mscale_all_dim gets, and what llama.cpp applies).
bool yarn_attention_factor_is_derived(const RopeScaling& r);

// RoPE inverse frequencies (rope_dim()/2) including linear / llama3 scaling, as transformers computes
// them; LongRoPE's short ones (`long_factors`: its long ones).
std::vector<float> rope_inv_freq(const LlamaConfig& c, bool long_factors = false);
// LongRoPE's attention_factor where the config has none, as transformers derives it:
// sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) for factor > 1, else 1.
double longrope_attention_factor(double factor, int64_t original_max_position_embeddings);
// The factor RoPE multiplies cos and sin by (LongRoPE's and YaRN's attention_factor; 1 otherwise).
float rope_attention_scale(const LlamaConfig& c);
// Whether a forward whose largest position is `max_position` rotates with LongRoPE's long factors.
bool rope_uses_long_factors(const LlamaConfig& c, int64_t max_position);
// Those of the sliding-window layers of a model with rope_local_theta: that base, no scaling.
std::vector<float> rope_local_inv_freq(const LlamaConfig& c);

}  // namespace qlora
