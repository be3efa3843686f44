// GGUF metadata -> LlamaConfig, GGUF <-> HF tensor names, and the inverse of the converter's Q/K permute.
#include "model/gguf_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "model/experts.h"
#include "model/gguf_arch.h"
#include "model/merge.h"
#include "model/mxfp4_experts.h"

namespace qlora {

namespace {

// Per-layer names: GGUF suffix after "blk.N." <-> HF suffix after "model.layers.N.", and which
// configs have the tensor.
enum class Needs { Always, AttentionBias, QkNorm };
struct LayerName {
  const char* gguf;
  const char* hf;
  Needs needs = Needs::Always;
};
const LayerName kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias", Needs::AttentionBias},
    {"attn_k.bias", "self_attn.k_proj.bias", Needs::AttentionBias},
    {"attn_v.bias", "self_attn.v_proj.bias", Needs::AttentionBias},
    {"attn_q_norm.weight", "self_attn.q_norm.weight", Needs::QkNorm},
    {"attn_k_norm.weight", "self_attn.k_norm.weight", Needs::QkNorm},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};
bool present(const LayerName& n, const LlamaConfig& cfg) {
  switch (n.needs) {
    case Needs::Always: return true;
    case Needs::AttentionBias: return cfg.attention_bias;
    case Needs::QkNorm: return cfg.qk_norm;
  }
  return true;
}
const LayerName kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// "<prefix><digits>.<rest>" -> (layer, rest).
std::optional<std::pair<int64_t, std::string>> split_layer(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') j++;
  if (j == i || j >= name.size() || name[j] != '.' || j - i > 9) return std::nullopt;
  return std::make_pair(std::strtoll(name.c_str() + i, nullptr, 10), name.substr(j + 1));
}

// GGUF stores eps/theta/factor as f32; the shortest decimal that round-trips (1e-05, not
// 9.999999747e-06) is what the HF config held, so messages and configs compare equal.
double f32_decimal(float v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  *res.ptr = 0;
  return std::strtod(buf, nullptr);
}

constexpr double kPi = 3.14159265358979323846;

// llama3 rope scaling parameters that reproduce convert_hf_to_gguf.py's rope_freqs.weight
// (DecoderModel.generate_extra_tensors): factor[i] = 1 for wavelen < orig/high, `factor` for
// wavelen > orig/low, else 1/((1-s)/factor + s) with s = (orig/wavelen - low)/(high - low).
// GGUF keeps only the factors, so the parameters are recovered and then checked against every
// factor: first the converter's defaults, then orig fitted with low=1/high=4, then orig and high
// fitted with low=1.
double llama3_factor(double wavelen, const RopeScaling& rs) {
  double orig = double(rs.original_max_position_embeddings);
  if (wavelen < orig / rs.high_freq_factor) return 1.0;
  if (wavelen > orig / rs.low_freq_factor) return rs.factor;
  double s = (orig / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
  return 1.0 / ((1.0 - s) / rs.factor + s);
}

RopeScaling recover_llama3(const std::vector<float>& f, double theta, int64_t head_dim, int64_t orig_hint,
                           const std::string& where) {
  const int64_t n = int64_t(f.size());
  std::vector<double> wl(n);
  double factor = 1.0;
  for (int64_t i = 0; i < n; i++) {
    wl[i] = 2.0 * kPi * std::pow(theta, double(2 * i) / double(head_dim));
    if (!(f[i] > 0.0f) || !std::isfinite(f[i]))
      fail(ErrorKind::Format, where, "rope factor " + std::to_string(i) + " is " + std::to_string(f[i]) + ", expected > 0");
    factor = std::max(factor, double(f[i]));
  }
  RopeScaling rs;
  if (factor == 1.0) return rs;  // all ones: no scaling
  rs.type = "llama3";
  rs.factor = f32_decimal(float(factor));

  auto matches = [&](const RopeScaling& c) {
    for (int64_t i = 0; i < n; i++)
      if (std::fabs(llama3_factor(wl[i], c) - f[i]) > 1e-4 * f[i]) return false;
    return true;
  };
  // Smooth entries: s recovered from the factor, against 1/wavelen.
  std::vector<double> xs, ss;
  double max_wl_one = 0, min_wl_full = INFINITY;
  for (int64_t i = 0; i < n; i++) {
    if (f[i] <= 1.0 + 1e-5) max_wl_one = std::max(max_wl_one, wl[i]);
    else if (f[i] >= factor * (1 - 1e-5)) min_wl_full = std::min(min_wl_full, wl[i]);
    else {
      xs.push_back(1.0 / wl[i]);
      ss.push_back((1.0 / f[i] - 1.0 / factor) / (1.0 - 1.0 / factor));
    }
  }
  std::vector<RopeScaling> cands;
  RopeScaling c = rs;
  c.original_max_position_embeddings = orig_hint;
  cands.push_back(c);
  if (!xs.empty()) {  // low=1, high=4: orig = wavelen * (3s + 1)
    double o = 0;
    for (size_t k = 0; k < xs.size(); k++) o += (3.0 * ss[k] + 1.0) / xs[k];
    c.original_max_position_embeddings = std::llround(o / double(xs.size()));
    cands.push_back(c);
  } else if (4.0 * max_wl_one < min_wl_full) {  // no smooth entry: any orig between the two sets
    c.original_max_position_embeddings = std::llround(std::sqrt(4.0 * std::max(max_wl_one, 1.0) * min_wl_full));
    cands.push_back(c);
  }
  if (xs.size() >= 2) {  // low=1: s = A/wavelen - B with A = orig/(high-1), B = 1/(high-1)
    double mx = 0, ms = 0, sxx = 0, sxs = 0;
    for (size_t k = 0; k < xs.size(); k++) mx += xs[k], ms += ss[k];
    mx /= double(xs.size()), ms /= double(xs.size());
    for (size_t k = 0; k < xs.size(); k++) sxx += (xs[k] - mx) * (xs[k] - mx), sxs += (xs[k] - mx) * (ss[k] - ms);
    double A = sxx > 0 ? sxs / sxx : 0, B = A * mx - ms;
    if (A > 0 && B > 0) {
      c.high_freq_factor = f32_decimal(float(1.0 + 1.0 / B));
      c.original_max_position_embeddings = std::llround(A / B);
      cands.push_back(c);
    }
  }
  for (const auto& k : cands)
    if (matches(k)) return k;
  fail(ErrorKind::Unsupported, where, "per-frequency rope factors do not follow llama3 rope scaling",
       "only llama3-style rope_freqs written by convert_hf_to_gguf.py are understood");
}

int64_t key_i64(const GgufFile& f, const std::string& key) {
  if (f.has(key) && f.type_of(key) == GgufType::ARRAY)
    fail(ErrorKind::Unsupported, f.path() + ": key '" + key + "'", "per-layer values are not supported",
         "only uniform Llama-family decoders are supported");
  return f.get_i64(key);
}

void expect_shape(const GgufFile& f, const std::string& name, const std::vector<int64_t>& ne) {
  const GgufTensorInfo& t = f.tensor(name);
  if (t.ne != ne) {
    auto str = [](const std::vector<int64_t>& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    fail(ErrorKind::Format, f.path() + ": tensor '" + name + "'",
         "ggml shape " + str(t.ne) + " does not match the metadata, expected " + str(ne));
  }
}

// gpt-oss's fused expert tensor `hf`'s layout, every stack of it present with its shape (else
// Error(Format) naming the stack); nullopt for any other tensor.
std::optional<GptOssFusedLayout> checked_layout(const GgufFile& f, const LlamaConfig& c, const std::string& hf) {
  auto g = gpt_oss_fused_layout(c, hf);
  if (g)
    for (const GptOssFusedLayout::Part& p : g->parts) expect_shape(f, p.gguf, p.ne);
  return g;
}

// Phi-3's LongRoPE as convert_hf_to_gguf.py writes it (Phi3MiniModel): the long and short factors
// as tensors of rope_dim/2, the pretraining context as rope.scaling.original_context_length and
// the cos/sin factor as rope.scaling.attn_factor. The scaling factor is then context_length over
// the original context, as transformers resolves a config without one.
void read_longrope(const GgufFile& f, const std::string& k, bool phi3, LlamaConfig& c) {
  const bool has_long = f.has_tensor("rope_factors_long.weight"), has_short = f.has_tensor("rope_factors_short.weight");
  if (!has_long && !has_short) return;
  const std::string first = has_long ? "rope_factors_long.weight" : "rope_factors_short.weight";
  if (!phi3)
    fail(ErrorKind::Unsupported, f.path() + ": tensor '" + first + "'",
         "LongRoPE factors are read for the phi3 architecture only");
  if (!has_long || !has_short)
    fail(ErrorKind::Format, f.path() + ": tensor '" + std::string(has_long ? "rope_factors_short.weight" : "rope_factors_long.weight") + "'",
         "missing: LongRoPE needs both the long and the short factors");
  if (c.rope_scaling.type != "none")
    fail(ErrorKind::Unsupported, f.path() + ": tensor '" + first + "'", "LongRoPE factors together with " + c.rope_scaling.type + " scaling");
  RopeScaling rs;
  rs.type = "longrope";
  for (auto [name, out] : {std::pair{"rope_factors_long.weight", &rs.long_factor}, std::pair{"rope_factors_short.weight", &rs.short_factor}}) {
    expect_shape(f, name, {c.rope_dim() / 2});
    for (float v : f.read_tensor_f32(name)) {
      if (!(v > 0.0f) || !std::isfinite(v))
        fail(ErrorKind::Format, f.path() + ": tensor '" + std::string(name) + "'", "factor " + std::to_string(v) + ", expected > 0");
      out->push_back(f32_decimal(v));
    }
  }
  const std::string orig_key = k + "rope.scaling.original_context_length";
  if (!f.has(orig_key))
    fail(ErrorKind::Format, f.path() + ": key '" + orig_key + "'", "missing: LongRoPE switches factors past the original context");
  rs.original_max_position_embeddings = key_i64(f, orig_key);
  if (rs.original_max_position_embeddings <= 0)
    fail(ErrorKind::Format, f.path() + ": key '" + orig_key + "'", "must be positive");
  rs.factor = double(c.max_position_embeddings) / double(rs.original_max_position_embeddings);
  rs.attention_factor = f.has(k + "rope.scaling.attn_factor") ? f32_decimal(f.get_f32(k + "rope.scaling.attn_factor"))
                                                               : longrope_attention_factor(rs.factor, rs.original_max_position_embeddings);
  c.rope_scaling = std::move(rs);
}

// Gemma 2 and Gemma 3 as llama.cpp's gemma2/gemma3 run them (its llama-model.cpp): the (1 + w)
// norms on both sides of each block (stored as 1 + w), embeddings scaled by sqrt(hidden), GeGLU;
// scores scaled by head_dim^-1/2, or (hidden / heads)^-1/2 for the 27B sizes (46 and 62 layers),
// which is transformers' query_pre_attn_scalar of those checkpoints; the sliding window
// (attention.sliding_window; gemma2: 4096 when absent) on the layers of the pattern
// (attention.sliding_window_pattern, a period or one flag per layer; else every other layer from
// the first for gemma2, five of every six for gemma3). Gemma 2: soft-capping (50 and 30 when the
// file names none). Gemma 3: q/k norms, the sliding layers rotated at rope.freq_base_swa (10000
// when absent), unscaled.
void read_gemma_layout(const GgufFile& f, const std::string& k, bool gemma2, LlamaConfig& c) {
  c.norm_unit_offset = c.sandwich_norms = c.scale_embeddings = true;
  c.hidden_act = Activation::GeluTanh;
  c.sliding_window = f.has(k + "attention.sliding_window") ? key_i64(f, k + "attention.sliding_window") : gemma2 ? 4096 : 0;
  if (c.sliding_window < 0)
    fail(ErrorKind::Format, f.path() + ": key '" + k + "attention.sliding_window'", "must not be negative");
  if (c.sliding_window > 0) {
    c.sliding_layers.assign(size_t(c.n_layer), false);
    const std::string pk = k + "attention.sliding_window_pattern";
    if (f.has(pk) && f.type_of(pk) == GgufType::ARRAY) {
      const std::vector<int64_t> flags = f.get_array_i64(pk);
      if (int64_t(flags.size()) != c.n_layer)
        fail(ErrorKind::Format, f.path() + ": key '" + pk + "'",
             std::to_string(flags.size()) + " flags for " + std::to_string(c.n_layer) + " layers");
      for (int64_t l = 0; l < c.n_layer; l++) c.sliding_layers[size_t(l)] = flags[size_t(l)] != 0;
    } else {
      const int64_t period = f.has(pk) ? f.get_i64(pk) : llama_cpp_gemma_swa_period(gemma2);
      if (period < 0) fail(ErrorKind::Format, f.path() + ": key '" + pk + "'", "must not be negative");
      for (int64_t l = 0; l < c.n_layer; l++) c.sliding_layers[size_t(l)] = llama_cpp_swa_layer(period, l);
    }
  }
  if (gemma2) {
    c.attn_logit_softcapping = f.has(k + "attn_logit_softcapping") ? f32_decimal(f.get_f32(k + "attn_logit_softcapping")) : 50.0;
    c.final_logit_softcapping = f.has(k + "final_logit_softcapping") ? f32_decimal(f.get_f32(k + "final_logit_softcapping")) : 30.0;
  } else {
    c.rope_local_theta = f.has(k + "rope.freq_base_swa") ? f32_decimal(f.get_f32(k + "rope.freq_base_swa"))
                                                         : kLlamaCppGemmaLocalRopeBase;
  }
  c.query_pre_attn_scalar = llama_cpp_gemma_query_pre_attn_scalar(c);
}

// A mixture of experts: llama.cpp's llama architecture with expert_count (Mixtral, as
// convert_hf_to_gguf.py writes it) and its qwen3moe (Qwen3-MoE). Each layer holds a router
// (ffn_gate_inp, ne [hidden, experts]) and its experts' three weights stacked as 3-D tensors
// (ffn_gate_exps/ffn_up_exps/ffn_down_exps, ne [in, out, experts]); the expert width is read from
// the first stack and must agree with the file's key for it. llama.cpp renormalises the chosen
// experts' weights for both architectures (build_moe_ffn with norm_w), which is Mixtral's routing
// and Qwen3-MoE's with norm_topk_prob. A GGUF holds no auxiliary-loss setting, and transformers adds
// that loss only with output_router_logits, off in both families' configs by default: none is added.
void read_experts(const GgufFile& f, const std::string& k, const std::string& arch, LlamaConfig& c) {
  const std::string count_key = k + "expert_count";
  const int64_t n = f.has(count_key) ? key_i64(f, count_key) : 0;
  if (n < 0) fail(ErrorKind::Format, f.path() + ": key '" + count_key + "'", "must not be negative");
  if (n == 0) {
    if (arch == "qwen3moe" || arch == "gpt-oss")
      fail(ErrorKind::Format, f.path() + ": key '" + count_key + "'", arch + " needs an expert count > 0");
    return;
  }
  if (arch != "llama" && arch != "qwen3moe" && arch != "gpt-oss")
    fail(ErrorKind::Unsupported, f.path() + ": key '" + count_key + "'",
         "mixture-of-experts layers on architecture '" + arch + "' are not supported",
         "mixtures of experts are read as llama (Mixtral), qwen3moe (Qwen3-MoE) and gpt-oss");
  if (arch == "llama") c.model_type = "mixtral";
  c.n_experts = n;
  const std::string used_key = k + "expert_used_count";
  if (!f.has(used_key)) fail(ErrorKind::Format, f.path() + ": key '" + used_key + "'", "missing: how many experts a token uses");
  c.experts_per_tok = key_i64(f, used_key);
  if (c.experts_per_tok < 1 || c.experts_per_tok > n)
    fail(ErrorKind::Format, f.path() + ": key '" + used_key + "'",
         std::to_string(c.experts_per_tok) + " experts per token of " + std::to_string(n) + ": expected 1 to " + std::to_string(n));
  const std::string stack = "blk.0.ffn_gate_exps.weight";
  if (!f.has_tensor(stack) && f.has_tensor("blk.0.ffn_gate.0.weight"))
    fail(ErrorKind::Unsupported, f.path() + ": tensor 'blk.0.ffn_gate.0.weight'",
         "experts stored one tensor each (blk.N.ffn_gate.E.weight, the layout of early Mixtral conversions) are not read",
         "convert the checkpoint again with a current convert_hf_to_gguf.py, which stacks them as blk.N.ffn_gate_exps.weight");
  const GgufTensorInfo& g = f.tensor(stack);
  if (g.ne.size() != 3)
    fail(ErrorKind::Format, f.path() + ": tensor '" + stack + "'",
         "expected 3 dimensions [hidden, expert width, experts], got " + std::to_string(g.ne.size()));
  if (g.ne[2] != n)
    fail(ErrorKind::Format, f.path() + ": tensor '" + stack + "'",
         "holds " + std::to_string(g.ne[2]) + " experts, the key '" + count_key + "' " + std::to_string(n));
  c.expert_intermediate_size = g.ne[1];
  const std::string width_key = k + (arch == "llama" ? "feed_forward_length" : "expert_feed_forward_length");
  if (f.has(width_key) && key_i64(f, width_key) != c.expert_intermediate_size)
    fail(ErrorKind::Format, f.path() + ": key '" + width_key + "'",
         std::to_string(key_i64(f, width_key)) + " but tensor '" + stack + "' holds experts of width " +
             std::to_string(c.expert_intermediate_size));
  c.norm_topk_prob = true;
  c.router_aux_loss_coef = 0;
}

// gpt-oss as llama.cpp's gpt-oss architecture runs it (its llama-model.cpp): biases on q/k/v/o, the
// router and the experts; sinks; softmax over the top-k router logits; the clamped SwiGLU with
// llama.cpp's fixed constants (alpha 1.702, limit 7, as every gpt-oss config.json has them); the
// window (attention.sliding_window, required there) on the even layers (its swa pattern 2, which is
// GptOssConfig's layer_types). The experts' width is the model's intermediate size.
void read_gpt_oss_layout(const GgufFile& f, const std::string& k, LlamaConfig& c) {
  if (c.expert_intermediate_size != c.intermediate_size)
    fail(ErrorKind::Format, f.path() + ": key '" + k + "feed_forward_length'",
         std::to_string(c.intermediate_size) + " but the experts are " + std::to_string(c.expert_intermediate_size) +
             " wide; gpt-oss's are the intermediate size");
  const std::string wk = k + "attention.sliding_window";
  if (!f.has(wk)) fail(ErrorKind::Format, f.path() + ": key '" + wk + "'", "missing: gpt-oss's even layers slide");
  c.sliding_window = key_i64(f, wk);
  if (c.sliding_window <= 0) fail(ErrorKind::Format, f.path() + ": key '" + wk + "'", "must be positive");
  apply_gpt_oss_layout(c);
  c.swiglu_clamp = ClampedSwigluParams{1.702f, 7.0f};
  c.router_aux_loss_coef = 0;
  // Experts as the Hub's gpt-oss GGUFs ship them (MXFP4, as convert_hf_to_gguf.py copies the
  // checkpoint's blocks): held as shipped, as from the checkpoint, when every stack is MXFP4.
  bool mxfp4 = true;
  for (int64_t l = 0; l < c.n_layer && mxfp4; l++)
    for (const char* k : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
      const std::string n = "blk." + std::to_string(l) + "." + k + ".weight";
      mxfp4 = mxfp4 && f.has_tensor(n) && f.tensor(n).type == GgmlType::MXFP4;
    }
  if (mxfp4) c.experts_stored = "mxfp4";
}

// YaRN as llama.cpp runs it from rope.scaling.* (ggml's rope with ext_factor 1): the ramp between
// the dims of yarn_beta_fast and yarn_beta_slow turns (32 and 1 where absent) over
// original_context_length, its ends floored and ceiled (ggml_rope_yarn_corr_dims: transformers'
// truncate), cos and sin times 0.1 ln(factor) + 1. The keys that change that scale or the blend are
// refused: what llama.cpp makes of them was not checked here.
RopeScaling read_yarn(const GgufFile& f, const std::string& k) {
  for (const char* key : {"rope.scaling.yarn_attn_factor", "rope.scaling.yarn_ext_factor", "rope.scaling.yarn_log_multiplier"})
    if (f.has(k + key))
      fail(ErrorKind::Unsupported, f.path() + ": key '" + k + key + "'",
           "YaRN is read with llama.cpp's default magnitude scale and blend only");
  RopeScaling rs;
  rs.type = "yarn";
  const std::string fk = k + "rope.scaling.factor", ok = k + "rope.scaling.original_context_length";
  if (!f.has(fk)) fail(ErrorKind::Format, f.path() + ": key '" + fk + "'", "missing: YaRN needs its factor");
  if (!f.has(ok)) fail(ErrorKind::Format, f.path() + ": key '" + ok + "'", "missing: YaRN needs the original context");
  rs.factor = f32_decimal(f.get_f32(fk));
  rs.original_max_position_embeddings = key_i64(f, ok);
  if (!(rs.factor > 0) || !std::isfinite(rs.factor)) fail(ErrorKind::Format, f.path() + ": key '" + fk + "'", "must be positive");
  if (rs.original_max_position_embeddings <= 0) fail(ErrorKind::Format, f.path() + ": key '" + ok + "'", "must be positive");
  const std::string bf = k + "rope.scaling.yarn_beta_fast", bs = k + "rope.scaling.yarn_beta_slow";
  rs.beta_fast = f.has(bf) ? f32_decimal(f.get_f32(bf)) : 32.0;
  rs.beta_slow = f.has(bs) ? f32_decimal(f.get_f32(bs)) : 1.0;
  if (!(rs.beta_fast > rs.beta_slow) || !(rs.beta_slow > 0))
    fail(ErrorKind::Format, f.path() + ": key '" + bf + "'", "YaRN needs beta_fast > beta_slow > 0");
  rs.truncate = true;
  rs.attention_factor = yarn_mscale(rs.factor, 1.0);
  return rs;
}

// Expert e's weight of a mixture-of-experts layer, as the checkpoints name it (hf_expert_name): slice
// e of the layer's stack, rows [e * out, (e + 1) * out) of its (experts * out) rows of `in` values.
struct ExpertSlice {
  std::string stack;
  int64_t expert = 0, rows = 0;
};
std::optional<ExpertSlice> gguf_expert_slice(const LlamaConfig& cfg, const std::string& hf_name) {
  const auto t = hf_expert_of(cfg, hf_name);
  if (!t) return std::nullopt;
  return ExpertSlice{hf_to_gguf_name("model.layers." + std::to_string(t->layer) + ".mlp.experts." + t->kind), t->expert,
                     expert_shape(cfg, t->kind).first};
}

}  // namespace

std::string gguf_to_hf_name(const std::string& g) {
  for (const auto& n : kGlobalNames)
    if (g == n.gguf) return n.hf;
  if (auto l = split_layer(g, "blk."))
    for (const auto& n : kLayerNames)
      if (l->second == n.gguf) return "model.layers." + std::to_string(l->first) + "." + n.hf;
  return "";
}

// HF -> GGUF only: Phi-3's fused projections as llama.cpp's phi3 architecture names them (attn_qkv:
// q, k, v rows; ffn_up: gate then up rows); a mixture-of-experts layer's router (Mixtral's and
// Qwen3-MoE's module names) and the engine's expert stacks (experts.h), (n_experts, out, in), as
// llama.cpp's 3-D ffn_*_exps, whose slices the reader hands out as the checkpoints' per-expert tensors.
const LayerName kExportLayerNames[] = {
    {"attn_qkv.weight", "self_attn.qkv_proj.weight"},
    {"ffn_up.weight", "mlp.gate_up_proj.weight"},
    {"ffn_gate_inp.weight", "block_sparse_moe.gate.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
    {"ffn_gate_exps.weight", "mlp.experts.gate_proj"},
    {"ffn_up_exps.weight", "mlp.experts.up_proj"},
    {"ffn_down_exps.weight", "mlp.experts.down_proj"},
};

// Export only: Gemma's four norms per layer (LlamaConfig::sandwich_norms) as llama.cpp's gemma2 and
// gemma3 name them. Its post_attention_layernorm is the attention's output norm there, not the MLP's
// input norm it is on Llama (kLayerNames' ffn_norm), which is Gemma's pre_feedforward_layernorm.
const LayerName kSandwichNormNames[] = {
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
};

// gpt-oss (llama.cpp's gpt-oss architecture, convert_hf_to_gguf.py's GptOssModel): the tensors
// besides the Llama ones. Its post_attention_layernorm is the MLP's input norm, named
// post_attention_norm there; the router is ffn_gate_inp with a bias; the sinks a 1-D tensor.
const LayerName kGptOssNames[] = {
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_sinks.weight", "self_attn.sinks"},
    {"ffn_gate_inp.weight", "mlp.router.weight"},
    {"ffn_gate_inp.bias", "mlp.router.bias"},
};

// The fused tensor in HF layout from its stacks, expert by expert (rows of each expert, a weight's
// out rows of in values or a bias's one row of out values).
void read_gpt_oss_fused(const GgufFile& f, const GptOssFusedLayout& g, float* dst) {
  for (size_t p = 0; p < g.parts.size(); p++) {
    const GptOssFusedLayout::Part& part = g.parts[p];
    const int64_t rows = g.bias ? 1 : part.out, cols = g.bias ? part.out : part.in;
    std::vector<float> buf(size_t(rows * cols));
    for (int64_t e = 0; e < g.experts; e++) {
      f.read_rows_f32(part.gguf, e * rows, rows, buf.data());
      f.release_rows(part.gguf, e * rows, rows);
      for (int64_t o = 0; o < part.out; o++)
        for (int64_t i = 0; i < part.in; i++) dst[g.offset(p, e, o, i)] = buf[size_t(o * part.in + i)];
    }
  }
}

int64_t llama_cpp_gemma_swa_period(bool gemma2) { return gemma2 ? 2 : 6; }

bool llama_cpp_swa_layer(int64_t period, int64_t layer) { return period == 0 || layer % period < period - 1; }

bool llama_cpp_gemma_27b(const LlamaConfig& c) { return c.n_layer == (c.model_type == "gemma2" ? 46 : 62); }

double llama_cpp_gemma_query_pre_attn_scalar(const LlamaConfig& c) {
  return llama_cpp_gemma_27b(c) ? double(c.hidden_size / c.n_head) : double(c.head_dim);
}

bool gguf_stores_unit_offset(const LlamaConfig& cfg, const std::string& hf_name) {
  return cfg.norm_unit_offset && hf_name.ends_with("norm.weight");
}

std::string hf_to_gguf_name(const LlamaConfig& cfg, const std::string& h) {
  if (auto l = split_layer(h, "model.layers."); l && cfg.sandwich_norms)
    for (const auto& n : kSandwichNormNames)
      if (l->second == n.hf) return "blk." + std::to_string(l->first) + "." + n.gguf;
  if (auto l = split_layer(h, "model.layers."); l && cfg.model_type == "gpt_oss")
    for (const auto& n : kGptOssNames)
      if (l->second == n.hf) return "blk." + std::to_string(l->first) + "." + n.gguf;
  return hf_to_gguf_name(h);
}

std::string hf_to_gguf_name(const std::string& h) {
  for (const auto& n : kGlobalNames)
    if (h == n.hf) return n.gguf;
  if (auto l = split_layer(h, "model.layers.")) {
    for (const auto& n : kLayerNames)
      if (l->second == n.hf) return "blk." + std::to_string(l->first) + "." + n.gguf;
    for (const auto& n : kExportLayerNames)
      if (l->second == n.hf) return "blk." + std::to_string(l->first) + "." + n.gguf;
  }
  return "";
}

std::vector<std::string> llama_hf_tensor_names(const LlamaConfig& cfg) {
  std::vector<std::string> out{"model.embed_tokens.weight"};
  for (int64_t l = 0; l < cfg.n_layer; l++) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    if (cfg.model_type == "gpt_oss") {  // GptOssForCausalLM's state dict: fused, interleaved expert stacks
      for (const char* n : {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",
                            "self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight",
                            "self_attn.v_proj.bias", "self_attn.o_proj.weight", "self_attn.o_proj.bias", "self_attn.sinks",
                            "mlp.router.weight", "mlp.router.bias", "mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj_bias",
                            "mlp.experts.down_proj", "mlp.experts.down_proj_bias", "post_attention_layernorm.weight"})
        if (cfg.attention_bias || !std::string(n).ends_with("_proj.bias")) out.push_back(p + n);
      continue;
    }
    for (const auto& n : kLayerNames) {
      if (!present(n, cfg)) continue;
      const std::string hf = n.hf;
      if (cfg.moe() && hf.rfind("mlp.", 0) == 0) continue;  // the router and the experts below
      // Phi-3's checkpoints hold q/k/v as one qkv_proj and gate/up as one gate_up_proj.
      if (cfg.fused_qkv && (hf == "self_attn.k_proj.weight" || hf == "self_attn.v_proj.weight")) continue;
      if (cfg.fused_gate_up && hf == "mlp.up_proj.weight") continue;
      if (cfg.fused_qkv && hf == "self_attn.q_proj.weight") out.push_back(p + "self_attn.qkv_proj.weight");
      else if (cfg.fused_gate_up && hf == "mlp.gate_proj.weight") out.push_back(p + "mlp.gate_up_proj.weight");
      else out.push_back(p + hf);
    }
    if (cfg.moe()) {  // the router, then each expert's weights, as the Hub checkpoints name them
      out.push_back(hf_router_name(cfg, l));
      for (int64_t e = 0; e < cfg.n_experts; e++)
        for (const auto& k : expert_kinds()) out.push_back(hf_expert_name(cfg, l, e, k));
    }
    if (cfg.sandwich_norms)  // Gemma: the MLP's input norm and the norm on its output
      for (const char* n : {"pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"}) out.push_back(p + n);
  }
  out.push_back("model.norm.weight");
  if (!cfg.tie_word_embeddings) out.push_back("lm_head.weight");
  return out;
}

namespace {

// The decoder's widths, layers and heads (`k`: the architecture's key prefix), consistent with each
// other and with the tensor count.
void read_shape(const GgufFile& f, const std::string& k, LlamaConfig& c) {
  c.hidden_size = key_i64(f, k + "embedding_length");
  c.intermediate_size = key_i64(f, k + "feed_forward_length");
  c.n_layer = key_i64(f, k + "block_count");
  c.n_head = key_i64(f, k + "attention.head_count");
  c.n_head_kv = f.has(k + "attention.head_count_kv") ? key_i64(f, k + "attention.head_count_kv") : c.n_head;
  if (c.hidden_size <= 0 || c.n_head <= 0 || c.n_head_kv <= 0 || c.n_layer <= 0 || c.intermediate_size <= 0 ||
      c.n_head % c.n_head_kv != 0)
    fail(ErrorKind::Format, f.path() + ": key '" + k + "attention.head_count'",
         "inconsistent shape: embedding_length " + std::to_string(c.hidden_size) + ", block_count " +
             std::to_string(c.n_layer) + ", head_count " + std::to_string(c.n_head) + ", head_count_kv " +
             std::to_string(c.n_head_kv));
  if (c.n_layer > int64_t(f.tensors().size()))  // every layer holds tensors: a count past them is a lie
    fail(ErrorKind::Format, f.path() + ": key '" + k + "block_count'",
         std::to_string(c.n_layer) + " layers but the file holds " + std::to_string(f.tensors().size()) + " tensors");
}

// The head dim (key_length, which value_length must equal) and the rotary dims (partial only on phi3).
void read_head_dims(const GgufFile& f, const std::string& k, const std::string& arch, LlamaConfig& c) {
  const bool phi3 = arch == "phi3";
  c.head_dim = f.has(k + "attention.key_length") ? f.get_i64(k + "attention.key_length") : c.hidden_size / c.n_head;
  if (f.has(k + "attention.value_length") && f.get_i64(k + "attention.value_length") != c.head_dim)
    fail(ErrorKind::Unsupported, f.path() + ": key '" + k + "attention.value_length'", "differs from the key length");
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    fail(ErrorKind::Format, f.path() + ": key '" + k + "attention.key_length'", "head dim " + std::to_string(c.head_dim) + " must be even and > 0");
  if (f.has(k + "rope.dimension_count") && f.get_i64(k + "rope.dimension_count") != c.head_dim) {
    const int64_t n_rot = f.get_i64(k + "rope.dimension_count");
    const std::string where = f.path() + ": key '" + k + "rope.dimension_count'";
    if (!phi3)  // Phi-4-mini's partial_rotary_factor; llama.cpp's other architectures here rotate all dims
      fail(ErrorKind::Unsupported, where,
           "partial rotary embedding (" + std::to_string(n_rot) + " of " + std::to_string(c.head_dim) +
               " dims) is not supported on " + arch, "partial rotary embeddings are read for phi3");
    if (n_rot < 2 || n_rot > c.head_dim || n_rot % 2 != 0)
      fail(ErrorKind::Format, where, std::to_string(n_rot) + " rotary dims of a head of " + std::to_string(c.head_dim) +
                                         ": expected an even count between 2 and the head dim");
    c.rotary_dim = n_rot;
  }
}

// Rope scaling: linear/none in metadata (older files: rope.scale_linear), llama3 as a tensor,
// Phi-3's LongRoPE as two tensors.
void read_rope_scaling(const GgufFile& f, const std::string& k, bool phi3, LlamaConfig& c) {
  std::string st = f.has(k + "rope.scaling.type") ? f.get_string(k + "rope.scaling.type") : "none";
  if (st == "linear") {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = f32_decimal(f.get_f32(k + "rope.scaling.factor"));
  } else if (st == "yarn") {
    c.rope_scaling = read_yarn(f, k);
  } else if (st != "none") {
    fail(ErrorKind::Unsupported, f.path() + ": key '" + k + "rope.scaling.type'", "rope scaling '" + st + "' is not supported",
         "supported: none, linear, yarn, llama3 (rope_freqs), longrope (phi3's rope_factors_long/short)");
  } else if (f.has(k + "rope.scale_linear") && f.get_f32(k + "rope.scale_linear") != 1.0f) {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = f32_decimal(f.get_f32(k + "rope.scale_linear"));
  }
  if (f.has_tensor("rope_freqs.weight")) {
    if (c.rope_scaling.type != "none")
      fail(ErrorKind::Unsupported, f.path() + ": tensor 'rope_freqs.weight'", "rope factors together with " + st + " scaling");
    expect_shape(f, "rope_freqs.weight", {c.head_dim / 2});
    int64_t orig = f.has(k + "rope.scaling.original_context_length") ? f.get_i64(k + "rope.scaling.original_context_length") : 8192;
    c.rope_scaling = recover_llama3(f.read_tensor_f32("rope_freqs.weight"), c.rope_theta, c.head_dim, orig,
                                    f.path() + ": tensor 'rope_freqs.weight'");
  }
  read_longrope(f, k, phi3, c);
}

// The vocabulary size and the special token ids.
void read_vocab_and_tokens(const GgufFile& f, LlamaConfig& c) {
  // Vocabulary: the embedding defines it; the token list must not be longer.
  const GgufTensorInfo& emb = f.tensor("token_embd.weight");
  if (emb.ne.size() != 2)
    fail(ErrorKind::Format, f.path() + ": tensor 'token_embd.weight'", "expected 2 dimensions, got " + std::to_string(emb.ne.size()));
  c.vocab_size = emb.ne[1];
  if (f.has("tokenizer.ggml.tokens") && int64_t(f.get_array_size("tokenizer.ggml.tokens")) > c.vocab_size)
    fail(ErrorKind::Format, f.path() + ": key 'tokenizer.ggml.tokens'",
         std::to_string(f.get_array_size("tokenizer.ggml.tokens")) + " tokens but token_embd.weight has " +
             std::to_string(c.vocab_size) + " rows");
  // A SentencePiece ("llama") vocabulary without the keys has llama.cpp's ids 1 and 2.
  const bool spm = f.has("tokenizer.ggml.model") && f.get_string("tokenizer.ggml.model") == "llama";
  c.bos_token_id = f.has("tokenizer.ggml.bos_token_id") ? f.get_i64("tokenizer.ggml.bos_token_id") : spm ? 1 : -1;
  c.eos_token_id = f.has("tokenizer.ggml.eos_token_id") ? f.get_i64("tokenizer.ggml.eos_token_id") : spm ? 2 : -1;
  if (f.has("tokenizer.ggml.padding_token_id")) c.pad_token_id = f.get_i64("tokenizer.ggml.padding_token_id");
}

// Every tensor the decoder needs present with ggml shapes (ne = HF shape reversed), and no layer's
// tensor past block_count.
void check_tensor_shapes(const GgufFile& f, const LlamaConfig& c) {
  for (const std::string& hf : llama_hf_tensor_names(c)) {
    std::vector<int64_t> ne = llama_hf_tensor_shape(c, hf);
    std::reverse(ne.begin(), ne.end());
    if (const auto x = gguf_expert_slice(c, hf)) {  // each layer's stacks once, with their expert count
      if (x->expert == 0) expect_shape(f, x->stack, {ne[0], ne[1], c.n_experts});
      continue;
    }
    if (checked_layout(f, c, hf)) continue;  // gpt-oss's fused experts: their stacks
    expect_shape(f, hf_to_gguf_name(c, hf), ne);
  }
  for (const GgufTensorInfo& t : f.tensors())
    if (const auto l = split_layer(t.name, "blk."); l && l->first >= c.n_layer)
      fail(ErrorKind::Format, f.path() + ": tensor '" + t.name + "'", "layer index beyond block_count " + std::to_string(c.n_layer));
}

}  // namespace

LlamaConfig gguf_llama_config(const GgufFile& f) {
  std::string arch = f.get_string("general.architecture");
  const GgufArch* ai = gguf_arch_to_read(arch);
  if (!ai)
    fail(ErrorKind::Unsupported, f.path() + ": key 'general.architecture'", "architecture '" + arch + "' is not supported",
         "supported GGUF architectures: " + gguf_readable_archs() + " (llama: Llama, Mistral, SmolLM2, Mixtral)");
  const std::string k = arch + ".";
  const bool gemma = arch == "gemma2" || arch == "gemma3", phi3 = arch == "phi3";

  LlamaConfig c;
  c.model_type = ai->model_type;
  c.attention_bias = ai->qkv_bias;
  c.qk_norm = ai->qk_norm;
  c.fused_qkv = c.fused_gate_up = phi3;  // llama.cpp's attn_qkv and ffn_up (gate rows, then up rows)
  c.name = f.path();
  read_shape(f, k, c);
  read_head_dims(f, k, arch, c);
  if (f.has(k + "context_length")) c.max_position_embeddings = f.get_i64(k + "context_length");
  if (f.has(k + "attention.layer_norm_rms_epsilon")) c.rms_norm_eps = f32_decimal(f.get_f32(k + "attention.layer_norm_rms_epsilon"));
  if (f.has(k + "rope.freq_base")) c.rope_theta = f32_decimal(f.get_f32(k + "rope.freq_base"));

  read_rope_scaling(f, k, phi3, c);
  if (gemma) read_gemma_layout(f, k, arch == "gemma2", c);
  if (phi3 && f.has(k + "attention.sliding_window"))  // 0: none (Phi-4)
    c.sliding_window = key_i64(f, k + "attention.sliding_window");

  read_vocab_and_tokens(f, c);
  c.tie_word_embeddings = !f.has_tensor("output.weight");
  read_experts(f, k, arch, c);  // before the shapes below, which it changes
  if (arch == "gpt-oss") read_gpt_oss_layout(f, k, c);

  check_tensor_shapes(f, c);
  return c;
}

bool gguf_qk_permuted(const LlamaConfig& cfg) {
  return cfg.model_type == "llama" || cfg.model_type == "mistral" || cfg.model_type == "mixtral";
}

void gguf_permute_qk_rows(const float* hf, float* gguf, int64_t n_head, int64_t rows, int64_t cols) {
  QLORA_ASSERT(n_head > 0 && rows % (2 * n_head) == 0);
  const int64_t hd = rows / n_head, half = hd / 2;
  for (int64_t h = 0; h < n_head; h++)
    for (int64_t j = 0; j < half; j++)
      for (int64_t s = 0; s < 2; s++)
        std::copy_n(hf + (h * hd + s * half + j) * cols, cols, gguf + (h * hd + 2 * j + s) * cols);
}

void gguf_unpermute_qk_rows(const float* gguf, float* hf, int64_t n_head, int64_t rows, int64_t cols) {
  QLORA_ASSERT(n_head > 0 && rows % (2 * n_head) == 0);
  const int64_t hd = rows / n_head, half = hd / 2;
  for (int64_t h = 0; h < n_head; h++)
    for (int64_t j = 0; j < half; j++)
      for (int64_t s = 0; s < 2; s++)
        std::copy_n(gguf + (h * hd + 2 * j + s) * cols, cols, hf + (h * hd + s * half + j) * cols);
}

namespace {

std::string gguf_source(const GgufFile& f, const LlamaConfig& cfg, const std::string& hf_name) {
  std::string g = hf_to_gguf_name(cfg, hf_name);
  if (hf_name == "lm_head.weight" && !f.has_tensor("output.weight")) g = "token_embd.weight";  // tied
  if (g.empty())
    fail(ErrorKind::Format, f.path() + ": tensor '" + hf_name + "'", "no GGUF tensor corresponds to this HF name",
         "names look like model.layers.N.self_attn.q_proj.weight");
  return g;
}

}  // namespace

namespace {

// The 3-D stack that holds the slice's expert; nullptr when the file has no such stack or the
// stack no such expert.
const GgufTensorInfo* stack_holding(const GgufFile& f, const ExpertSlice& x) {
  if (!f.has_tensor(x.stack)) return nullptr;
  const GgufTensorInfo& t = f.tensor(x.stack);
  return t.ne.size() == 3 && x.expert >= 0 && x.expert < t.ne[2] ? &t : nullptr;
}

// The same, an error naming the stack when it is missing or holds no such expert.
const GgufTensorInfo& expert_stack(const GgufFile& f, const ExpertSlice& x) {
  if (const GgufTensorInfo* t = stack_holding(f, x)) return *t;
  f.tensor(x.stack);  // a missing stack: Error(Format) naming it
  fail(ErrorKind::Shape, f.path() + ": tensor '" + x.stack + "'", "holds no expert " + std::to_string(x.expert));
}

}  // namespace

std::optional<GptOssFusedLayout> gpt_oss_fused_layout(const LlamaConfig& c, const std::string& hf_name) {
  const bool bias = hf_name.ends_with("_bias");
  const std::string stack = gpt_oss_stack(c, bias ? hf_name.substr(0, hf_name.size() - 5) : hf_name);
  const auto l = split_layer(hf_name, "model.layers.");
  if (stack.empty() || !l) return std::nullopt;
  GptOssFusedLayout g;
  g.gate_up = stack == "gate_up_proj";
  g.bias = bias;
  g.experts = c.n_experts;
  const int64_t F = c.expert_intermediate_size, C = c.hidden_size;
  const int64_t out = g.gate_up ? F : C, in = bias ? 1 : g.gate_up ? C : F;
  const std::string blk = "blk." + std::to_string(l->first) + ".", what = bias ? "_exps.bias" : "_exps.weight";
  for (const char* k : g.gate_up ? std::vector<const char*>{"ffn_gate", "ffn_up"} : std::vector<const char*>{"ffn_down"})
    g.parts.push_back({blk + k + what, bias ? std::vector<int64_t>{out, g.experts} : std::vector<int64_t>{in, out, g.experts}, in, out});
  return g;
}

int64_t GptOssFusedLayout::offset(size_t p, int64_t e, int64_t o, int64_t i) const {
  const int64_t n = int64_t(parts.size()), out = parts[p].out, in = parts[p].in;
  if (bias) return (e * out + o) * n + int64_t(p);      // (E, n out): gate_up's interleaved
  if (gate_up) return ((e * in + i) * out + o) * n + int64_t(p);  // (E, C, 2F): gate 2o, up 2o + 1
  return (e * in + i) * out + o;                         // down_proj (E, F, C): each expert transposed
}

int64_t GptOssFusedLayout::quantized_row(size_t p, int64_t e, int64_t o) const {
  return (e * parts[p].out + o) * int64_t(parts.size()) + int64_t(p);
}

bool gguf_read_hf_quantized(const GgufFile& f, const LlamaConfig& cfg, const std::string& hf_name, int64_t rows,
                            int64_t cols, QuantizedTensor& q) {
  const auto g = checked_layout(f, cfg, hf_name);
  if (!g || g->bias || cfg.experts_stored != "mxfp4") return false;
  for (const GptOssFusedLayout::Part& p : g->parts) {
    if (f.tensor(p.gguf).type != GgmlType::MXFP4)
      fail(ErrorKind::Format, f.path() + ": tensor '" + p.gguf + "'",
           std::string("is ") + ggml_type_name(f.tensor(p.gguf).type) + ", the file's other expert stacks MXFP4");
  }
  const int64_t in = g->parts[0].in, out = g->parts[0].out * int64_t(g->parts.size());  // the fused weight's, per expert
  if (rows != g->experts * out || cols != in)
    fail(ErrorKind::Internal, f.path() + ": tensor '" + hf_name + "'",
         "read as " + std::to_string(rows) + " rows of " + std::to_string(cols) + ", the stacks hold " +
             std::to_string(g->experts * out) + " of " + std::to_string(in));
  q = QuantizedTensor{};
  q.params = mxfp4_expert_params();
  q.rows = rows;
  q.cols = cols;
  q.data.resize(size_t(rows * cols / 2));
  q.scales.resize(size_t(rows * cols / 32));
  const int64_t row_bytes = ggml_row_bytes(GgmlType::MXFP4, in);
  for (size_t p = 0; p < g->parts.size(); p++)
    for (int64_t e = 0; e < g->experts; e++)
      for (int64_t o = 0; o < g->parts[p].out; o++) {
        const int64_t r = g->quantized_row(p, e, o);
        const uint8_t* src = f.tensor_data(g->parts[p].gguf) + (e * g->parts[p].out + o) * row_bytes;
        mxfp4_from_ggml(src, in, q.data.data() + r * in / 2, q.scales.data() + r * in / 32);
      }
  for (const GptOssFusedLayout::Part& p : g->parts) f.release_pages(p.gguf);
  return true;
}

bool gguf_has_hf_tensor(const GgufFile& f, const LlamaConfig& cfg, const std::string& hf_name) {
  if (const auto x = gguf_expert_slice(cfg, hf_name)) return stack_holding(f, *x) != nullptr;
  if (const auto g = gpt_oss_fused_layout(cfg, hf_name))
    return std::all_of(g->parts.begin(), g->parts.end(), [&](const GptOssFusedLayout::Part& p) { return f.has_tensor(p.gguf); });
  const std::string g = hf_to_gguf_name(cfg, hf_name);
  return !g.empty() && f.has_tensor(g);
}

std::vector<int64_t> gguf_hf_shape(const GgufFile& f, const LlamaConfig& cfg, const std::string& hf_name) {
  if (const auto x = gguf_expert_slice(cfg, hf_name)) {
    const GgufTensorInfo& t = expert_stack(f, *x);
    return {t.ne[1], t.ne[0]};
  }
  if (checked_layout(f, cfg, hf_name)) {  // the HF shape when every stack has its shape
    const auto fused_shape = gpt_oss_tensor_shape(cfg, hf_name);
    QLORA_ASSERT(fused_shape.has_value());
    return *fused_shape;
  }
  return f.tensor(gguf_source(f, cfg, hf_name)).shape();
}

void gguf_release_hf_tensor(const GgufFile& f, const LlamaConfig& cfg, const std::string& hf_name) {
  if (const auto x = gguf_expert_slice(cfg, hf_name)) return f.release_rows(x->stack, x->expert * x->rows, x->rows);
  if (const auto g = gpt_oss_fused_layout(cfg, hf_name)) {
    for (const GptOssFusedLayout::Part& p : g->parts) f.release_pages(p.gguf);
    return;
  }
  f.release_pages(hf_to_gguf_name(cfg, hf_name));
}

void gguf_read_hf_tensor(const GgufFile& f, const LlamaConfig& cfg, const std::string& hf_name, float* dst) {
  if (const auto x = gguf_expert_slice(cfg, hf_name)) {
    expert_stack(f, *x);  // the stack holds the expert
    return f.read_rows_f32(x->stack, x->expert * x->rows, x->rows, dst);
  }
  if (const auto fused = checked_layout(f, cfg, hf_name)) return read_gpt_oss_fused(f, *fused, dst);
  const std::string g = gguf_source(f, cfg, hf_name);
  int64_t n_head = 0;
  if (gguf_qk_permuted(cfg)) {
    if (hf_name.find(".self_attn.q_proj.") != std::string::npos) n_head = cfg.n_head;
    if (hf_name.find(".self_attn.k_proj.") != std::string::npos) n_head = cfg.n_head_kv;
  }
  if (n_head == 0) {
    f.read_tensor_f32(g, dst);
    // Gemma's converter stores every norm as 1 + w; the checkpoint's w comes back exactly wherever
    // 1 + w was exact, and 1 + (stored - 1) is the stored value bit for bit (Sterbenz), which is
    // what the norm multiplies by in f32 on both sides.
    if (gguf_stores_unit_offset(cfg, hf_name)) {
      const size_t n = size_t(f.tensor(g).n_elements());
      for (size_t i = 0; i < n; i++) dst[i] -= 1.0f;
    }
    return;
  }
  const GgufTensorInfo& t = f.tensor(g);
  const int64_t rows = t.ne.size() == 2 ? t.ne[1] : t.ne[0], cols = t.ne.size() == 2 ? t.ne[0] : 1;
  if (t.ne.size() > 2 || rows % (2 * n_head) != 0)
    fail(ErrorKind::Shape, f.path() + ": tensor '" + g + "'",
         std::to_string(rows) + " rows do not split into " + std::to_string(n_head) + " heads of even size");
  std::vector<float> tmp(size_t(rows * cols));  // (n_head * head_dim, cols) in GGUF row order
  f.read_tensor_f32(g, tmp.data());
  gguf_unpermute_qk_rows(tmp.data(), dst, n_head, rows, cols);
}

}  // namespace qlora
