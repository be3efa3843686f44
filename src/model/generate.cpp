// fp32 CPU decoding with a KV cache. The math is the training forward's (CPU backend ops for
// RMSNorm, RoPE, SwiGLU; inv_freq from rope_inv_freq), restated for a cache: each new token
// attends to every cached position, so no causal mask is needed beyond the cache length.
#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace qlora {

struct Generator::Layer {
  std::vector<float> ln1, ln2;  // (C)
  std::vector<float> wqkv;      // (q_dim + 2 kv_dim, C): q_proj, k_proj, v_proj rows stacked
  std::vector<float> bqkv;      // (q_dim + 2 kv_dim), empty without attention_bias
  std::vector<float> wo;        // (C, q_dim)
  std::vector<float> wgu;       // (2F, C): gate_proj rows, then up_proj rows
  std::vector<float> wd;        // (C, F)
  std::vector<float> kc, vc;    // (capacity, Hkv, D) cache; keys stored with RoPE applied
};

static void append(std::vector<float>& dst, const std::vector<float>& src) { dst.insert(dst.end(), src.begin(), src.end()); }

Generator::Generator(LlamaModel& model) : cfg_(model.config()), cpu_(make_cpu_backend()) {
  const std::string pre = "layers.";
  embed_ = model.weight_f32("embed_tokens");
  norm_ = model.weight_f32("norm");
  if (!cfg_.tie_word_embeddings) head_ = model.weight_f32("lm_head");
  inv_freq_ = rope_inv_freq(cfg_);
  layers_.resize(size_t(cfg_.n_layer));
  for (int64_t l = 0; l < cfg_.n_layer; l++) {
    Layer& L = layers_[size_t(l)];
    const std::string p = pre + std::to_string(l) + ".";
    L.ln1 = model.weight_f32(p + "input_layernorm");
    L.ln2 = model.weight_f32(p + "post_attention_layernorm");
    for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
      append(L.wqkv, model.effective_weight(l, proj));
      if (cfg_.attention_bias) append(L.bqkv, model.weight_f32(p + proj + ".bias"));
    }
    L.wo = model.effective_weight(l, "o_proj");
    L.wgu = model.effective_weight(l, "gate_proj");
    append(L.wgu, model.effective_weight(l, "up_proj"));
    L.wd = model.effective_weight(l, "down_proj");
  }
  logits_.assign(size_t(cfg_.vocab_size), 0.0f);
}

Generator::~Generator() = default;

void Generator::reset() { n_past_ = 0; }

void Generator::ensure_capacity(int64_t tokens) {
  if (tokens <= capacity_) return;
  // Rows are positions, so growing the vectors keeps every cached row in place.
  capacity_ = std::max(tokens, std::max<int64_t>(64, 2 * capacity_));
  for (Layer& L : layers_) {
    L.kc.resize(size_t(capacity_ * cfg_.kv_dim()));
    L.vc.resize(size_t(capacity_ * cfg_.kv_dim()));
  }
}

// y (n, rows) "=" x (n, cols) W^T, W (rows, cols).
static void linear(Backend& cpu, float* y, const float* x, const float* w, int64_t n, int64_t rows, int64_t cols) {
  if (n == 1) {
    cpu::gemv(w, rows, cols, x, y);
    return;
  }
  cpu.matmul({f32_view(y, {n, rows}), f32_view(const_cast<float*>(x), {n, cols}),
              f32_view(const_cast<float*>(w), {rows, cols}), n, rows, cols, false, true, 1.0f, 0.0f});
}

