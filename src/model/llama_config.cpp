// LlamaConfig: HF config.json parsing, validation and parameter count.
#include "model/llama_config.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/strings.h"
#include "io/json_util.h"

namespace qlora {

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> v = {"llama",       "mistral", "qwen2",   "qwen3",     "gemma2", "gemma3_text",
                                             "gemma3",      "phi3",    "mixtral", "qwen3_moe", "gpt_oss"};
  return v;
}


// ---------------------------------------------------------------------------------------------------
// validate / n_params

constexpr int64_t kMaxHeadDim = 4096;

void LlamaConfig::validate(const std::string& where) const {
  auto positive = [&](int64_t v, const char* key) {
    if (v <= 0) fail(ErrorKind::Config, where + ": key '" + key + "'", "must be positive, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(n_layer, "num_hidden_layers");
  positive(n_head, "num_attention_heads");
  positive(n_head_kv, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(max_position_embeddings, "max_position_embeddings");
  if (n_head % n_head_kv != 0)
    fail(ErrorKind::Config, where + ": key 'num_key_value_heads'",
         std::to_string(n_head) + " attention heads are not a multiple of " + std::to_string(n_head_kv) +
             " key/value heads",
         "grouped-query attention shares each kv head among n_head / n_head_kv query heads");
  if (head_dim % 2 != 0)
    fail(ErrorKind::Config, where + ": key 'head_dim'", "must be even for RoPE, got " + std::to_string(head_dim));
  // The largest heads in use are 256 wide (Gemma 2/3); a per-head buffer (RoPE's frequencies, the
  // attention's rows) is sized by it before any weight is read.
  if (head_dim > kMaxHeadDim)
    fail(ErrorKind::Config, where + ": key 'head_dim'",
         "must be at most " + std::to_string(kMaxHeadDim) + ", got " + std::to_string(head_dim));
  if (moe()) {
    positive(experts_per_tok, "num_experts_per_tok");
    positive(expert_intermediate_size, model_type == "qwen3_moe" ? "moe_intermediate_size" : "intermediate_size");
    if (experts_per_tok > n_experts)
      fail(ErrorKind::Config, where + ": key 'num_experts_per_tok'",
           std::to_string(experts_per_tok) + " experts per token of " + std::to_string(n_experts));
  }
  if (!(rms_norm_eps > 0)) fail(ErrorKind::Config, where + ": key 'rms_norm_eps'", "must be positive");
  if (!(rope_theta > 0)) fail(ErrorKind::Config, where + ": key 'rope_theta'", "must be positive");
  if (rope_scaling.type != "none" && !(rope_scaling.factor > 0))
    fail(ErrorKind::Config, where + ": key 'rope_scaling.factor'", "must be positive");
  if (rotary_dim != 0 && (rotary_dim < 2 || rotary_dim > head_dim || rotary_dim % 2 != 0))
    fail(ErrorKind::Config, where + ": key 'partial_rotary_factor'",
         "gives " + std::to_string(rotary_dim) + " rotary dims of head_dim " + std::to_string(head_dim) +
             "; RoPE needs an even number of them, at most head_dim");
  if (rope_scaling.type == "yarn" && !(rope_theta > 1))
    fail(ErrorKind::Config, where + ": key 'rope_theta'", "YaRN's ramp needs a RoPE base above 1");
  if (rope_scaling.type == "longrope")
    for (const auto* f : {&rope_scaling.short_factor, &rope_scaling.long_factor})
      if (int64_t(f->size()) != rope_dim() / 2)
        fail(ErrorKind::Config, where + ": key 'rope_scaling." + (f == &rope_scaling.short_factor ? "short" : "long") + "_factor'",
             "has " + std::to_string(f->size()) + " entries; LongRoPE needs one per rotary frequency (" +
                 std::to_string(rope_dim() / 2) + ")");
  if (rope_scaling.type == "llama3") {
    if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) || !(rope_scaling.low_freq_factor > 0))
      fail(ErrorKind::Config, where + ": key 'rope_scaling'", "llama3 scaling needs 0 < low_freq_factor < high_freq_factor");
    if (rope_scaling.original_max_position_embeddings <= 0)
      fail(ErrorKind::Config, where + ": key 'rope_scaling.original_max_position_embeddings'", "must be positive");
  }
}

int64_t LlamaConfig::n_params() const {
  const int64_t C = hidden_size, F = intermediate_size, V = vocab_size;
  int64_t attn = C * q_dim() + 2 * C * kv_dim() + q_dim() * C;  // q, k, v, o
  if (attention_bias) attn += q_dim() + 2 * kv_dim();            // q/k/v biases (o has none)
  if (qk_norm) attn += 2 * head_dim;                              // q_norm, k_norm
  // + gate/up/down (every expert's, and the router) + 2 (or 4) norms
  const int64_t mlp = moe() ? n_experts * 3 * C * expert_intermediate_size + n_experts * C : 3 * C * F;
  int64_t layer = attn + mlp + (sandwich_norms ? 4 : 2) * C + extra_params_per_layer + n_experts * extra_params_per_expert;
  return V * C + n_layer * layer + C + (tie_word_embeddings ? 0 : V * C);
}

int64_t LlamaConfig::active_params() const {
  if (!moe()) return n_params();
  return n_params() - n_layer * (n_experts - experts_per_tok) * (3 * hidden_size * expert_intermediate_size + extra_params_per_expert);
}

float LlamaConfig::attn_scale() const {
  return float(1.0 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar : double(head_dim)));
}

