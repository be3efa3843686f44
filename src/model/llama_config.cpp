// LlamaConfig: HF config.json parsing, validation, parameter count, presets and RoPE frequencies.
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

static std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
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

double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

bool yarn_attention_factor_is_derived(const RopeScaling& r) {
  return std::fabs(r.attention_factor - yarn_mscale(r.factor, 1.0)) <= 1e-12 * r.attention_factor;
}

double longrope_attention_factor(double factor, int64_t original_max_position_embeddings) {
  return factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(double(original_max_position_embeddings)));
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

LlamaConfig parse_hf_config(const std::string& json_text, const std::string& where) {
  json j = parse_json(json_text, where);
  if (!j.is_object()) fail(ErrorKind::Config, where, std::string("expected a JSON object, got ") + json_type_name(j));
  LlamaConfig c;
  c.name = where;
  c.model_type = json_string(j, "model_type", where);
  const auto& types = supported_model_types();
  if (std::find(types.begin(), types.end(), c.model_type) == types.end())
    fail(ErrorKind::Unsupported, where + ": key 'model_type'", "model_type '" + c.model_type + "' is not supported",
         "supported model types: " + joined(types));
  if (c.model_type == "gemma3") return parse_gemma3_multimodal(j, where);

  const bool gemma = c.model_type == "gemma3_text" || c.model_type == "gemma2";  // the Gemma layout
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

  c.vocab_size = json_int(j, "vocab_size", where);
  c.hidden_size = json_int(j, "hidden_size", where);
  c.intermediate_size = json_int(j, "intermediate_size", where);
  c.n_layer = json_int(j, "num_hidden_layers", where);
  c.n_head = json_int(j, "num_attention_heads", where);
  c.n_head_kv = json_int_or(j, "num_key_value_heads", c.n_head, where);
  if (c.n_head <= 0)
    fail(ErrorKind::Config, where + ": key 'num_attention_heads'", "must be positive, got " + std::to_string(c.n_head));
  const bool qwen3 = c.model_type == "qwen3" || c.model_type == "qwen3_moe";  // Qwen3's attention
  if (json_find(j, "head_dim") && !(*json_find(j, "head_dim")).is_null()) {
    c.head_dim = json_int(j, "head_dim", where);
  } else if (qwen3) {
    c.head_dim = 128;  // Qwen3Config's default
  } else if (gemma) {
    c.head_dim = 256;  // Gemma2Config's and Gemma3TextConfig's default
  } else {
    if (c.hidden_size % c.n_head != 0)
      fail(ErrorKind::Config, where + ": key 'hidden_size'",
           std::to_string(c.hidden_size) + " is not divisible by num_attention_heads " + std::to_string(c.n_head),
           "set head_dim explicitly if the model uses a head size other than hidden_size / heads");
    c.head_dim = c.hidden_size / c.n_head;
  }
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
  if (gemma) {
    parse_gemma(j, c, where);
    c.bos_token_id = json_find(j, "bos_token_id") ? token_id(j, "bos_token_id", where) : 2;
    c.eos_token_id = json_find(j, "eos_token_id") ? token_id(j, "eos_token_id", where) : 1;
    c.torch_dtype = json_string_or(j, "torch_dtype", json_string_or(j, "dtype", "float32", where), where);
    c.validate(where);
    return c;
  }

  if (c.model_type == "gpt_oss") {
    parse_gpt_oss(j, c, where);
    c.bos_token_id = token_id(j, "bos_token_id", where);
    c.eos_token_id = token_id(j, "eos_token_id", where);
    c.torch_dtype = json_string_or(j, "torch_dtype", json_string_or(j, "dtype", "bfloat16", where), where);
    c.validate(where);
    return c;
  }
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

  if (phi3) parse_phi3(j, c, where);
  if (c.model_type == "mixtral" || c.model_type == "qwen3_moe") parse_moe(j, c, where);
  if (c.model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2 always has q/k/v biases; its config has no key for it
  } else if (qwen3) {
    c.qk_norm = true;  // Qwen3Attention: q_norm and k_norm over each head, always
    // Qwen3Config's attention_bias gives q, k, v and o biases; released checkpoints have none.
    if (json_bool_or(j, "attention_bias", false, where))
      fail(ErrorKind::Unsupported, where + ": key 'attention_bias'", "qwen3 attention biases (q/k/v/o) are not supported");
  } else if (llama) {
    // LlamaAttention gives o_proj a bias too when attention_bias is set; nothing we load uses it.
    if (json_bool_or(j, "attention_bias", false, where))
      fail(ErrorKind::Unsupported, where + ": key 'attention_bias'", "llama attention biases (q/k/v/o) are not supported");
  }
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

  c.bos_token_id = token_id(j, "bos_token_id", where);
  c.eos_token_id = token_id(j, "eos_token_id", where);
  c.torch_dtype = json_string_or(j, "torch_dtype", json_string_or(j, "dtype", "float32", where), where);
  c.validate(where);
  return c;
}