// att (n, Hq, D) "=" softmax(scale q k^T) v for the n newest tokens, each over cache rows
// [0, its position]. Scores and sums in double, as the CPU attention_fwd computes them.
void Generator::attend(const Layer& L, int64_t n) {
  const int64_t Hq = cfg_.n_head, Hkv = cfg_.n_head_kv, D = cfg_.head_dim, group = Hq / Hkv;
  const double scale = 1.0 / std::sqrt(double(D));
  const int64_t first = n_past_;  // position of the first new token
  // One decoded token is too little work for a parallel region: waking OpenMP threads next to
  // OpenBLAS's own (which spin after each GEMV) cost 10x the math on 2 cores. Prompts fork.
  const bool par = n > 1 && n * Hq * (first + n) * D > cpu::kParallelMin;
#pragma omp parallel if (par)
  {
    std::vector<double> p(static_cast<size_t>(first + n)), acc(static_cast<size_t>(D));
#pragma omp for collapse(2) schedule(static)
    for (int64_t t = 0; t < n; t++)
      for (int64_t h = 0; h < Hq; h++) {
        const int64_t last = first + t, hk = h / group;
        const float* qt = q_.data() + (t * Hq + h) * D;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s <= last; s++) {
          const float* ks = L.kc.data() + (s * Hkv + hk) * D;
          double dot = 0.0;
          for (int64_t d = 0; d < D; d++) dot += double(qt[d]) * double(ks[d]);
          p[size_t(s)] = dot * scale;
          mx = std::max(mx, p[size_t(s)]);
        }
        double sum = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t s = 0; s <= last; s++) {
          const double e = std::exp(p[size_t(s)] - mx);
          sum += e;
          const float* vs = L.vc.data() + (s * Hkv + hk) * D;
          for (int64_t d = 0; d < D; d++) acc[size_t(d)] += e * double(vs[d]);
        }
        float* out = att_.data() + (t * Hq + h) * D;
        for (int64_t d = 0; d < D; d++) out[d] = float(acc[size_t(d)] / sum);
      }
  }
}

// x (n, C) -> the layer's output in place; appends the n tokens' keys and values to the cache.
void Generator::layer_fwd(Layer& L, int64_t n) {
  Backend& be = *cpu_;
  const int64_t C = cfg_.hidden_size, F = cfg_.intermediate_size, D = cfg_.head_dim;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  const Tensor inv = f32_view(inv_freq_.data(), {D / 2});
  const float eps = float(cfg_.rms_norm_eps);

  be.rmsnorm_fwd({f32_view(ln_.data(), {n, C}), f32_view(rstd_.data(), {n}), f32_view(x_.data(), {n, C}),
                  f32_view(L.ln1.data(), {C}), n, C, eps});
  // q, k, v: one GEMV over the stacked weight for a single token, three GEMMs for a prompt.
  if (n == 1) {
    linear(be, q_.data(), ln_.data(), L.wqkv.data(), 1, qd + 2 * kvd, C);  // q_ holds [q | k | v]
    std::copy_n(q_.data() + qd, kvd, k_.data());
    std::copy_n(q_.data() + qd + kvd, kvd, v_.data());
  } else {
    linear(be, q_.data(), ln_.data(), L.wqkv.data(), n, qd, C);
    linear(be, k_.data(), ln_.data(), L.wqkv.data() + qd * C, n, kvd, C);
    linear(be, v_.data(), ln_.data(), L.wqkv.data() + (qd + kvd) * C, n, kvd, C);
  }
  if (!L.bqkv.empty()) {
    be.bias_add({f32_view(q_.data(), {n, qd}), f32_view(L.bqkv.data(), {qd}), n, qd});
    be.bias_add({f32_view(k_.data(), {n, kvd}), f32_view(L.bqkv.data() + qd, {kvd}), n, kvd});
    be.bias_add({f32_view(v_.data(), {n, kvd}), f32_view(L.bqkv.data() + qd + kvd, {kvd}), n, kvd});
  }
  be.rope_fwd({f32_view(q_.data(), {n, cfg_.n_head, D}), inv, pos_.data(), n, cfg_.n_head, D});
  be.rope_fwd({f32_view(k_.data(), {n, cfg_.n_head_kv, D}), inv, pos_.data(), n, cfg_.n_head_kv, D});
  std::copy_n(k_.data(), n * kvd, L.kc.data() + n_past_ * kvd);
  std::copy_n(v_.data(), n * kvd, L.vc.data() + n_past_ * kvd);
  attend(L, n);

  linear(be, tmp_.data(), att_.data(), L.wo.data(), n, C, qd);
  be.add({f32_view(x_.data(), {n * C}), f32_view(tmp_.data(), {n * C}), n * C});  // x = xmid
  be.rmsnorm_fwd({f32_view(ln_.data(), {n, C}), f32_view(rstd_.data(), {n}), f32_view(x_.data(), {n, C}),
                  f32_view(L.ln2.data(), {C}), n, C, eps});
  float* up = up_.data();
  if (n == 1) {
    linear(be, gate_.data(), ln_.data(), L.wgu.data(), 1, 2 * F, C);  // gate_ holds [gate | up]
    up = gate_.data() + F;
  } else {
    linear(be, gate_.data(), ln_.data(), L.wgu.data(), n, F, C);
    linear(be, up, ln_.data(), L.wgu.data() + F * C, n, F, C);
  }
  // h = silu(gate) * up, written over gate (elementwise, so in place is safe).
  be.swiglu_fwd({f32_view(gate_.data(), {n * F}), f32_view(gate_.data(), {n * F}), f32_view(up, {n * F}), n * F});
  linear(be, tmp_.data(), gate_.data(), L.wd.data(), n, C, F);
  be.add({f32_view(x_.data(), {n * C}), f32_view(tmp_.data(), {n * C}), n * C});
}