// ---------------------------------------------------------------------------------------------------
// config.json

// bos/eos may be an int, a list of ints (take the first) or null.
static int64_t token_id(const json& j, const char* key, const std::string& where) {
  const json* v = json_find(j, key);
  if (!v) return -1;
  if (v->is_array()) {
    if (v->empty()) return -1;
    if (!(*v)[0].is_number_integer())
      fail(ErrorKind::Config, where + ": key '" + key + "'", "expected an integer or a list of integers");
    return (*v)[0].get<int64_t>();
  }
  return json_int(j, key, where);
}

// A list of positive numbers (LongRoPE's short_factor / long_factor).
static std::vector<double> positive_numbers(const json& obj, const char* key, const std::string& sub) {
  const json* v = json_find(obj, key);
  if (!v || !v->is_array())
    fail(ErrorKind::Config, sub + ": key '" + key + "'", "LongRoPE needs a list of numbers");
  std::vector<double> out;
  for (size_t i = 0; i < v->size(); i++) {
    const json& x = (*v)[i];
    if (!x.is_number() || !(x.get<double>() > 0))
      fail(ErrorKind::Config, sub + ": key '" + std::string(key) + "[" + std::to_string(i) + "]'",
           "expected a positive number, got " + x.dump());
    out.push_back(x.get<double>());
  }
  return out;
}

// `allow_yarn`, `allow_longrope`: the families whose parse resolves them afterwards (resolve_rope_scaling).
static RopeScaling parse_rope_scaling(const json& rs, const std::string& key, const std::string& where,
                                      bool allow_yarn = false, bool allow_longrope = false) {
  RopeScaling r;
  const std::string kw = where + ": key '" + key + "'";
  if (!rs.is_object()) fail(ErrorKind::Config, kw, std::string("expected an object or null, got ") + json_type_name(rs));
  std::string type = json_string_or(rs, "rope_type", "", where + ": " + key);
  if (type.empty()) type = json_string_or(rs, "type", "", where + ": " + key);
  if (type.empty()) fail(ErrorKind::Config, kw, "has no 'rope_type' (or 'type')");
  if (type == "default") return r;
  const std::string sub = where + ": " + key;
  if (type == "linear") {
    r.type = "linear";
    r.factor = json_number(rs, "factor", sub);
  } else if (type == "yarn" && allow_yarn) {
    r.type = "yarn";
    r.factor = json_number(rs, "factor", sub);
    // Resolved by resolve_rope_scaling: 0 = not in this object.
    r.original_max_position_embeddings = json_int_or(rs, "original_max_position_embeddings", 0, sub);
    r.attention_factor = json_number_or(rs, "attention_factor", 0.0, sub);
    r.mscale = json_number_or(rs, "mscale", 0.0, sub);
    r.mscale_all_dim = json_number_or(rs, "mscale_all_dim", 0.0, sub);
    r.beta_fast = json_number_or(rs, "beta_fast", 0.0, sub);  // transformers: `or 32`, `or 1`
    r.beta_slow = json_number_or(rs, "beta_slow", 0.0, sub);
    if (r.beta_fast == 0) r.beta_fast = 32;
    if (r.beta_slow == 0) r.beta_slow = 1;
    r.truncate = json_bool_or(rs, "truncate", true, sub);
  } else if (type == "longrope" && allow_longrope) {
    r.type = "longrope";
    r.short_factor = positive_numbers(rs, "short_factor", sub);
    r.long_factor = positive_numbers(rs, "long_factor", sub);
    // Resolved against the config's other keys by resolve_longrope: 0 = not in this object.
    r.factor = json_number_or(rs, "factor", 0.0, sub);
    r.attention_factor = json_number_or(rs, "attention_factor", 0.0, sub);
    r.original_max_position_embeddings = json_int_or(rs, "original_max_position_embeddings", 0, sub);
  } else if (type == "llama3") {
    r.type = "llama3";
    r.factor = json_number(rs, "factor", sub);
    r.low_freq_factor = json_number(rs, "low_freq_factor", sub);
    r.high_freq_factor = json_number(rs, "high_freq_factor", sub);
    r.original_max_position_embeddings = json_int(rs, "original_max_position_embeddings", sub);
  } else {
    fail(ErrorKind::Unsupported, where + ": key '" + key + ".rope_type'", "RoPE scaling '" + type + "' is not supported",
         std::string("supported: linear, llama3") + (allow_longrope ? ", longrope, yarn" : "") + " (or none)");
  }
  return r;
}

