#include "model/merge.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "model/experts.h"
#include "model/gguf_model.h"
#include "model/peft_io.h"
#include "quant/format.h"

namespace qlora {

namespace {

// (out, in) of projection `proj`.
std::pair<int64_t, int64_t> proj_shape(const LlamaConfig& c, const std::string& proj) {
  if (proj == "q_proj") return {c.q_dim(), c.hidden_size};
  if (proj == "k_proj" || proj == "v_proj") return {c.kv_dim(), c.hidden_size};
  if (proj == "o_proj") return {c.hidden_size, c.q_dim()};
  if (proj == "gate_proj" || proj == "up_proj") return {c.intermediate_size, c.hidden_size};
  if (proj == "down_proj") return {c.hidden_size, c.intermediate_size};
  if (proj == "qkv_proj" && c.fused_qkv) return {c.q_dim() + 2 * c.kv_dim(), c.hidden_size};
  if (proj == "gate_up_proj" && c.fused_gate_up) return {2 * c.intermediate_size, c.hidden_size};
  fail(ErrorKind::Internal, proj, "not a projection of this model");
}

}  // namespace

std::string lora_module_of(const std::string& hf_name) {
  static const std::string prefix = "model.layers.";
  if (hf_name.rfind(prefix, 0) != 0 || !hf_name.ends_with("_proj.weight")) return "";
  const size_t dot = hf_name.find('.', prefix.size());
  const std::string layer = hf_name.substr(prefix.size(), dot - prefix.size());
  const std::string rest = hf_name.substr(dot + 1);  // "self_attn.q_proj.weight"
  const size_t p = rest.find('.');
  return "layers." + layer + "." + rest.substr(p + 1, rest.size() - p - 1 - std::string(".weight").size());
}

std::vector<int64_t> llama_hf_tensor_shape(const LlamaConfig& c, const std::string& name) {
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return {c.vocab_size, c.hidden_size};
  if (const auto g = gpt_oss_tensor_shape(c, name)) return *g;
  if (const auto moe = hf_moe_tensor_shape(c, name)) return {moe->first, moe->second};  // a router or an expert
  if (name == "model.norm.weight" || name.ends_with("layernorm.weight")) return {c.hidden_size};
  if (name.ends_with("self_attn.q_norm.weight") || name.ends_with("self_attn.k_norm.weight")) return {c.head_dim};
  if (name.ends_with(".bias")) {
    const bool q = name.ends_with("q_proj.bias");
    return {q ? c.q_dim() : c.kv_dim()};
  }
  const std::string m = lora_module_of(name);
  if (m.empty()) fail(ErrorKind::Internal, name, "not a Llama tensor name");
  const auto [out, in] = proj_shape(c, m.substr(m.rfind('.') + 1));
  return {out, in};
}

PeftAdapter open_peft_adapter(const std::string& dir, const LlamaConfig& cfg) {
  PeftAdapter a;
  a.dir = dir;
  a.spec = read_peft_adapter_config(dir + "/adapter_config.json");
  a.spec.targets = lora_targets_for(cfg, a.spec.targets);  // fused models: qkv_proj, gate_up_proj
  check_expert_targets(cfg, a.spec.expert_targets);
  auto ar = std::make_shared<SafetensorsArchive>(dir + "/adapter_model.safetensors");
  std::set<std::string> expected;
  // (module key, A's shape, B's shape) of every adapted module: projections, then expert stacks
  // (PEFT's ParamWrapper: A (r*E, in), B (out, r*E)).
  std::vector<std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>>> modules;
  for (int64_t l = 0; l < cfg.n_layer; l++) {
    for (const auto& proj : a.spec.targets) {
      const auto [out, in] = proj_shape(cfg, proj);
      modules.emplace_back(peft_module_name(cfg, l, proj), std::vector<int64_t>{a.spec.r, in}, std::vector<int64_t>{out, a.spec.r});
    }
    for (const auto& kind : a.spec.expert_targets) {
      const auto [out, in] = expert_lora_shape(cfg, kind);
      const int64_t re = a.spec.r * cfg.n_experts;
      modules.emplace_back(peft_expert_module_name(cfg, l, kind, a.spec), std::vector<int64_t>{re, in},
                           std::vector<int64_t>{out, re});
    }
  }
  for (const auto& [key, shape_a, shape_b] : modules) {
      for (const auto& [suffix, shape] : {std::pair{".lora_A.weight", shape_a}, std::pair{".lora_B.weight", shape_b}}) {
        const TensorInfo& t = ar->get(key + suffix);  // missing: names the closest existing tensor
        if (t.shape != shape)
          fail(ErrorKind::Shape, ar->path() + ": tensor '" + key + suffix + "'",
               "has shape " + shape_str(t.shape) + ", expected " + shape_str(shape),
               "the adapter was trained on a different base model (r=" + std::to_string(a.spec.r) + ")");
        expected.insert(key + suffix);
      }
  }
  for (const auto& name : ar->names())
    if (!expected.count(name))
      fail(ErrorKind::Unsupported, ar->path() + ": tensor '" + name + "'",
           "is not a LoRA A/B weight of the adapter's target_modules or target_parameters",
           "only LoRA on the linear projections can be merged (no modules_to_save or embedding LoRA)");
  a.weights = std::move(ar);
  return a;
}

MergedModel::MergedModel(LlamaConfig cfg, TensorSource base, std::optional<PeftAdapter> adapter)
    : cfg_(std::move(cfg)), base_(std::move(base)), adapter_(std::move(adapter)), names_(llama_hf_tensor_names(cfg_)) {
  if (base_.stored_quant) {
    base_precision_ = quant_format_name(base_.stored_quant->format);
    if (base_.stored_quant->double_quant) base_precision_ += " (double quant)";
  } else {
    base_precision_ = cfg_.torch_dtype.empty() ? "float32" : cfg_.torch_dtype;
  }
}

// Expert weight kind (expert_kinds) -> the stacked weight its adapter is on.
static std::string expert_lora_kind(const std::string& kind) { return kind == "down_proj" ? "down_proj" : "gate_up_proj"; }

std::optional<QuantizedTensor> MergedModel::stored_quantized(const std::string& hf_name, int64_t rows, int64_t cols) const {
  QuantizedTensor q;
  if (merged(hf_name) || !base_.read_quantized || !base_.read_quantized(hf_name, rows, cols, q)) return std::nullopt;
  return q;
}

bool MergedModel::merged(const std::string& hf_name) const {
  if (!adapter_) return false;
  if (const std::string k = gpt_oss_stack(cfg_, hf_name); !k.empty()) {
    const auto& t = adapter_->spec.expert_targets;
    return std::find(t.begin(), t.end(), k) != t.end();
  }
  if (const auto ex = hf_expert_of(cfg_, hf_name)) {
    const auto& t = adapter_->spec.expert_targets;
    return std::find(t.begin(), t.end(), expert_lora_kind(ex->kind)) != t.end();
  }
  const std::string m = lora_module_of(hf_name);
  if (m.empty()) return false;
  const std::string proj = m.substr(m.rfind('.') + 1);
  const auto& t = adapter_->spec.targets;
  return std::find(t.begin(), t.end(), proj) != t.end();
}

namespace {

// dst (out, in) += scale * b a, b (out, r), a (r, in); the product summed in double over the rank.
void add_scaled_product(float* dst, const float* a, const float* b, int64_t out, int64_t in, int64_t r, double scale) {
  std::vector<double> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; o++) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t k = 0; k < r; k++) {
      const double bk = double(b[size_t(o * r + k)]);
      if (bk == 0.0) continue;
      const float* ak = a + k * in;
      for (int64_t i = 0; i < in; i++) row[size_t(i)] += bk * double(ak[i]);
    }
    float* w = dst + o * in;
    for (int64_t i = 0; i < in; i++) w[i] = float(double(w[i]) + scale * row[size_t(i)]);
  }
}

}  // namespace