LlamaConfig load_hf_config(const std::string& config_json_path) {
  return parse_hf_config(read_text_file(config_json_path), config_json_path);
}

// ---------------------------------------------------------------------------------------------------
// presets

namespace {
struct Preset {
  const char* name;
  const char* hf_repo;  // where the numbers come from (config.json)
  const char* model_type;
  int64_t V, C, F, L, H, KV, head_dim, max_pos;
  double eps, theta;
  const char* rope;  // "none" | "linear" | "llama3" | "longrope" | "yarn"
  double rope_factor;
  bool tie;
  int64_t bos, eos;
  const char* torch_dtype;
};

// clang-format off
const Preset kPresets[] = {
  // name            HF repo (config.json)                     type       V       C      F      L    H   KV  hd   max_pos  eps    theta    rope      fac  tie    bos     eos     dtype
  {"llama2-7b",      "meta-llama/Llama-2-7b-hf",               "llama",   32000,  4096,  11008, 32,  32, 32, 128, 4096,   1e-5, 10000,   "none",   1,   false, 1,      2,      "float16"},
  {"llama3-8b",      "meta-llama/Meta-Llama-3-8B",             "llama",   128256, 4096,  14336, 32,  32, 8,  128, 8192,   1e-5, 500000,  "none",   1,   false, 128000, 128001, "bfloat16"},
  {"llama3-70b",     "meta-llama/Meta-Llama-3-70B",            "llama",   128256, 8192,  28672, 80,  64, 8,  128, 8192,   1e-5, 500000,  "none",   1,   false, 128000, 128001, "bfloat16"},
  {"llama3.1-8b",    "meta-llama/Llama-3.1-8B",                "llama",   128256, 4096,  14336, 32,  32, 8,  128, 131072, 1e-5, 500000,  "llama3", 8,   false, 128000, 128001, "bfloat16"},
  {"llama3.1-70b",   "meta-llama/Llama-3.1-70B",               "llama",   128256, 8192,  28672, 80,  64, 8,  128, 131072, 1e-5, 500000,  "llama3", 8,   false, 128000, 128001, "bfloat16"},
  {"llama3.1-405b",  "meta-llama/Llama-3.1-405B",              "llama",   128256, 16384, 53248, 126, 128, 8, 128, 131072, 1e-5, 500000,  "llama3", 8,   false, 128000, 128001, "bfloat16"},
  {"llama3.2-1b",    "meta-llama/Llama-3.2-1B",                "llama",   128256, 2048,  8192,  16,  32, 8,  64,  131072, 1e-5, 500000,  "llama3", 32,  true,  128000, 128001, "bfloat16"},
  {"llama3.2-3b",    "meta-llama/Llama-3.2-3B",                "llama",   128256, 3072,  8192,  28,  24, 8,  128, 131072, 1e-5, 500000,  "llama3", 32,  true,  128000, 128001, "bfloat16"},
  {"mistral-7b",     "mistralai/Mistral-7B-v0.3",              "mistral", 32768,  4096,  14336, 32,  32, 8,  128, 32768,  1e-5, 1e6,     "none",   1,   false, 1,      2,      "bfloat16"},
  {"qwen2.5-0.5b",   "Qwen/Qwen2.5-0.5B",                      "qwen2",   151936, 896,   4864,  24,  14, 2,  64,  32768,  1e-6, 1e6,     "none",   1,   true,  151643, 151643, "bfloat16"},
  {"qwen2.5-7b",     "Qwen/Qwen2.5-7B",                        "qwen2",   152064, 3584,  18944, 28,  28, 4,  128, 131072, 1e-6, 1e6,     "none",   1,   false, 151643, 151643, "bfloat16"},
  {"qwen2.5-72b",    "Qwen/Qwen2.5-72B",                       "qwen2",   152064, 8192,  29568, 80,  64, 8,  128, 131072, 1e-5, 1e6,     "none",   1,   false, 151643, 151643, "bfloat16"},
  {"qwen3-0.6b",     "Qwen/Qwen3-0.6B",                        "qwen3",   151936, 1024,  3072,  28,  16, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   true,  151643, 151645, "bfloat16"},
  {"qwen3-1.7b",     "Qwen/Qwen3-1.7B",                        "qwen3",   151936, 2048,  6144,  28,  16, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   true,  151643, 151645, "bfloat16"},
  {"qwen3-4b",       "Qwen/Qwen3-4B",                          "qwen3",   151936, 2560,  9728,  36,  32, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   true,  151643, 151645, "bfloat16"},
  {"qwen3-8b",       "Qwen/Qwen3-8B",                          "qwen3",   151936, 4096,  12288, 36,  32, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   false, 151643, 151645, "bfloat16"},
  {"qwen3-14b",      "Qwen/Qwen3-14B",                         "qwen3",   151936, 5120,  17408, 40,  40, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   false, 151643, 151645, "bfloat16"},
  {"qwen3-32b",      "Qwen/Qwen3-32B",                         "qwen3",   151936, 5120,  25600, 64,  64, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   false, 151643, 151645, "bfloat16"},
  // Gemma 2: window 4096 on every other layer, soft-capping 50 (scores) and 30 (logits).
  {"gemma-2-2b",     "google/gemma-2-2b",                      "gemma2",  256000, 2304,  9216,  26,  8,  4,  256, 8192,   1e-6, 10000,   "none",   1,   true,  2,      1,      "float32"},
  {"gemma-2-9b",     "google/gemma-2-9b",                      "gemma2",  256000, 3584,  14336, 42,  16, 8,  256, 8192,   1e-6, 10000,   "none",   1,   true,  2,      1,      "float32"},
  {"gemma-2-27b",    "google/gemma-2-27b",                     "gemma2",  256000, 4608,  36864, 46,  32, 16, 128, 8192,   1e-6, 10000,   "none",   1,   true,  2,      1,      "float32"},
  // Gemma 3: the text model (text_config of the multimodal 4b/12b/27b checkpoints); window and
  // query_pre_attn_scalar in kGemma below.
  {"gemma-3-270m",   "google/gemma-3-270m",                    "gemma3_text", 262144, 640, 2048, 18, 4, 1, 256, 32768,   1e-6, 1e6,     "none",   1,   true,  2,      1,      "bfloat16"},
  {"gemma-3-1b",     "google/gemma-3-1b-pt",                   "gemma3_text", 262144, 1152, 6912, 26, 4, 1, 256, 32768,  1e-6, 1e6,     "none",   1,   true,  2,      1,      "bfloat16"},
  {"gemma-3-4b",     "google/gemma-3-4b-pt",                   "gemma3_text", 262208, 2560, 10240, 34, 8, 4, 256, 131072, 1e-6, 1e6,     "linear", 8,   true,  2,      1,      "bfloat16"},
  {"gemma-3-12b",    "google/gemma-3-12b-pt",                  "gemma3_text", 262208, 3840, 15360, 48, 16, 8, 256, 131072, 1e-6, 1e6,    "linear", 8,   true,  2,      1,      "bfloat16"},
  {"gemma-3-27b",    "google/gemma-3-27b-pt",                  "gemma3_text", 262208, 5376, 21504, 62, 32, 16, 128, 131072, 1e-6, 1e6,   "linear", 8,   true,  2,      1,      "bfloat16"},
  // Phi: qkv_proj and gate_up_proj fused; Phi-3-mini-4k slides a window of 2047 keys on every layer.
  {"phi-3-mini-4k",  "microsoft/Phi-3-mini-4k-instruct",       "phi3",    32064,  3072,  8192,  32,  32, 32, 96,  4096,   1e-5, 10000,   "none",   1,   false, 1,      32000,  "bfloat16"},
  {"phi-4",          "microsoft/phi-4",                        "phi3",    100352, 5120,  17920, 40,  40, 10, 128, 16384,  1e-5, 250000,  "none",   1,   false, 100257, 100265, "bfloat16"},
  // LongRoPE from 4,096 positions; Phi-4-mini rotates 96 of each head's 128 dims (partial_rotary_factor 0.75).
  {"phi-3.5-mini",   "microsoft/Phi-3.5-mini-instruct",        "phi3",    32064,  3072,  8192,  32,  32, 32, 96,  131072, 1e-5, 10000,   "longrope", 32, false, 1,      32000,  "bfloat16"},
  {"phi-4-mini",     "microsoft/Phi-4-mini-instruct",          "phi3",    200064, 3072,  8192,  32,  24, 8,  128, 131072, 1e-5, 10000,   "longrope", 32, true,  199999, 199999, "bfloat16"},
  // Mixture of experts: experts, experts per token and the expert's size in kMoe below.
  {"mixtral-8x7b",   "mistralai/Mixtral-8x7B-v0.1",            "mixtral", 32000,  4096,  14336, 32,  32, 8,  128, 32768,  1e-5, 1e6,     "none",   1,   false, 1,      2,      "bfloat16"},
  {"qwen3-30b-a3b",  "Qwen/Qwen3-30B-A3B",                     "qwen3_moe", 151936, 2048, 6144, 48,  32, 4,  128, 40960,  1e-6, 1e6,     "none",   1,   false, 151643, 151645, "bfloat16"},
  {"gpt-oss-20b",    "openai/gpt-oss-20b",                     "gpt_oss", 201088, 2880,  2880,  24,  64, 8,  64,  131072, 1e-5, 150000,  "yarn",   32,  false, 199998, 200002, "bfloat16"},
  {"gpt-oss-120b",   "openai/gpt-oss-120b",                    "gpt_oss", 201088, 2880,  2880,  36,  64, 8,  64,  131072, 1e-5, 150000,  "yarn",   32,  false, 199998, 200002, "bfloat16"},
  {"smollm2-135m",   "HuggingFaceTB/SmolLM2-135M",             "llama",   49152,  576,   1536,  30,  9,  3,  64,  8192,   1e-5, 100000,  "none",   1,   true,  0,      0,      "bfloat16"},
  {"smollm2-360m",   "HuggingFaceTB/SmolLM2-360M",             "llama",   49152,  960,   2560,  32,  15, 5,  64,  8192,   1e-5, 100000,  "none",   1,   true,  0,      0,      "bfloat16"},
  {"smollm2-1.7b",   "HuggingFaceTB/SmolLM2-1.7B",             "llama",   49152,  2048,  8192,  24,  32, 32, 64,  8192,   1e-5, 130000,  "none",   1,   true,  0,      0,      "bfloat16"},
  {"tinyllama-1.1b", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "llama", 32000, 2048, 5632, 22, 32, 4, 64, 2048, 1e-5, 10000, "none", 1,  false, 1,      2,      "float32"},
};
// clang-format on

// Gemma's sliding window and query_pre_attn_scalar per preset (Gemma 2: every other layer global;
// Gemma 3: every 6th, local RoPE base 10,000).
struct GemmaExtra {
  const char* name;
  int64_t window;
  double query_pre_attn_scalar;
};
const GemmaExtra kGemma[] = {
    {"gemma-2-2b", 4096, 256}, {"gemma-2-9b", 4096, 256},   {"gemma-2-27b", 4096, 144}, {"gemma-3-270m", 512, 256},
    {"gemma-3-1b", 512, 256},
    {"gemma-3-4b", 1024, 256}, {"gemma-3-12b", 1024, 256}, {"gemma-3-27b", 1024, 168}};

// The mixture-of-experts presets' experts (their config.json: num_local_experts / num_experts,
// num_experts_per_tok, intermediate_size / moe_intermediate_size, norm_topk_prob).
struct MoeExtra {
  const char* name;
  int64_t experts, per_tok, expert_size;
  bool norm_topk;
};
const MoeExtra kMoe[] = {{"mixtral-8x7b", 8, 2, 14336, true},
                         {"qwen3-30b-a3b", 128, 8, 768, true},
                         {"gpt-oss-20b", 32, 4, 2880, true},
                         {"gpt-oss-120b", 128, 4, 2880, true}};
}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> n;
    for (const auto& p : kPresets) n.push_back(p.name);
    return n;
  }();
  return v;
}