// LongRoPE and YaRN as transformers resolves them (modeling_rope_utils: standardize_rope_params,
// _compute_longrope_parameters, _compute_yarn_parameters): original_max_position_embeddings from
// the top level of the config (Phi-3 writes it there) before the RoPE object's, else
// max_position_embeddings. LongRoPE: factor, when the object has none, max_position_embeddings
// over it; attention_factor, when the object has none, sqrt(1 + ln(factor) / ln(original)) for
// factor > 1, else 1. YaRN: attention_factor, when the object has none, mscale(factor, mscale) /
// mscale(factor, mscale_all_dim) when it has both, else mscale(factor) = 0.1 ln(factor) + 1.
static void resolve_rope_scaling(const json& j, LlamaConfig& c, const std::string& where) {
  RopeScaling& r = c.rope_scaling;
  if (r.type != "yarn" && r.type != "longrope") return;
  if (json_find(j, "original_max_position_embeddings"))
    r.original_max_position_embeddings = json_int(j, "original_max_position_embeddings", where);
  else if (r.original_max_position_embeddings <= 0)
    r.original_max_position_embeddings = c.max_position_embeddings;
  if (r.original_max_position_embeddings <= 0)
    fail(ErrorKind::Config, where + ": key 'original_max_position_embeddings'", "must be positive");
  if (r.type == "yarn") {
    if (r.attention_factor <= 0)
      r.attention_factor = r.mscale != 0 && r.mscale_all_dim != 0
                               ? yarn_mscale(r.factor, r.mscale) / yarn_mscale(r.factor, r.mscale_all_dim)
                               : yarn_mscale(r.factor, 1.0);
    return;
  }
  if (r.factor <= 0) r.factor = double(c.max_position_embeddings) / double(r.original_max_position_embeddings);
  if (r.attention_factor <= 0) r.attention_factor = longrope_attention_factor(r.factor, r.original_max_position_embeddings);
}

void override_router_aux_loss_coef(LlamaConfig& c, double coef, const std::string& key) {
  if (!c.moe())
    fail(ErrorKind::Config, key, "model '" + c.name + "' has no experts: there is no router to balance",
         "remove it (it applies to mixtures of experts)");
  c.router_aux_loss_coef = coef;
}

// layer_types as transformers reads them: one "sliding_attention" / "full_attention" per layer.
static std::vector<bool> sliding_layer_types(const json& lt, int64_t n_layer, const std::string& where) {
  if (!lt.is_array()) fail(ErrorKind::Config, where + ": key 'layer_types'", "expected a list of strings");
  if (int64_t(lt.size()) != n_layer)
    fail(ErrorKind::Config, where + ": key 'layer_types'",
         "has " + std::to_string(lt.size()) + " entries for " + std::to_string(n_layer) + " layers");
  std::vector<bool> layers(lt.size());
  for (size_t i = 0; i < lt.size(); i++) {
    const json& t = lt[i];
    if (!t.is_string() || (t.get<std::string>() != "sliding_attention" && t.get<std::string>() != "full_attention"))
      fail(ErrorKind::Unsupported, where + ": key 'layer_types[" + std::to_string(i) + "]'",
           "expected \"full_attention\" or \"sliding_attention\", got " + t.dump());
    layers[i] = t.get<std::string>() == "sliding_attention";
  }
  return layers;
}