void MergedModel::read(const std::string& hf_name, float* dst) const {
  const std::vector<int64_t> shape = this->shape(hf_name);
  base_.read_f32(hf_name, shape, dst);
  if (!merged(hf_name)) return;
  const int64_t r = adapter_->spec.r;
  const double scale = double(adapter_->spec.scale());
  if (const std::string kind = gpt_oss_stack(cfg_, hf_name); !kind.empty()) {
    // The stack (E, in, out) in GptOssExperts' own layout (gate_up's outputs interleaved, as PEFT's
    // B rows are): expert e's delta^T, W[e][i][o] += s sum_j B[o][j*E + e] A[e*r + j][i].
    const int64_t E = shape[0], in = shape[1], out = shape[2];
    const int64_t layer = std::stoll(hf_name.substr(std::string("model.layers.").size()));
    const std::string key = peft_expert_module_name(cfg_, layer, kind, adapter_->spec);
    const std::vector<float> a = adapter_->weights->read_f32(key + ".lora_A.weight", {r * E, in});
    const std::vector<float> bt = adapter_->weights->read_f32(key + ".lora_B.weight", {out, r * E});
    std::vector<float> delta(size_t(out * in)), b(size_t(out * r));
    for (int64_t e = 0; e < E; e++) {
      for (int64_t o = 0; o < out; o++)
        for (int64_t j = 0; j < r; j++) b[size_t(o * r + j)] = bt[size_t(o * r * E + j * E + e)];
      std::fill(delta.begin(), delta.end(), 0.0f);
      add_scaled_product(delta.data(), a.data() + e * r * in, b.data(), out, in, r, scale);  // (out, in)
      float* w = dst + e * in * out;
      for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) w[i * out + o] += delta[size_t(o * in + i)];
    }
    return;
  }
  const int64_t out = shape[0], in = shape[1];
  if (const auto ex = hf_expert_of(cfg_, hf_name)) {
    // Expert e's pair of the stack's adapter: A's rows e*r.., B's columns j*E + e (PEFT's layout);
    // gate_proj and up_proj take gate_up_proj's first and second F rows of B. The stack's A and B are
    // read once per layer and kind (the names come expert by expert).
    const std::string kind = expert_lora_kind(ex->kind);
    const std::string key = peft_expert_module_name(cfg_, ex->layer, kind, adapter_->spec);
    const auto [full_out, full_in] = expert_lora_shape(cfg_, kind);
    const int64_t E = cfg_.n_experts;
    if (expert_cache_.key != key) {
      expert_cache_.a = adapter_->weights->read_f32(key + ".lora_A.weight", {r * E, full_in});
      expert_cache_.b = adapter_->weights->read_f32(key + ".lora_B.weight", {full_out, r * E});
      expert_cache_.key = key;
    }
    const int64_t row0 = ex->kind == "up_proj" ? cfg_.expert_intermediate_size : 0;
    std::vector<float> b(size_t(out * r));
    for (int64_t o = 0; o < out; o++)
      for (int64_t j = 0; j < r; j++) b[size_t(o * r + j)] = expert_cache_.b[size_t((row0 + o) * r * E + j * E + ex->expert)];
    add_scaled_product(dst, expert_cache_.a.data() + ex->expert * r * in, b.data(), out, in, r, scale);
    return;
  }
  const std::string m = lora_module_of(hf_name);  // "layers.L.proj"
  const int64_t layer = std::stoll(m.substr(7, m.find('.', 7) - 7));
  const std::string key = peft_module_name(cfg_, layer, m.substr(m.rfind('.') + 1));
  const std::vector<float> a = adapter_->weights->read_f32(key + ".lora_A.weight", {r, in});
  const std::vector<float> b = adapter_->weights->read_f32(key + ".lora_B.weight", {out, r});
  add_scaled_product(dst, a.data(), b.data(), out, in, r, scale);
}

std::vector<float> MergedModel::read(const std::string& hf_name) const {
  const auto s = shape(hf_name);
  int64_t n = 1;
  for (auto d : s) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  read(hf_name, v.data());
  return v;
}

}  // namespace qlora