const std::vector<float>& Generator::feed(const std::vector<int32_t>& ids) {
  const int64_t n = int64_t(ids.size());
  if (n == 0) fail(ErrorKind::Data, "generate", "no tokens to feed", "the prompt encodes to no tokens");
  const int64_t C = cfg_.hidden_size, F = cfg_.intermediate_size, V = cfg_.vocab_size;
  ensure_capacity(n_past_ + n);
  x_.resize(size_t(n * C));
  ln_.resize(size_t(n * C));
  rstd_.resize(size_t(n));
  q_.resize(size_t(n * cfg_.q_dim() + 2 * cfg_.kv_dim()));  // + room for [q | k | v] of one token
  k_.resize(size_t(n * cfg_.kv_dim()));
  v_.resize(size_t(n * cfg_.kv_dim()));
  att_.resize(size_t(n * cfg_.q_dim()));
  tmp_.resize(size_t(n * C));
  gate_.resize(size_t(n * F + F));  // + room for [gate | up] of one token
  up_.resize(size_t(n * F));
  pos_.resize(size_t(n));
  for (int64_t i = 0; i < n; i++) pos_[size_t(i)] = int32_t(n_past_ + i);

  cpu_->embedding_fwd({f32_view(x_.data(), {n, C}), f32_view(embed_.data(), {V, C}), ids.data(), n, C, V});
  for (Layer& L : layers_) layer_fwd(L, n);
  n_past_ += n;

  // Final norm and LM head for the last token only: that is all generation reads.
  const float* last = x_.data() + (n - 1) * C;
  float rstd = 0.0f;
  cpu_->rmsnorm_fwd({f32_view(ln_.data(), {1, C}), f32_view(&rstd, {1}), f32_view(const_cast<float*>(last), {1, C}),
                     f32_view(norm_.data(), {C}), 1, C, float(cfg_.rms_norm_eps)});
  const std::vector<float>& head = head_.empty() ? embed_ : head_;
  cpu::gemv(head.data(), V, C, ln_.data(), logits_.data());
  return logits_;
}

std::vector<int32_t> Generator::greedy(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                       const std::vector<int32_t>& stop_ids) {
  reset();
  std::vector<int32_t> out;
  if (max_new_tokens <= 0) return out;
  feed(prompt);
  ensure_capacity(n_past_ + max_new_tokens);
  for (;;) {
    const int32_t next = argmax_token(logits_);
    out.push_back(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
    if (int64_t(out.size()) >= max_new_tokens) break;
    feed({next});
  }
  return out;
}

int32_t argmax_token(const std::vector<float>& logits) {
  int32_t best = 0;
  float bv = -std::numeric_limits<float>::infinity();
  bool found = false;
  for (size_t i = 0; i < logits.size(); i++)
    if (!found ? !std::isnan(logits[i]) : logits[i] > bv) {  // strict >: the lowest id keeps a tie
      best = int32_t(i);
      bv = logits[i];
      found = true;
    }
  return best;
}

}  // namespace qlora