// Gemma 2 (Gemma2Config) and Gemma 3's text model (Gemma3TextConfig): (1 + w) norms on both sides
// of each block, embeddings scaled by sqrt(hidden), GeGLU, query_pre_attn_scalar, sliding-window
// layers (layer_types, else every other layer global in Gemma 2, every sliding_window_pattern-th in
// Gemma 3). Gemma 2: logit soft-capping of the attention scores and of the final logits, one RoPE.
// Gemma 3: q/k norms, no soft-capping, the sliding layers with their own RoPE base.
static void parse_gemma(const json& j, LlamaConfig& c, const std::string& where) {
  const bool gemma2 = c.model_type == "gemma2";
  c.norm_unit_offset = c.sandwich_norms = c.scale_embeddings = true;
  c.qk_norm = !gemma2;
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    const bool attn = key[0] == 'a';
    double cap = 0;
    if (!j.contains(key)) cap = gemma2 ? (attn ? 50.0 : 30.0) : 0.0;  // Gemma2Config's defaults; Gemma 3 has none
    else if (!j.at(key).is_null()) cap = json_number(j, key, where);  // null: off
    if (cap < 0) fail(ErrorKind::Config, where + ": key '" + std::string(key) + "'", "must be positive or null");
    (attn ? c.attn_logit_softcapping : c.final_logit_softcapping) = cap;
  }
  if (json_bool_or(j, "use_bidirectional_attention", false, where))
    fail(ErrorKind::Unsupported, where + ": key 'use_bidirectional_attention'", "only causal attention is implemented");
  if (json_bool_or(j, "attention_bias", false, where))
    fail(ErrorKind::Unsupported, where + ": key 'attention_bias'", c.model_type + " attention biases (q/k/v/o) are not supported");
  c.query_pre_attn_scalar = json_number_or(j, "query_pre_attn_scalar", 256.0, where);
  if (!(c.query_pre_attn_scalar > 0))
    fail(ErrorKind::Config, where + ": key 'query_pre_attn_scalar'", "must be positive");
  // Which layers slide: layer_types, else every layer but each sliding_window_pattern-th (default 6).
  std::vector<bool> layers(size_t(std::max<int64_t>(c.n_layer, 0)));
  const json* lt = json_find(j, "layer_types");
  if (lt && !lt->is_null()) {
    layers = sliding_layer_types(*lt, c.n_layer, where);
  } else {
    const int64_t pattern = gemma2 ? 2 : json_int_or(j, "sliding_window_pattern", 6, where);
    if (pattern <= 0) fail(ErrorKind::Config, where + ": key 'sliding_window_pattern'", "must be positive");
    for (int64_t l = 0; l < c.n_layer; l++) layers[size_t(l)] = (l + 1) % pattern != 0;
  }
  c.sliding_layers = layers;
  const json* sw = json_find(j, "sliding_window");
  c.sliding_window = !sw ? 4096 : sw->is_null() ? 0 : json_int(j, "sliding_window", where);
  if (gemma2) {  // one RoPE for every layer, as the other families
    if (const json* rp = json_find(j, "rope_parameters"); rp && !rp->is_null()) {
      c.rope_theta = json_number_or(*rp, "rope_theta", json_number_or(j, "rope_theta", 10000.0, where), where + ": rope_parameters");
      c.rope_scaling = parse_rope_scaling(*rp, "rope_parameters", where);
    } else {
      c.rope_theta = json_number_or(j, "rope_theta", 10000.0, where);
      if (const json* rs = json_find(j, "rope_scaling"); rs && !rs->is_null())
        c.rope_scaling = parse_rope_scaling(*rs, "rope_scaling", where);
    }
    return;
  }
  // RoPE: transformers 5 writes rope_parameters per layer type; Hub files carry rope_theta (global),
  // rope_local_base_freq and rope_scaling (global layers only).
  // (A file may mix the two: rope_parameters without thetas beside the top-level keys.)
  double local_theta = json_number_or(j, "rope_local_base_freq", 10000.0, where);
  c.rope_theta = json_number_or(j, "rope_theta", 1000000.0, where);
  if (const json* rp = json_find(j, "rope_parameters"); rp && !rp->is_null()) {
    const std::string sub = where + ": rope_parameters";
    if (!rp->is_object()) fail(ErrorKind::Config, where + ": key 'rope_parameters'", "expected an object");
    if (const json* full = json_find(*rp, "full_attention"); full && !full->is_null()) {
      c.rope_theta = json_number_or(*full, "rope_theta", c.rope_theta, sub + ".full_attention");
      c.rope_scaling = parse_rope_scaling(*full, "rope_parameters.full_attention", where);
    }
    if (const json* loc = json_find(*rp, "sliding_attention"); loc && !loc->is_null()) {
      local_theta = json_number_or(*loc, "rope_theta", local_theta, sub + ".sliding_attention");
      if (parse_rope_scaling(*loc, "rope_parameters.sliding_attention", where).type != "none")
        fail(ErrorKind::Unsupported, where + ": key 'rope_parameters.sliding_attention.rope_type'",
             "RoPE scaling on the sliding-window layers is not supported", "released Gemma 3 checkpoints use default");
    }
  } else {
    if (const json* rs = json_find(j, "rope_scaling"); rs && !rs->is_null())
      c.rope_scaling = parse_rope_scaling(*rs, "rope_scaling", where);
  }
  if (!(local_theta > 0)) fail(ErrorKind::Config, where + ": key 'rope_local_base_freq'", "must be positive");
  c.rope_local_theta = local_theta;
}

// Phi-3 / Phi-4 (Phi3Config): fused qkv_proj and gate_up_proj; rotary embeddings on the first
// int(head_dim * partial_rotary_factor) dims of each head (Phi-4-mini: 0.75), the key at the top
// level or in the RoPE object; the dropouts it applies in training mode are refused.
static void parse_phi3(const json& j, LlamaConfig& c, const std::string& where) {
  c.fused_qkv = c.fused_gate_up = true;
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attention_dropout"})
    if (json_number_or(j, key, 0.0, where) != 0.0)
      fail(ErrorKind::Unsupported, where + ": key '" + std::string(key) + "'",
           "dropout inside the base model is not implemented (LoRA dropout is lora_dropout)", "set it to 0.0");
  double partial = json_number_or(j, "partial_rotary_factor", 1.0, where);
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (const json* rp = json_find(j, key); rp && rp->is_object())
      partial = json_number_or(*rp, "partial_rotary_factor", partial, where + ": " + key);
  if (!(partial > 0 && partial <= 1))
    fail(ErrorKind::Config, where + ": key 'partial_rotary_factor'", "must be in (0, 1], got " + std::to_string(partial));
  if (partial != 1.0) {  // transformers: int(head_dim * factor) dims
    c.rotary_dim = int64_t(double(c.head_dim) * partial);
    if (c.rotary_dim < 2)
      fail(ErrorKind::Config, where + ": key 'partial_rotary_factor'",
           "gives " + std::to_string(c.rotary_dim) + " rotary dims of head_dim " + std::to_string(c.head_dim) +
               "; RoPE needs at least one pair");
  }
  if (json_bool_or(j, "attention_bias", false, where))
    fail(ErrorKind::Unsupported, where + ": key 'attention_bias'", "phi3 attention biases are not supported");
}

