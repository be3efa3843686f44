// LoRA gradients of the whole model against finite differences of an independent double-precision
// forward (written here from the Hugging Face modeling code: RMSNorm, rotate-half RoPE, grouped-query
// causal attention, SwiGLU MLP, LoRA B·A·x·alpha/r on every linear, shifted cross-entropy summed
// over tokens; Gemma 3's (1 + w) norms around both blocks, scaled embeddings, GeGLU,
// query_pre_attn_scalar and per-layer RoPE bases). The FD step is 1e-5 in double, so the FD value is exact to ~1e-9 relative and
// the check measures the engine's fp32 gradients themselves: every LoRA parameter of the model is
// checked, each tensor against the largest |gradient| of that tensor.
#include <gtest/gtest.h>

#include <optional>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/rng.h"
#include "model/experts.h"
#include "model/llama_config.h"
#include "model_test_util.h"
#include "train/data.h"
#include "train/preference_step.h"

using namespace qlora;
using namespace qlora::testing_util;

namespace {

using Mat = std::vector<double>;  // row-major

Mat to_double(const std::vector<float>& v) { return Mat(v.begin(), v.end()); }

// y[n, out] = x[n, in] · W[out, in]^T
Mat linear(const Mat& x, const Mat& w, int64_t n, int64_t in, int64_t out) {
  Mat y(size_t(n * out), 0.0);
  for (int64_t i = 0; i < n; i++)
    for (int64_t o = 0; o < out; o++) {
      double s = 0;
      for (int64_t k = 0; k < in; k++) s += x[size_t(i * in + k)] * w[size_t(o * in + k)];
      y[size_t(i * out + o)] = s;
    }
  return y;
}

// Columns [c0, c0 + w) of each of the n rows of x (n, cols).
Mat split_cols(const Mat& x, int64_t n, int64_t cols, int64_t c0, int64_t w) {
  Mat y(size_t(n * w));
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < w; j++) y[size_t(i * w + j)] = x[size_t(i * cols + c0 + j)];
  return y;
}

// The model in double: base weights from the fixture's safetensors, LoRA weights by engine name.
struct RefModel {
  LlamaConfig c;
  std::map<std::string, Mat> base;  // HF names
  std::map<std::string, Mat> lora;  // "layers.L.q_proj.lora_A" ...
  double lora_scale = 0;
  std::vector<double> inv_freq, inv_freq_local;  // global layers, Gemma 3's sliding layers

  const Mat& w(const std::string& name) const { return base.at(name); }

