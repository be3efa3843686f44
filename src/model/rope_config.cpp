// RoPE: inverse frequencies with linear / llama3 / LongRoPE / YaRN scaling, and the attention factors
// LongRoPE and YaRN derive.
#include "model/llama_config.h"

#include <algorithm>
#include <cmath>

namespace qlora {

double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

bool yarn_attention_factor_is_derived(const RopeScaling& r) {
  return std::fabs(r.attention_factor - yarn_mscale(r.factor, 1.0)) <= 1e-12 * r.attention_factor;
}

double longrope_attention_factor(double factor, int64_t original_max_position_embeddings) {
  return factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(double(original_max_position_embeddings)));
}

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

}  // namespace qlora