// output_router_logits adds the load-balancing loss with router_aux_loss_coef (the class's
// default when the file has none).
static void parse_router_aux(const json& j, LlamaConfig& c, const std::string& where, double default_coef) {
  if (!json_bool_or(j, "output_router_logits", false, where)) return;
  c.router_aux_loss_coef = json_number_or(j, "router_aux_loss_coef", default_coef, where);
  if (!(c.router_aux_loss_coef >= 0))
    fail(ErrorKind::Config, where + ": key 'router_aux_loss_coef'", "must be zero or positive");
}

// Mixtral (MixtralConfig) and Qwen3-MoE (Qwen3MoeConfig): the experts and the router. What
// changes the math and is not implemented is refused: the router's jitter noise and Qwen3-MoE's
// dense layers among the sparse ones. output_router_logits adds the load-balancing loss.
static void parse_moe(const json& j, LlamaConfig& c, const std::string& where) {
  const bool mixtral = c.model_type == "mixtral";
  // Qwen3MoeConfig reads num_experts (Hub files) and writes num_local_experts (transformers 5).
  const char* experts_key = mixtral || (!json_find(j, "num_experts") && json_find(j, "num_local_experts"))
                                ? "num_local_experts" : "num_experts";
  c.n_experts = json_int_or(j, experts_key, mixtral ? 8 : 128, where);
  c.experts_per_tok = json_int_or(j, "num_experts_per_tok", mixtral ? 2 : 8, where);
  c.expert_intermediate_size = mixtral ? c.intermediate_size : json_int_or(j, "moe_intermediate_size", 768, where);
  c.norm_topk_prob = mixtral || json_bool_or(j, "norm_topk_prob", false, where);
  if (c.n_experts <= 0)
    fail(ErrorKind::Config, where + ": key '" + std::string(experts_key) + "'",
         "must be positive, got " + std::to_string(c.n_experts));
  if (const json* jn = json_find(j, "router_jitter_noise"); jn && !jn->is_null() && json_number(j, "router_jitter_noise", where) != 0)
    fail(ErrorKind::Unsupported, where + ": key 'router_jitter_noise'",
         "noise on the router's input in training is not implemented", "set it to 0.0");
  parse_router_aux(j, c, where, mixtral ? 0.02 : 0.001);  // MixtralConfig 0.02, Qwen3MoeConfig 0.001
  if (!mixtral) {
    if (json_int_or(j, "decoder_sparse_step", 1, where) != 1)
      fail(ErrorKind::Unsupported, where + ": key 'decoder_sparse_step'", "dense MLP layers between the sparse ones are not implemented");
    if (const json* mo = json_find(j, "mlp_only_layers"); mo && mo->is_array() && !mo->empty())
      fail(ErrorKind::Unsupported, where + ": key 'mlp_only_layers'", "dense MLP layers between the sparse ones are not implemented");
  }
}

// gpt-oss (GptOssConfig): a mixture of experts (softmax over the top-k router logits, the same
// weights as softmax then top-k renormalised) with learned attention sinks, biases on q/k/v/o, the
// router and the experts, the clamped SwiGLU (alpha, limit) and alternating sliding windows; YaRN
// RoPE, untruncated.
// What every gpt-oss shares, from its experts and shape (config.json and the presets).
void apply_gpt_oss_layout(LlamaConfig& c) {
  c.expert_intermediate_size = c.intermediate_size;
  c.norm_topk_prob = true;
  c.attention_bias = c.o_proj_bias = c.attention_sinks = c.moe_biases = true;
  c.hidden_act = Activation::ClampedSwiglu;
  c.extra_params_per_layer = c.n_head + c.hidden_size + c.n_experts;  // sinks, o_proj's bias, the router's
  c.extra_params_per_expert = 2 * c.intermediate_size + c.hidden_size;  // gate_up's and down's biases
  c.sliding_layers.assign(size_t(std::max<int64_t>(c.n_layer, 0)), false);  // GptOssConfig: the even layers slide
  for (int64_t l = 0; l < c.n_layer; l++) c.sliding_layers[size_t(l)] = (l + 1) % 2 != 0;
}