  // x (n, in) through projection `proj` of layer l: base (+ bias) + scale · B·A·x.
  Mat proj(const Mat& x, int64_t n, int l, const std::string& module, const std::string& proj, int64_t in,
           int64_t out) const {
    const std::string hf = "model.layers." + std::to_string(l) + "." + module + "." + proj;
    Mat y = linear(x, w(hf + ".weight"), n, in, out);
    if (auto b = base.find(hf + ".bias"); b != base.end())
      for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < out; o++) y[size_t(i * out + o)] += b->second[size_t(o)];
    const std::string key = "layers." + std::to_string(l) + "." + proj;
    if (auto a = lora.find(key + ".lora_A"); a != lora.end()) {
      const int64_t r = int64_t(a->second.size()) / in;
      const Mat ax = linear(x, a->second, n, in, r);
      const Mat bax = linear(ax, lora.at(key + ".lora_B"), n, r, out);
      for (size_t i = 0; i < y.size(); i++) y[i] += lora_scale * bax[i];
    }
    return y;
  }

  // Expert e's weight of `kind` (gate_proj, up_proj, down_proj) in layer l applied to one row x,
  // plus its adapter where the experts are adapted: s (x A_e^T) B_e^T with A_e rows e*r.. of
  // "layers.l.experts.<stack>.lora_A" and B_e rows e*out.. of lora_B (the engine's layout); gate and
  // up take gate_up_proj's first and second F rows of B_e.
  Mat expert(const Mat& x, int l, int64_t e, const std::string& kind, int64_t in, int64_t out) const {
    Mat y = linear(x, w(hf_expert_name(c, l, e, kind)), 1, in, out);
    if (c.moe_biases) {  // gpt-oss: expert e's output bias (stored by the engine's stack names)
      const Mat& b = w("model.layers." + std::to_string(l) + ".mlp.experts." + kind + ".bias");
      for (int64_t i = 0; i < out; i++) y[size_t(i)] += b[size_t(e * out + i)];
    }
    const std::string stack = kind == "down_proj" ? "down_proj" : "gate_up_proj";
    const std::string key = "layers." + std::to_string(l) + ".experts." + stack;
    const auto a = lora.find(key + ".lora_A");
    if (a == lora.end()) return y;
    const int64_t r = int64_t(a->second.size()) / (c.n_experts * in);
    const int64_t rows = stack == "down_proj" ? out : 2 * out, row0 = kind == "up_proj" ? out : 0;
    const Mat ae(a->second.begin() + e * r * in, a->second.begin() + (e + 1) * r * in);
    const Mat& b = lora.at(key + ".lora_B");
    const Mat be(b.begin() + (e * rows + row0) * r, b.begin() + (e * rows + row0 + out) * r);
    const Mat bax = linear(linear(x, ae, 1, in, r), be, 1, r, out);
    for (int64_t i = 0; i < out; i++) y[size_t(i)] += lora_scale * bax[size_t(i)];
    return y;
  }

  // The experts' gated activation of gate value a and up value u: SwiGLU, or gpt-oss's clamped one.
  double act(double a, double u) const {
    if (c.hidden_act != Activation::ClampedSwiglu) return a / (1.0 + std::exp(-a)) * u;
    const double lim = c.swiglu_clamp.limit, gc = std::min(a, lim), uc = std::clamp(u, -lim, lim);
    return (uc + 1.0) * gc / (1.0 + std::exp(-double(c.swiglu_clamp.alpha) * gc));
  }

  // Each of the n rows of d values (d = hidden_size unless given: head_dim for Qwen3's q/k norms).
  Mat rms_norm(const Mat& x, int64_t n, const Mat& g, int64_t d = 0) const {
    if (d == 0) d = c.hidden_size;
    Mat y(x.size());
    for (int64_t i = 0; i < n; i++) {
      double ss = 0;
      for (int64_t k = 0; k < d; k++) ss += x[size_t(i * d + k)] * x[size_t(i * d + k)];
      const double inv = 1.0 / std::sqrt(ss / double(d) + c.rms_norm_eps);
      for (int64_t k = 0; k < d; k++)
        y[size_t(i * d + k)] = x[size_t(i * d + k)] * inv * (g[size_t(k)] + (c.norm_unit_offset ? 1.0 : 0.0));
    }
    return y;
  }

  // Rotate-half RoPE over the first rope_dim() dims of each head of q (n, heads*hd), position p of
  // row i, cos and sin times the LongRoPE attention factor.
  void rope(Mat& q, int64_t n, int64_t heads, const std::vector<int32_t>& pos, bool local) const {
    const std::vector<double>& inv_freq = local ? inv_freq_local : this->inv_freq;
    const int64_t hd = c.head_dim, half = c.rope_dim() / 2;
    const double m = rope_attention_scale(c);
    for (int64_t i = 0; i < n; i++)
      for (int64_t h = 0; h < heads; h++) {
        double* v = q.data() + (i * heads + h) * hd;
        for (int64_t k = 0; k < half; k++) {
          const double a = double(pos[size_t(i)]) * inv_freq[size_t(k)];
          const double x1 = v[k], x2 = v[k + half];
          v[k] = m * (x1 * std::cos(a) - x2 * std::sin(a));
          v[k + half] = m * (x2 * std::cos(a) + x1 * std::sin(a));
        }
      }
  }

  // Summed cross-entropy of `batch`, plus router_aux_loss_coef times transformers' load-balancing
  // loss over every layer's routing of every token (E sum_e f_e P_e, R = layers x tokens).
  double loss(const Batch& batch) const {
    aux_count.assign(size_t(c.n_experts), 0.0);
    aux_prob.assign(size_t(c.n_experts), 0.0);
    double total = 0;
    for (double v : token_losses(batch)) total += v;
    if (c.router_aux_loss_coef > 0) {
      const double R = double(c.n_layer * batch.n());
      double aux = 0;
      for (int64_t e = 0; e < c.n_experts; e++) aux += aux_count[size_t(e)] * aux_prob[size_t(e)];
      total += aux_weight * c.router_aux_loss_coef * double(c.n_experts) * aux / (R * R);
    }
    return total;
  }
  double aux_weight = 1;  // the load-balancing loss's weight beside the coefficient (forward_backward's)
  mutable std::vector<double> aux_count, aux_prob;  // loss(): the routing's choice counts, probability sums

  // Cross-entropy of each labeled position, in batch order. Packed rows (batch.seg) attend within
  // their own document only.
  std::vector<double> token_losses(const Batch& batch) const {
    const int64_t T = batch.t, C = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
    const int64_t H = c.n_head, KV = c.n_head_kv, V = c.vocab_size;
    std::vector<double> out;
    for (int64_t b = 0; b < batch.b; b++) {
      std::vector<int32_t> pos(batch.positions.begin() + b * T, batch.positions.begin() + (b + 1) * T);
      Mat x(size_t(T * C));
      const Mat& emb = w("model.embed_tokens.weight");
      for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < C; k++)
          x[size_t(t * C + k)] = emb[size_t(batch.tokens[size_t(b * T + t)] * C + k)] *
                                 (c.scale_embeddings ? std::sqrt(double(C)) : 1.0);
      for (int l = 0; l < int(c.n_layer); l++) {
        const std::string L = "model.layers." + std::to_string(l) + ".";
        Mat h = rms_norm(x, T, w(L + "input_layernorm.weight"));
        Mat q, k, v;
        if (c.fused_qkv) {  // Phi-3: one qkv_proj (and one LoRA) whose rows are q, then k, then v
          const Mat qkv = proj(h, T, l, "self_attn", "qkv_proj", C, (H + 2 * KV) * hd);
          q = split_cols(qkv, T, (H + 2 * KV) * hd, 0, H * hd);
          k = split_cols(qkv, T, (H + 2 * KV) * hd, H * hd, KV * hd);
          v = split_cols(qkv, T, (H + 2 * KV) * hd, (H + KV) * hd, KV * hd);
        } else {
          q = proj(h, T, l, "self_attn", "q_proj", C, H * hd);
          k = proj(h, T, l, "self_attn", "k_proj", C, KV * hd);
          v = proj(h, T, l, "self_attn", "v_proj", C, KV * hd);
        }
        if (c.qk_norm) {  // Qwen3: RMSNorm over each head's hd values, before RoPE
          q = rms_norm(q, T * H, w(L + "self_attn.q_norm.weight"), hd);
          k = rms_norm(k, T * KV, w(L + "self_attn.k_norm.weight"), hd);
        }
        rope(q, T, H, pos, c.local_rope(l));
        rope(k, T, KV, pos, c.local_rope(l));
        Mat att(size_t(T * H * hd), 0.0);
        for (int64_t head = 0; head < H; head++) {
          const int64_t kvh = head / (H / KV);
          for (int64_t i = 0; i < T; i++) {
            std::vector<double> s(size_t(i + 1));
            // gpt-oss: the head's sink joins the softmax and attends to nothing
            const double sink = c.attention_sinks ? w(L + "self_attn.sinks")[size_t(head)] : -INFINITY;
            double mx = sink;
            const int64_t W = c.window_of(l);  // sliding window: keys j with i - j < W
            for (int64_t j = 0; j <= i; j++) {
              const bool other_doc = !batch.seg.empty() && batch.seg[size_t(b * T + i)] != batch.seg[size_t(b * T + j)];
              if ((W > 0 && i - j >= W) || other_doc) {
                s[size_t(j)] = -INFINITY;
                continue;
              }
              double d = 0;
              for (int64_t e = 0; e < hd; e++) d += q[size_t((i * H + head) * hd + e)] * k[size_t((j * KV + kvh) * hd + e)];
              s[size_t(j)] = d / std::sqrt(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(hd));
              if (const double cap = c.attn_logit_softcapping; cap > 0) s[size_t(j)] = cap * std::tanh(s[size_t(j)] / cap);
              mx = std::max(mx, s[size_t(j)]);
            }
            double z = std::exp(sink - mx);
            for (auto& e : s) z += (e = std::exp(e - mx));
            for (int64_t j = 0; j <= i; j++)
              for (int64_t e = 0; e < hd; e++)
                att[size_t((i * H + head) * hd + e)] += s[size_t(j)] / z * v[size_t((j * KV + kvh) * hd + e)];
          }
        }
        Mat o = proj(att, T, l, "self_attn", "o_proj", H * hd, C);
        if (c.sandwich_norms) o = rms_norm(o, T, w(L + "post_attention_layernorm.weight"));
        for (size_t i = 0; i < x.size(); i++) x[i] += o[i];
        h = rms_norm(x, T, w(L + (c.sandwich_norms ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight")));
        if (c.moe()) {  // the router's top-k of softmax(h Wr^T), each chosen expert's SwiGLU times its weight
          const int64_t E = c.n_experts, K = c.experts_per_tok, Fe = c.expert_intermediate_size;
          Mat logits = linear(h, w(hf_router_name(c, l)), T, C, E);
          if (c.moe_biases)  // gpt-oss's router bias
            for (int64_t t = 0; t < T; t++)
              for (int64_t e = 0; e < E; e++) logits[size_t(t * E + e)] += w(L + "mlp.router.bias")[size_t(e)];
          for (int64_t t = 0; t < T; t++) {
            std::vector<double> p(static_cast<size_t>(E));
            double mx = -INFINITY, z = 0;
            for (int64_t e = 0; e < E; e++) mx = std::max(mx, logits[size_t(t * E + e)]);
            for (int64_t e = 0; e < E; e++) z += (p[size_t(e)] = std::exp(logits[size_t(t * E + e)] - mx));
            for (double& pe : p) pe /= z;
            std::vector<int64_t> chosen;
            double zk = 0;
            for (int64_t j = 0; j < K; j++) {
              int64_t best = -1;
              for (int64_t e = 0; e < E; e++)
                if (std::find(chosen.begin(), chosen.end(), e) == chosen.end() && (best < 0 || p[size_t(e)] > p[size_t(best)]))
                  best = e;
              chosen.push_back(best);
              zk += p[size_t(best)];
            }
            if (aux_count.size() == size_t(E))
              for (int64_t e = 0; e < E; e++) {
                aux_prob[size_t(e)] += p[size_t(e)];
                aux_count[size_t(e)] += double(std::count(chosen.begin(), chosen.end(), e));
              }
            const Mat ht(h.begin() + t * C, h.begin() + (t + 1) * C);
            for (int64_t e : chosen) {
              const double wt = p[size_t(e)] / (c.norm_topk_prob ? zk : 1.0);
              Mat g = expert(ht, l, e, "gate_proj", C, Fe);
              const Mat u = expert(ht, l, e, "up_proj", C, Fe);
              for (size_t i = 0; i < g.size(); i++) g[i] = act(g[i], u[i]);
              const Mat d = expert(g, l, e, "down_proj", Fe, C);
              for (int64_t i = 0; i < C; i++) x[size_t(t * C + i)] += wt * d[size_t(i)];
            }
          }
          continue;
        }
        Mat g, u;
        if (c.fused_gate_up) {  // Phi-3: gate_up_proj, gate rows first
          const Mat gu = proj(h, T, l, "mlp", "gate_up_proj", C, 2 * F);
          g = split_cols(gu, T, 2 * F, 0, F);
          u = split_cols(gu, T, 2 * F, F, F);
        } else {
          g = proj(h, T, l, "mlp", "gate_proj", C, F);
          u = proj(h, T, l, "mlp", "up_proj", C, F);
        }
        for (size_t i = 0; i < g.size(); i++) {
          const double a = g[i];
          g[i] = (c.hidden_act == Activation::Silu
                      ? a / (1.0 + std::exp(-a))
                      : 0.5 * a * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (a + 0.044715 * a * a * a)))) *
                 u[i];
        }
        Mat d = proj(g, T, l, "mlp", "down_proj", F, C);
        if (c.sandwich_norms) d = rms_norm(d, T, w(L + "post_feedforward_layernorm.weight"));
        for (size_t i = 0; i < x.size(); i++) x[i] += d[i];
      }
      const Mat h = rms_norm(x, T, w("model.norm.weight"));
      Mat logits = linear(h, w(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"), T, C, V);
      if (const double cap = c.final_logit_softcapping; cap > 0)  // Gemma 2
        for (double& z : logits) z = cap * std::tanh(z / cap);
      for (int64_t t = 0; t < T; t++) {
        const int32_t y = batch.targets[size_t(b * T + t)];
        if (y == kIgnoreIndex) continue;
        double mx = -INFINITY, z = 0;
        for (int64_t e = 0; e < V; e++) mx = std::max(mx, logits[size_t(t * V + e)]);
        for (int64_t e = 0; e < V; e++) z += std::exp(logits[size_t(t * V + e)] - mx);
        out.push_back(std::log(z) + mx - logits[size_t(t * V + y)]);
      }
    }
    return out;
  }
};

std::vector<float> host(Backend& be, const Tensor& t) {
  std::vector<float> h(size_t(t.numel()));
  be.copy_to_host(h.data(), t.data, h.size() * 4);
  return h;
}

// Two rows of 9 random tokens, every 4th position without a label.
Batch random_batch(const LlamaConfig& cfg, Rng& rng) {
  std::vector<int32_t> ids(18), labels(18);
  for (size_t i = 0; i < ids.size(); i++) {
    ids[i] = int32_t(rng.below(uint64_t(cfg.vocab_size)));
    labels[i] = (i % 4 == 1) ? kIgnoreIndex : ids[i];
  }
  return Batch::from_hf(2, 9, ids, labels);
}

// The reference's RoPE frequencies for positions up to 8, as the engine computes them.
void set_rope(RefModel& ref, const LlamaConfig& cfg) {
  for (float f : rope_inv_freq(cfg, rope_uses_long_factors(cfg, 9 - 1))) ref.inv_freq.push_back(double(f));
  if (cfg.rope_local_theta > 0)
    for (float f : rope_local_inv_freq(cfg)) ref.inv_freq_local.push_back(double(f));
}

// Checks every `stride`-th element of every LoRA tensor; prints the worst relative error seen.
// aux_boost: the load-balancing loss's weight beside the summed token losses (with a coefficient).
void check_model(const std::string& variant, size_t stride, std::optional<LoraSpec> lora = std::nullopt,
                 double aux_boost = 40.0) {
  LoraSpec spec = lora ? *lora : fixture_lora(variant);
  TestModel t = make_model(variant, spec, 2, 9);
  // Non-zero B everywhere, so every LoRA parameter has a gradient.
  Rng rng(17);
  for (auto& p : t.model->trainable_params()) {
    std::vector<float> h(size_t(p.w.numel()));
    for (auto& x : h) x = rng.uniform(-0.2f, 0.2f);
    t.be->copy_to_device(p.w.data, h.data(), h.size() * 4);
  }
  const auto& cfg = t.model->config();
  const Batch batch = random_batch(cfg, rng);
  t.model->zero_grads();
  // The load-balancing loss weighs as much as a summed token loss here (~40x its place in a mean).
  const double aux_weight = cfg.router_aux_loss_coef > 0 ? aux_boost : 1.0;
  const double engine_loss = t.model->forward_backward(batch, 1.0f, 0, aux_weight);

  RefModel ref;
  ref.c = cfg;
  ref.aux_weight = aux_weight;
  ref.lora_scale = double(spec.scale());
  set_rope(ref, cfg);
  SafetensorsArchive ar(fixtures() + "/models/" + variant);
  for (const auto& name : ar.names())
    if (ar.get(name).dtype != DType::U8) ref.base[name] = to_double(floats(ar, name));
  if (cfg.model_type == "gpt_oss") {  // its fused, interleaved (MXFP4) experts, per expert by the stacks' names
    const TensorSource src = experts_source(cfg, t.src.tensors);
    const int64_t E = cfg.n_experts;
    for (int64_t l = 0; l < cfg.n_layer; l++)
      for (const auto& kind : expert_kinds()) {
        const auto [out, in] = expert_shape(cfg, kind);
        const std::string stack = "model.layers." + std::to_string(l) + ".mlp.experts." + kind;
        std::vector<float> wv(size_t(E * out * in)), bv(size_t(E * out));
        src.read_f32(stack, {E, out, in}, wv.data());
        src.read_f32(stack + ".bias", {E, out}, bv.data());
        ref.base[stack + ".bias"] = to_double(bv);
        for (int64_t e = 0; e < E; e++)
          ref.base[hf_expert_name(cfg, l, e, kind)] = Mat(wv.begin() + e * out * in, wv.begin() + (e + 1) * out * in);
      }
  }
  for (auto& p : t.model->trainable_params()) ref.lora[p.name] = to_double(host(*t.be, p.w));

  const double ref_loss = ref.loss(batch);
  const double aux_term = aux_weight * cfg.router_aux_loss_coef * t.model->last_aux_loss();
  EXPECT_NEAR(engine_loss + aux_term, ref_loss, 2e-6 * std::fabs(ref_loss)) << variant << ": summed loss";

  int64_t checked = 0, expected = 0;
  double worst_rel = 0;
  for (auto& p : t.model->trainable_params()) {
    const std::vector<float> g = host(*t.be, p.g);
    Mat& wv = ref.lora.at(p.name);
    std::vector<double> fd(wv.size(), 0.0);
    const double h = 1e-5;
    for (size_t i = 0; i < wv.size(); i += stride) {
      const double orig = wv[i];
      wv[i] = orig + h;
      const double up = ref.loss(batch);
      wv[i] = orig - h;
      const double down = ref.loss(batch);
      wv[i] = orig;
      fd[i] = (up - down) / (2 * h);
    }
    double scale = 0, err = 0;
    size_t worst = 0;
    for (size_t i = 0; i < fd.size(); i += stride) {
      scale = std::max(scale, std::fabs(fd[i]));
      if (std::fabs(double(g[i]) - fd[i]) > err) err = std::fabs(double(g[i]) - fd[i]), worst = i;
    }
    ASSERT_GT(scale, 0) << p.name << ": no gradient to check";
    EXPECT_LT(err / scale, 2e-5) << variant << " " << p.name << "[" << worst << "]: engine " << g[worst]
                                 << ", finite difference " << fd[worst] << ", tensor max " << scale;
    worst_rel = std::max(worst_rel, err / scale);
    checked += int64_t((fd.size() + stride - 1) / stride);
    expected += (p.w.numel() + int64_t(stride) - 1) / int64_t(stride);
  }
  EXPECT_EQ(checked, expected);
  EXPECT_GT(checked, cfg.moe() ? 1000 : 2000);  // a MoE model's adapters: the attention's four
  std::printf("%s: %lld LoRA parameters checked, worst error %.2e of its tensor's largest gradient\n",
              variant.c_str(), (long long)checked, worst_rel);
}

// Full fine-tuning: the gradient of every weight (embeddings, norms, q/k norms, projections and
// their biases, the LM head or the tied embedding) against finite differences of the double model;
// about 60 elements of each tensor, at an odd stride.
void check_full(const std::string& variant, const std::string& ckpt = "none", int64_t mlp_tile = 0) {
  ModelPlanOptions po;
  po.micro_batch = 2;
  po.seq_len = 9;
  po.method = Method::Full;
  po.checkpointing = parse_checkpointing(ckpt, "checkpointing");
  po.mlp_tile = mlp_tile;
  TestModel t = make_model_on(make_cpu_backend(), variant, po, LoraSpec{});
  ASSERT_TRUE(t.model->full());
  const auto& cfg = t.model->config();
  Rng rng(17);
  const Batch batch = random_batch(cfg, rng);
  t.model->zero_grads();
  const double engine_loss = t.model->forward_backward(batch, 1.0f, 0);

  RefModel ref;
  ref.c = cfg;
  set_rope(ref, cfg);
  SafetensorsArchive ar(fixtures() + "/models/" + variant);
  for (const auto& name : ar.names()) ref.base[name] = to_double(floats(ar, name));
  const double ref_loss = ref.loss(batch);
  EXPECT_NEAR(engine_loss, ref_loss, 2e-6 * std::fabs(ref_loss)) << variant << ": summed loss";

  int64_t tensors = 0;
  double worst_rel = 0;
  for (auto& p : t.model->trainable_params()) {
    const std::vector<float> g = host(*t.be, p.g);
    ASSERT_TRUE(ref.base.count(p.peft_key)) << p.peft_key << " is not a tensor of the checkpoint";
    Mat& wv = ref.base.at(p.peft_key);
    ASSERT_EQ(wv.size(), g.size()) << p.peft_key;
    const size_t stride = std::max<size_t>(1, wv.size() / 60) | 1;
    double scale = 0, err = 0;
    size_t worst = 0;
    for (size_t i = 0; i < wv.size(); i += stride) {
      const double orig = wv[i], h = 1e-5;
      wv[i] = orig + h;
      const double up = ref.loss(batch);
      wv[i] = orig - h;
      const double down = ref.loss(batch);
      wv[i] = orig;
      const double fd = (up - down) / (2 * h);
      scale = std::max(scale, std::fabs(fd));
      if (std::fabs(double(g[i]) - fd) > err) err = std::fabs(double(g[i]) - fd), worst = i;
    }
    ASSERT_GT(scale, 0) << p.peft_key << ": no gradient among the checked elements";
    EXPECT_LT(err / scale, 2e-5) << variant << " " << p.peft_key << "[" << worst << "]: engine " << g[worst]
                                 << ", tensor max " << scale;
    worst_rel = std::max(worst_rel, err / scale);
    tensors++;
  }
  // Every tensor of the checkpoint is trained once (a tied LM head is the embedding).
  EXPECT_EQ(size_t(tensors), ref.base.size());
  std::printf("%s (full): %lld weight tensors checked, worst error %.2e of its tensor's largest gradient\n",
              variant.c_str(), (long long)tensors, worst_rel);
}

// A preference objective's LoRA gradients through the whole model: rows of two documents (prompt +
// completion each, positions restarting, attention kept inside each), the reference run with the
// adapters off, the objective over the completions' summed log-probs (train/preference.h, whose own
// derivatives tests/train/test_preference_objective.cpp checks), against finite differences of the
// double model. Checks the weighted backward, the reference forward and the batch layout.
void check_preference(Objective method, size_t stride) {
  LoraSpec spec = fixture_lora();
  TestModel t = make_model("llama_gqa", spec, 2, 14);
  Rng rng(23);
  for (auto& p : t.model->trainable_params()) {
    std::vector<float> h(size_t(p.w.numel()));
    for (auto& x : h) x = rng.uniform(-0.2f, 0.2f);
    t.be->copy_to_device(p.w.data, h.data(), h.size() * 4);
  }
  const int64_t V = t.model->config().vocab_size;
  // Row i: a prompt of 3 + i tokens, then two completions of 4 - i and 3 tokens.
  const std::vector<Example> rows = preference_rows(method, rng, V, {{3, 4, 3}, {4, 3, 3}});
  const Batch batch = pad_batch({&rows[0], &rows[1]}, 0);
  PreferenceSpec ps;
  ps.method = method;
  ps.beta = method == Objective::Kto ? 0.5 : 0.3;  // large enough that the terms are far from flat
  t.model->zero_grads();
  const double engine_loss = preference_micro_step(*t.model, ps, 1, nullptr)(batch, 0, 0);

  RefModel ref;
  ref.c = t.model->config();
  ref.lora_scale = double(spec.scale());
  for (float f : rope_inv_freq(ref.c)) ref.inv_freq.push_back(double(f));
  SafetensorsArchive ar(fixtures() + "/models/llama_gqa");
  for (const auto& name : ar.names()) ref.base[name] = to_double(floats(ar, name));
  const std::vector<PrefSeq> seqs = preference_sequences(batch, ps);
  std::vector<double> ref_logp;
  if (ps.uses_reference()) {
    RefModel base = ref;  // adapters off
    const std::vector<double> tl = base.token_losses(batch);
    for (const PrefSeq& q : seqs) {
      double s = 0;
      for (int64_t i = q.begin; i < q.end; i++) s -= tl[size_t(i)];
      ref_logp.push_back(s);
    }
  }
  for (auto& p : t.model->trainable_params()) ref.lora[p.name] = to_double(host(*t.be, p.w));
  auto logps = [&]() {
    const std::vector<double> tl = ref.token_losses(batch);
    std::vector<double> lp;
    for (const PrefSeq& q : seqs) {
      double s = 0;
      for (int64_t i = q.begin; i < q.end; i++) s -= tl[size_t(i)];
      lp.push_back(s);
    }
    return lp;
  };
  const std::vector<double> lp0 = logps();
  auto objective = [&]() {
    std::vector<double> lp = logps();
    // KTO's KL estimate is a constant of the step (detached, as TRL computes it under no_grad).
    for (size_t i = 0; i < seqs.size(); i++)
      if (seqs[i].role == DocRole::KlProbe) lp[i] = lp0[i];
    return preference_objective(ps, seqs, lp, ref_logp).loss;
  };
  EXPECT_NEAR(engine_loss, objective(), 2e-6 * std::fabs(objective())) << objective_name(method);
  double worst_rel = 0;
  int64_t checked = 0;
  for (auto& p : t.model->trainable_params()) {
    const std::vector<float> g = host(*t.be, p.g);
    Mat& wv = ref.lora.at(p.name);
    double scale = 0, err = 0;
    for (size_t i = 0; i < wv.size(); i += stride) {
      const double orig = wv[i], h = 1e-5;
      wv[i] = orig + h;
      const double up = objective();
      wv[i] = orig - h;
      const double down = objective();
      wv[i] = orig;
      const double fd = (up - down) / (2 * h);
      scale = std::max(scale, std::fabs(fd));
      err = std::max(err, std::fabs(double(g[i]) - fd));
      checked++;
    }
    ASSERT_GT(scale, 0) << p.name << ": no gradient to check";
    EXPECT_LT(err / scale, 2e-5) << objective_name(method) << " " << p.name;
    worst_rel = std::max(worst_rel, err / scale);
  }
  EXPECT_GT(checked, 500);
  std::printf("%s: %lld LoRA parameters checked, worst error %.2e of its tensor's largest gradient\n",
              objective_name(method), (long long)checked, worst_rel);
}

}  // namespace