bool has_preset(const std::string& name) {
  for (const auto& p : kPresets)
    if (name == p.name) return true;
  return false;
}

LlamaConfig preset_config(const std::string& name) {
  for (const auto& p : kPresets) {
    if (name != p.name) continue;
    LlamaConfig c;
    c.name = p.name;
    c.model_type = p.model_type;
    c.vocab_size = p.V;
    c.hidden_size = p.C;
    c.intermediate_size = p.F;
    c.n_layer = p.L;
    c.n_head = p.H;
    c.n_head_kv = p.KV;
    c.head_dim = p.head_dim;
    c.max_position_embeddings = p.max_pos;
    c.rms_norm_eps = p.eps;
    c.rope_theta = p.theta;
    if (std::string(p.rope) == "linear") {
      c.rope_scaling.type = "linear";
      c.rope_scaling.factor = p.rope_factor;
    }
    if (std::string(p.rope) == "yarn") {  // gpt-oss: from 4,096 positions, the ramp not truncated
      c.rope_scaling.type = "yarn";
      c.rope_scaling.factor = p.rope_factor;
      c.rope_scaling.original_max_position_embeddings = 4096;
      c.rope_scaling.truncate = false;
      c.rope_scaling.attention_factor = 0.1 * std::log(p.rope_factor) + 1.0;
    }
    if (name == "phi-4-mini") c.rotary_dim = 96;
    if (std::string(p.rope) == "longrope") {  // the factors do not change a plan: ones stand in for them
      c.rope_scaling.type = "longrope";
      c.rope_scaling.factor = p.rope_factor;
      c.rope_scaling.original_max_position_embeddings = 4096;
      c.rope_scaling.attention_factor = longrope_attention_factor(p.rope_factor, 4096);
      c.rope_scaling.short_factor.assign(size_t(c.rope_dim() / 2), 1.0);
      c.rope_scaling.long_factor = c.rope_scaling.short_factor;
    }
    if (std::string(p.rope) == "llama3") {
      c.rope_scaling.type = "llama3";
      c.rope_scaling.factor = p.rope_factor;
      c.rope_scaling.low_freq_factor = 1.0;
      c.rope_scaling.high_freq_factor = 4.0;
      c.rope_scaling.original_max_position_embeddings = 8192;
    }
    c.attention_bias = c.model_type == "qwen2";
    c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
    for (const auto& m : kMoe)
      if (name == m.name) {
        c.n_experts = m.experts;
        c.experts_per_tok = m.per_tok;
        c.expert_intermediate_size = m.expert_size;
        c.norm_topk_prob = m.norm_topk;
      }
    if (c.model_type == "gemma3_text" || c.model_type == "gemma2") {
      const bool gemma2 = c.model_type == "gemma2";
      for (const auto& g : kGemma)
        if (name == g.name) {
          c.sliding_window = g.window;
          c.query_pre_attn_scalar = g.query_pre_attn_scalar;
        }
      c.norm_unit_offset = c.sandwich_norms = c.scale_embeddings = true;
      c.qk_norm = !gemma2;
      c.hidden_act = Activation::GeluTanh;
      c.rope_local_theta = gemma2 ? 0.0 : 10000.0;
      if (gemma2) c.attn_logit_softcapping = 50.0, c.final_logit_softcapping = 30.0;
      const int64_t pattern = gemma2 ? 2 : 6;
      c.sliding_layers.assign(size_t(c.n_layer), false);
      for (int64_t l = 0; l < c.n_layer; l++) c.sliding_layers[size_t(l)] = (l + 1) % pattern != 0;
    }
    if (c.model_type == "gpt_oss") {  // windows of 128 on the even layers, MXFP4 experts as shipped
      apply_gpt_oss_layout(c);
      c.router_aux_loss_coef = 0;  // output_router_logits false, as the Hub's config.json
      c.sliding_window = 128;
      c.experts_stored = "mxfp4";
    }
    if (c.model_type == "phi3") {
      c.fused_qkv = c.fused_gate_up = true;
      if (name == "phi-3-mini-4k") c.sliding_window = 2047;
    }
    c.tie_word_embeddings = p.tie;
    c.bos_token_id = p.bos;
    c.eos_token_id = p.eos;
    c.torch_dtype = p.torch_dtype;
    c.validate(std::string("preset '") + p.name + "'");
    return c;
  }
  fail(ErrorKind::Config, "model preset '" + name + "'", "unknown preset",
       "did you mean '" + closest_name(preset_names(), name) + "'? presets: " + joined(preset_names()));
}