static void parse_gpt_oss(const json& j, LlamaConfig& c, const std::string& where) {
  c.n_experts = json_int_or(j, "num_local_experts", 128, where);
  c.experts_per_tok = json_int_or(j, "num_experts_per_tok", json_int_or(j, "experts_per_token", 4, where), where);
  apply_gpt_oss_layout(c);
  c.attention_bias = c.o_proj_bias = json_bool_or(j, "attention_bias", true, where);  // q/k/v/o together
  if (json_number_or(j, "attention_dropout", 0.0, where) != 0.0)
    fail(ErrorKind::Unsupported, where + ": key 'attention_dropout'",
         "dropout inside the base model is not implemented (LoRA dropout is lora_dropout)", "set it to 0.0");
  // GptOssConfig's swiglu_alpha (the Hub's files leave it to the code's 1.702) and swiglu_limit.
  c.swiglu_clamp.alpha = float(json_number_or(j, "swiglu_alpha", 1.702, where));
  c.swiglu_clamp.limit = float(json_number_or(j, "swiglu_limit", 7.0, where));
  if (!(c.swiglu_clamp.limit > 0) || !std::isfinite(c.swiglu_clamp.limit))
    fail(ErrorKind::Config, where + ": key 'swiglu_limit'", "must be positive and finite");
  if (!std::isfinite(c.swiglu_clamp.alpha)) fail(ErrorKind::Config, where + ": key 'swiglu_alpha'", "must be finite");
  parse_router_aux(j, c, where, 0.001);  // GptOssConfig: 0.001
  if (const json* q = json_find(j, "quantization_config");
      q && q->is_object() && json_string_or(*q, "quant_method", "", where) == "mxfp4")
    c.experts_stored = "mxfp4";
  const json* sw = json_find(j, "sliding_window");
  c.sliding_window = sw && !sw->is_null() ? json_int(j, "sliding_window", where) : 0;
  if (const json* lt = json_find(j, "layer_types"); lt && !lt->is_null())
    c.sliding_layers = sliding_layer_types(*lt, c.n_layer, where);
  c.rope_theta = json_number_or(j, "rope_theta", 150000.0, where);
  const json* rp = json_find(j, "rope_parameters");
  if (!rp || rp->is_null()) rp = json_find(j, "rope_scaling");
  if (rp && !rp->is_null()) {
    c.rope_theta = json_number_or(*rp, "rope_theta", c.rope_theta, where + ": rope_parameters");
    c.rope_scaling = parse_rope_scaling(*rp, "rope_parameters", where, true);
    resolve_rope_scaling(j, c, where);
  }
}

// Gemma3ForConditionalGeneration (model_type gemma3): the text model's config is its text_config,
// whose missing keys take Gemma3TextConfig's defaults (the Hub's 4b/12b/27b files list only what
// differs); the token ids, dtype and tie_word_embeddings the file keeps at the top apply to it.
static LlamaConfig parse_gemma3_multimodal(const json& j, const std::string& where) {
  const json* tc = json_find(j, "text_config");
  if (!tc || !tc->is_object())
    fail(ErrorKind::Config, where + ": key 'text_config'", "a gemma3 (multimodal) config needs its text model's config",
         "is this a Gemma 3 checkpoint? its config.json has text_config and vision_config");
  json t = *tc;
  static const std::pair<const char*, int64_t> kDefaults[] = {
      {"vocab_size", 262208},      {"hidden_size", 2304},       {"intermediate_size", 9216}, {"num_hidden_layers", 26},
      {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"head_dim", 256}};
  for (const auto& [key, value] : kDefaults)
    if (!json_find(t, key)) t[key] = value;
  if (!json_find(t, "model_type")) t["model_type"] = "gemma3_text";
  for (const char* key : {"bos_token_id", "eos_token_id", "torch_dtype", "dtype", "tie_word_embeddings"})
    if (!json_find(t, key) && json_find(j, key)) t[key] = j.at(key);
  const std::string sub = where + ": text_config";
  if (json_string(t, "model_type", sub) != "gemma3_text")
    fail(ErrorKind::Unsupported, sub + ": key 'model_type'", "a gemma3 checkpoint's text model must be gemma3_text");
  LlamaConfig c = parse_hf_config(t.dump(), sub);
  c.name = where;
  c.multimodal = "gemma3";
  return c;
}

// model_type, one of supported_model_types().
static std::string parse_model_type(const json& j, const std::string& where) {
  std::string model_type = json_string(j, "model_type", where);
  const auto& types = supported_model_types();
  if (std::find(types.begin(), types.end(), model_type) == types.end())
    fail(ErrorKind::Unsupported, where + ": key 'model_type'", "model_type '" + model_type + "' is not supported",
         "supported model types: " + join_commas(types));
  return model_type;
}