TEST(PreferenceGradientsDouble, Dpo) { check_preference(Objective::Dpo, 7); }
TEST(PreferenceGradientsDouble, Orpo) { check_preference(Objective::Orpo, 7); }
TEST(PreferenceGradientsDouble, Kto) { check_preference(Objective::Kto, 7); }

// Llama 3 layout: GQA, llama3 rope scaling, untied head.
TEST(LoraGradientsDouble, LlamaGqaEveryParameter) { check_model("llama_gqa", 1); }
// Qwen2 layout: q/k/v biases; every third parameter.
TEST(LoraGradientsDouble, Qwen2) { check_model("qwen2", 3); }
// Qwen3 layout: per-head q/k RMSNorm before RoPE, head_dim 24 != hidden / heads, tied head; every third.
TEST(LoraGradientsDouble, Qwen3) { check_model("qwen3", 3); }
// Mistral v0.1 layout: a sliding window of 5 keys on 9-token rows, every layer; every third.
TEST(LoraGradientsDouble, MistralSlidingWindow) { check_model("mistral_sw", 3); }
// Gemma 3 layout: (1 + w) norms before and after attention and MLP, q/k norms, embeddings times
// sqrt(hidden), GeGLU, query_pre_attn_scalar 20, two sliding layers (window 5 on 9-token rows, their
// own RoPE base) around a global one with linear RoPE scaling; every third parameter.
TEST(LoraGradientsDouble, Gemma3) { check_model("gemma3", 3); }
// Phi-3 layout: fused qkv_proj and gate_up_proj, each one adapter (A shared by the fused outputs),
// a sliding window of 5 on every layer; every third parameter.
TEST(LoraGradientsDouble, Phi3FusedModules) { check_model("phi3", 3); }
// Phi-3.5/Phi-4-mini RoPE: LongRoPE's long factors (9 positions past the original 8) on the first
// 8 of 16 dims of each head, cos and sin times the attention factor; every third parameter.
TEST(LoraGradientsDouble, Phi3LongRopePartialRotary) { check_model("phi3_longrope", 3); }
// Qwen3 with YaRN (factor 4): blended frequencies, cos and sin times 0.1 ln 4 + 1; every third.
TEST(LoraGradientsDouble, Qwen3Yarn) { check_model("qwen3_yarn", 3); }
// Gemma 2 layout: Gemma 3's without q/k norms, soft-capping of the scores (cap 3) and of the
// logits (cap 2), every other layer sliding; every third parameter.
TEST(LoraGradientsDouble, Gemma2SoftCapping) { check_model("gemma2", 3); }
// Mixtral layout: 16 experts, top-2 renormalised; the attention's adapters see the experts and the
// router's path (the routing weights depend on the layer input); every third parameter.
TEST(LoraGradientsDouble, MixtralExperts) { check_model("mixtral", 3); }
// Mixtral with output_router_logits: the load-balancing loss (coefficient 0.1) reaches the
// attention's adapters through every layer's router probabilities; every third parameter.
TEST(LoraGradientsDouble, MixtralLoadBalancingLoss) { check_model("mixtral_aux", 3); }
// Qwen3-MoE layout: Qwen3's attention, 32 experts, top-4 without renormalisation; every third.
TEST(LoraGradientsDouble, Qwen3MoeExperts) { check_model("qwen3_moe", 3); }
// LoRA on the experts themselves (PEFT's target_parameters on gate_up_proj and down_proj): one pair
// per expert, through gate's and up's rows of one B and the routed rows of each expert; Qwen3-MoE
// renormalised, and Mixtral with its attention's adapters too.
TEST(LoraGradientsDouble, Qwen3MoeExpertLora) { check_model("qwen3_moe_experts", 3); }
// gpt-oss layout: attention sinks, biases on q/k/v/o, the router and every expert, the clamped
// SwiGLU (a limit the fixture's values cross), alternating sliding windows, YaRN, MXFP4 experts
// (dequantized, as held), the load-balancing loss; LoRA on q, v, o and both expert stacks; every
// seventh parameter.
// The load-balancing loss at its own weight here: boosted 40x (as Mixtral's test checks it), the
// f32 rounding of the router's path through the clamped experts reaches 1.9e-5 of the largest
// gradient (3.2e-6 without the aux loss, 5.4e-6 without the clamp), too near the bound to tell a
// fault from rounding.
TEST(LoraGradientsDouble, GptOss) { check_model("gpt_oss", 7, std::nullopt, 1.0); }
TEST(LoraGradientsDouble, MixtralExpertLora) {
  LoraSpec s = fixture_lora("mixtral");
  s.expert_targets = {"gate_up_proj", "down_proj"};
  check_model("mixtral", 5, s);
}

TEST(FullGradientsDouble, LlamaGqa) { check_full("llama_gqa"); }
// q/k/v biases (their gradient: the column sums of d(output)).
TEST(FullGradientsDouble, Qwen2Biases) { check_full("qwen2"); }
// Per-head q/k norms, and the recompute of a checkpointed layer.
TEST(FullGradientsDouble, Qwen3QkNormCheckpointed) { check_full("qwen3", "full"); }
// (1 + w) norms around both blocks, scaled and tied embeddings, GeGLU; the MLP in tiles of 5 rows.
TEST(FullGradientsDouble, Gemma3TiedTiled) { check_full("gemma3", "full", 5); }
// Attention and final-logit soft-capping.
TEST(FullGradientsDouble, Gemma2SoftCapping) { check_full("gemma2"); }