// ---------------------------------------------------------------------------------------------------
// RoPE

std::vector<float> rope_local_inv_freq(const LlamaConfig& c) {
  LlamaConfig local = c;
  local.rope_theta = c.rope_local_theta;
  local.rope_scaling = RopeScaling{};
  return rope_inv_freq(local);
}

std::vector<float> rope_inv_freq(const LlamaConfig& c, bool long_factors) {
  const int64_t D = c.rope_dim();
  std::vector<float> out(size_t(D / 2));
  const RopeScaling& s = c.rope_scaling;
  const double pi = 3.14159265358979323846;
  // YaRN's ramp: from the dim making beta_fast turns over the original context to the one making
  // beta_slow turns (find_correction_range in transformers).
  double ramp_lo = 0, ramp_hi = 1;
  if (s.type == "yarn") {
    auto dim_for = [&](double turns) {
      return double(D) * std::log(double(s.original_max_position_embeddings) / (turns * 2 * pi)) /
             (2 * std::log(c.rope_theta));
    };
    ramp_lo = dim_for(s.beta_fast), ramp_hi = dim_for(s.beta_slow);
    if (s.truncate) ramp_lo = std::floor(ramp_lo), ramp_hi = std::ceil(ramp_hi);
    ramp_lo = std::max(ramp_lo, 0.0), ramp_hi = std::min(ramp_hi, double(D - 1));
    if (ramp_lo == ramp_hi) ramp_hi += 0.001;  // as transformers: no division by zero
  }
  for (int64_t i = 0; i < D / 2; i++) {
    double inv = 1.0 / std::pow(c.rope_theta, double(2 * i) / double(D));
    if (s.type == "yarn") {
      const double extrapolate = 1.0 - std::clamp((double(i) - ramp_lo) / (ramp_hi - ramp_lo), 0.0, 1.0);
      inv = inv / s.factor * (1.0 - extrapolate) + inv * extrapolate;
    } else if (s.type == "longrope") {
      inv /= (long_factors ? s.long_factor : s.short_factor)[size_t(i)];
    } else if (s.type == "linear") {
      inv /= s.factor;
    } else if (s.type == "llama3") {
      // Llama 3.1: keep high frequencies, slow low frequencies by `factor`, blend in between.
      const double old_len = double(s.original_max_position_embeddings);
      const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
      const double wavelen = 2 * pi / inv;
      if (wavelen > low_wavelen) {
        inv /= s.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        inv = (1 - smooth) * inv / s.factor + smooth * inv;
      }
    }
    out[size_t(i)] = float(inv);
  }
  return out;
}

float rope_attention_scale(const LlamaConfig& c) {
  const std::string& t = c.rope_scaling.type;
  return t == "longrope" || t == "yarn" ? float(c.rope_scaling.attention_factor) : 1.0f;
}

bool rope_uses_long_factors(const LlamaConfig& c, int64_t max_position) {
  return c.rope_scaling.type == "longrope" && max_position + 1 > c.rope_scaling.original_max_position_embeddings;
}

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