// The MLP: its activation (the family's only) and no biases.
static void parse_mlp_activation(const json& j, LlamaConfig& c, const std::string& where, bool gemma) {
  // Gemma's config names it hidden_activation (gelu_pytorch_tanh); the others hidden_act (silu).
  const char* act_key = gemma && json_find(j, "hidden_activation") ? "hidden_activation" : "hidden_act";
  const std::string act = json_string_or(j, act_key, gemma ? "gelu_pytorch_tanh" : "silu", where);
  if (act == (gemma ? "gelu_pytorch_tanh" : "silu"))
    c.hidden_act = gemma ? Activation::GeluTanh : Activation::Silu;
  else
    fail(ErrorKind::Unsupported, where + ": key '" + std::string(act_key) + "'",
         "activation '" + act + "' is not supported for " + c.model_type,
         gemma ? c.model_type + ": gelu_pytorch_tanh (GeGLU)" : "only silu (SwiGLU)");
  if (json_bool_or(j, "mlp_bias", false, where))
    fail(ErrorKind::Unsupported, where + ": key 'mlp_bias'", "MLP biases are not supported");
}

// head_dim: the key, else the family's default, else hidden_size / num_attention_heads.
static int64_t parse_head_dim(const json& j, const LlamaConfig& c, const std::string& where, bool gemma) {
  const bool qwen3 = c.model_type == "qwen3" || c.model_type == "qwen3_moe";  // Qwen3's attention
  if (json_find(j, "head_dim") && !(*json_find(j, "head_dim")).is_null()) return json_int(j, "head_dim", where);
  if (qwen3) return 128;  // Qwen3Config's default
  if (gemma) return 256;  // Gemma2Config's and Gemma3TextConfig's default
  if (c.hidden_size % c.n_head != 0)
    fail(ErrorKind::Config, where + ": key 'hidden_size'",
         std::to_string(c.hidden_size) + " is not divisible by num_attention_heads " + std::to_string(c.n_head),
         "set head_dim explicitly if the model uses a head size other than hidden_size / heads");
  return c.hidden_size / c.n_head;
}

// The decoder's sizes: vocabulary, widths, layers, heads.
static void parse_dimensions(const json& j, LlamaConfig& c, const std::string& where, bool gemma) {
  c.vocab_size = json_int(j, "vocab_size", where);
  c.hidden_size = json_int(j, "hidden_size", where);
  c.intermediate_size = json_int(j, "intermediate_size", where);
  c.n_layer = json_int(j, "num_hidden_layers", where);
  c.n_head = json_int(j, "num_attention_heads", where);
  c.n_head_kv = json_int_or(j, "num_key_value_heads", c.n_head, where);
  if (c.n_head <= 0)
    fail(ErrorKind::Config, where + ": key 'num_attention_heads'", "must be positive, got " + std::to_string(c.n_head));
  c.head_dim = parse_head_dim(j, c, where, gemma);
}

// The context length, the norms' eps and the tied head.
static void parse_context_and_norms(const json& j, LlamaConfig& c, const std::string& where, bool gemma) {
  // Defaults are those of the transformers config classes when the key is absent.
  const bool llama = c.model_type == "llama";
  const bool phi3 = c.model_type == "phi3";
  c.max_position_embeddings = json_int_or(j, "max_position_embeddings",
                                          llama || phi3    ? (phi3 ? 4096 : 2048)
                                          : gemma         ? (c.model_type == "gemma2" ? 8192 : 131072)
                                          : c.model_type == "mistral" || c.model_type == "mixtral" ? 131072
                                                           : 32768,
                                          where);
  c.rms_norm_eps = json_number_or(j, "rms_norm_eps", c.model_type == "mixtral" ? 1e-5 : 1e-6, where);
  c.tie_word_embeddings = json_bool_or(j, "tie_word_embeddings", gemma, where);
}

// The RoPE base and scaling of the families without their own RoPE layout (all but Gemma and gpt-oss).
static void parse_rope(const json& j, LlamaConfig& c, const std::string& where) {
  // transformers >= 5 writes theta and scaling together as "rope_parameters"; older files use
  // rope_theta + rope_scaling.
  if (const json* rp = json_find(j, "rope_parameters")) {
    c.rope_theta = json_number_or(*rp, "rope_theta", json_number_or(j, "rope_theta", 10000.0, where), where + ": rope_parameters");
    c.rope_scaling = parse_rope_scaling(*rp, "rope_parameters", where, true, true);
  } else {
    c.rope_theta = json_number_or(j, "rope_theta", 10000.0, where);
    if (const json* rs = json_find(j, "rope_scaling"); rs && !rs->is_null())
      c.rope_scaling = parse_rope_scaling(*rs, "rope_scaling", where, true, true);
  }
  resolve_rope_scaling(j, c, where);
}

// What the attention of Qwen2, Qwen3 (and Qwen3-MoE) and Llama always has or refuses.
static void parse_attention_family(const json& j, LlamaConfig& c, const std::string& where) {
  const bool qwen3 = c.model_type == "qwen3" || c.model_type == "qwen3_moe";  // Qwen3's attention
  if (c.model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2 always has q/k/v biases; its config has no key for it
  } else if (qwen3) {
    c.qk_norm = true;  // Qwen3Attention: q_norm and k_norm over each head, always
    // Qwen3Config's attention_bias gives q, k, v and o biases; released checkpoints have none.
    if (json_bool_or(j, "attention_bias", false, where))
      fail(ErrorKind::Unsupported, where + ": key 'attention_bias'", "qwen3 attention biases (q/k/v/o) are not supported");
  } else if (c.model_type == "llama") {
    // LlamaAttention gives o_proj a bias too when attention_bias is set; nothing we load uses it.
    if (json_bool_or(j, "attention_bias", false, where))
      fail(ErrorKind::Unsupported, where + ": key 'attention_bias'", "llama attention biases (q/k/v/o) are not supported");
  }
}

// The sliding window of the families without their own layout (all but Gemma and gpt-oss).
static void parse_sliding_window(const json& j, LlamaConfig& c, const std::string& where) {
  const bool qwen3 = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  const bool phi3 = c.model_type == "phi3";
  // Mistral's sliding_window (non-null in v0.1: 4096; MistralAttention applies it to every layer).
  // Qwen2 and Qwen3 apply theirs only with use_sliding_window, to the layers from
  // max_window_layers (default 28) on, or to the layers `layer_types` marks "sliding_attention".
  const json* sw = json_find(j, "sliding_window");
  const bool sw_set = sw && !sw->is_null();
  if ((c.model_type == "mistral" || c.model_type == "mixtral" || phi3) && sw_set) {  // Phi3Attention: the window on every layer
    c.sliding_window = json_int(j, "sliding_window", where);
  } else if ((c.model_type == "qwen2" || qwen3) && sw_set) {
    // transformers: layer_types when the file has them, else use_sliding_window on the layers from
    // max_window_layers on.
    std::vector<bool> layers(size_t(std::max<int64_t>(c.n_layer, 0)), false);
    const json* lt = json_find(j, "layer_types");
    if (lt && lt->is_array()) {
      layers = sliding_layer_types(*lt, c.n_layer, where);
    } else if (json_bool_or(j, "use_sliding_window", false, where)) {
      const int64_t from = json_int_or(j, "max_window_layers", 28, where);
      for (int64_t l = std::max<int64_t>(from, 0); l < c.n_layer; l++) layers[size_t(l)] = true;
    }
    if (std::find(layers.begin(), layers.end(), true) != layers.end()) {
      c.sliding_window = json_int(j, "sliding_window", where);
      c.sliding_layers = layers;
    }
  }
  if (c.sliding_window < 0)
    fail(ErrorKind::Config, where + ": key 'sliding_window'", "must be positive or null, got " + std::to_string(c.sliding_window));
}

// bos/eos (`bos`, `eos` where the file has no key) and the checkpoint's dtype (`dtype` where it has none).
static void parse_token_ids_and_dtype(const json& j, LlamaConfig& c, const std::string& where, int64_t bos, int64_t eos,
                                      const char* dtype) {
  c.bos_token_id = json_find(j, "bos_token_id") ? token_id(j, "bos_token_id", where) : bos;
  c.eos_token_id = json_find(j, "eos_token_id") ? token_id(j, "eos_token_id", where) : eos;
  c.torch_dtype = json_string_or(j, "torch_dtype", json_string_or(j, "dtype", dtype, where), where);
}

LlamaConfig parse_hf_config(const std::string& json_text, const std::string& where) {
  json j = parse_json(json_text, where);
  if (!j.is_object()) fail(ErrorKind::Config, where, std::string("expected a JSON object, got ") + json_type_name(j));
  LlamaConfig c;
  c.name = where;
  c.model_type = parse_model_type(j, where);
  if (c.model_type == "gemma3") return parse_gemma3_multimodal(j, where);

  const bool gemma = c.model_type == "gemma3_text" || c.model_type == "gemma2";  // the Gemma layout
  parse_mlp_activation(j, c, where, gemma);
  parse_dimensions(j, c, where, gemma);
  parse_context_and_norms(j, c, where, gemma);
  if (gemma) {
    parse_gemma(j, c, where);
    parse_token_ids_and_dtype(j, c, where, 2, 1, "float32");
    c.validate(where);
    return c;
  }

  if (c.model_type == "gpt_oss") {
    parse_gpt_oss(j, c, where);
    parse_token_ids_and_dtype(j, c, where, -1, -1, "bfloat16");
    c.validate(where);
    return c;
  }
  parse_rope(j, c, where);

  if (c.model_type == "phi3") parse_phi3(j, c, where);
  if (c.model_type == "mixtral" || c.model_type == "qwen3_moe") parse_moe(j, c, where);
  parse_attention_family(j, c, where);
  parse_sliding_window(j, c, where);

  parse_token_ids_and_dtype(j, c, where, -1, -1, "float32");  // token_id's -1 where a key is absent
  c.validate(where);
  return c;
}

LlamaConfig load_hf_config(const std::string& config_json_path) {
  return parse_hf_config(read_text_file(config_json_path), config_json_path);
}

}  // namespace qlora
