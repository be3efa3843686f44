// Mixture-of-experts names, shapes and the per-expert checkpoint tensors read as stacks.
#include "model/experts.h"

#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "core/memory_plan.h"
#include "model/mxfp4_experts.h"
#include "model/quant_bytes.h"

namespace qlora {

const std::vector<std::string>& expert_kinds() {
  static const std::vector<std::string> k = {"gate_proj", "up_proj", "down_proj"};
  return k;
}

std::pair<int64_t, int64_t> expert_shape(const LlamaConfig& c, const std::string& kind) {
  if (kind == "gate_proj" || kind == "up_proj") return {c.expert_intermediate_size, c.hidden_size};
  if (kind == "down_proj") return {c.hidden_size, c.expert_intermediate_size};
  fail(ErrorKind::Internal, "experts", "unknown expert weight '" + kind + "'");
}

int64_t expert_stride_bytes(const LlamaConfig& c, const std::string& kind, const QuantParams& q) {
  const auto [out, in] = expert_shape(c, kind);
  return MemoryPlan::aligned(quant_storage_bytes(q, out, in));
}

// The family's module of a layer's MLP block and its name for an expert weight kind.
static std::string moe_block(const LlamaConfig& c, int64_t l) {
  return "model.layers." + std::to_string(l) + (c.model_type == "mixtral" ? ".block_sparse_moe." : ".mlp.");
}
static std::string hf_kind(const LlamaConfig& c, const std::string& kind) {
  if (c.model_type != "mixtral") return kind;
  return kind == "gate_proj" ? "w1" : kind == "up_proj" ? "w3" : "w2";
}

std::string hf_expert_name(const LlamaConfig& c, int64_t l, int64_t e, const std::string& kind) {
  return moe_block(c, l) + "experts." + std::to_string(e) + "." + hf_kind(c, kind) + ".weight";
}

std::string hf_router_name(const LlamaConfig& c, int64_t l) {
  return moe_block(c, l) + (c.model_type == "gpt_oss" ? "router.weight" : "gate.weight");
}

std::optional<ExpertTensor> hf_expert_of(const LlamaConfig& c, const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (!c.moe() || name.rfind(prefix, 0) != 0) return std::nullopt;
  ExpertTensor t;
  t.layer = std::atoll(name.c_str() + prefix.size());
  const std::string block = moe_block(c, t.layer) + "experts.";
  if (name.rfind(block, 0) != 0) return std::nullopt;
  const size_t dot = name.find('.', block.size());
  if (dot == std::string::npos || dot == block.size()) return std::nullopt;
  t.expert = std::atoll(name.c_str() + block.size());
  for (const auto& k : expert_kinds())
    if (name.compare(dot + 1, std::string::npos, hf_kind(c, k) + ".weight") == 0) {
      t.kind = k;
      return t;
    }
  return std::nullopt;
}

std::optional<std::pair<int64_t, int64_t>> hf_moe_tensor_shape(const LlamaConfig& c, const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (!c.moe() || name.rfind(prefix, 0) != 0) return std::nullopt;
  const int64_t l = std::atoll(name.c_str() + prefix.size());
  const std::string block = moe_block(c, l);
  if (name.rfind(block, 0) != 0) return std::nullopt;
  const std::string rest = name.substr(block.size());  // "gate.weight" or "experts.<e>.<kind>.weight"
  if (rest == "gate.weight") return std::pair{c.n_experts, c.hidden_size};
  if (rest.rfind("experts.", 0) != 0) return std::nullopt;
  const size_t dot = rest.find('.', 8);
  if (dot == std::string::npos) return std::nullopt;
  for (const auto& k : expert_kinds())
    if (rest.substr(dot + 1) == hf_kind(c, k) + ".weight") return expert_shape(c, k);
  return std::nullopt;
}

// gpt-oss's tensors besides the Llama ones: its sinks, o_proj's and the router's biases and its fused
// expert stacks, stored (experts, in, out) as GptOssExperts holds them; nullopt for any other name.
std::optional<std::vector<int64_t>> gpt_oss_tensor_shape(const LlamaConfig& c, const std::string& name) {
  const int64_t E = c.n_experts, F = c.expert_intermediate_size, C = c.hidden_size;
  if (c.model_type != "gpt_oss") return std::nullopt;
  if (name.ends_with("self_attn.sinks")) return std::vector<int64_t>{c.n_head};
  if (name.ends_with("self_attn.o_proj.bias")) return std::vector<int64_t>{C};
  if (name.ends_with("mlp.router.weight")) return std::vector<int64_t>{E, C};
  if (name.ends_with("mlp.router.bias")) return std::vector<int64_t>{E};
  if (name.ends_with("mlp.experts.gate_up_proj")) return std::vector<int64_t>{E, C, 2 * F};
  if (name.ends_with("mlp.experts.gate_up_proj_bias")) return std::vector<int64_t>{E, 2 * F};
  if (name.ends_with("mlp.experts.down_proj")) return std::vector<int64_t>{E, F, C};
  if (name.ends_with("mlp.experts.down_proj_bias")) return std::vector<int64_t>{E, C};
  return std::nullopt;
}

// gpt-oss's fused expert stack `name` names, "gate_up_proj" or "down_proj"; "" for any other tensor.
std::string gpt_oss_stack(const LlamaConfig& c, const std::string& name) {
  if (c.model_type != "gpt_oss") return "";
  for (const char* k : {"gate_up_proj", "down_proj"})
    if (name.ends_with(std::string("mlp.experts.") + k)) return k;
  return "";
}

namespace {

struct Stack {
  int64_t layer = 0;
  std::string kind;  // empty: the router
  bool bias = false;  // the stack's output biases (E, out) (gpt-oss)
};

// "model.layers.<l>.mlp.experts.<kind>[.bias]" or "model.layers.<l>.mlp.router.weight".
std::optional<Stack> stack_of(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return std::nullopt;
  const std::string rest = name.substr(dot + 1);
  Stack s;
  s.layer = std::stoll(name.substr(prefix.size(), dot - prefix.size()));
  if (rest == "mlp.router.weight") return s;
  for (const auto& k : expert_kinds())
    for (bool bias : {false, true})
      if (rest == "mlp.experts." + k + (bias ? ".bias" : "")) {
        s.kind = k;
        s.bias = bias;
        return s;
      }
  return std::nullopt;
}

// gpt-oss's experts as transformers holds them: gate_up_proj (E, C, 2F) with gate's and up's
// columns interleaved (gate 2i, up 2i + 1) and down_proj (E, F, C), both stored (experts, in,
// out); gate_up_proj_bias (E, 2F) interleaved alike, down_proj_bias (E, C). The stacks and biases
// of the engine's names are read from them (the MXFP4 blocks as stored, rows picked).
TensorSource gpt_oss_experts_source(const LlamaConfig& c, const TensorSource& src) {
  auto fused = [](const Stack& s) {
    return "model.layers." + std::to_string(s.layer) + ".mlp.experts." +
           (s.kind == "down_proj" ? "down_proj" : "gate_up_proj") + (s.bias ? "_bias" : "");
  };
  // Within gate_up's 2F outputs, the kind's: every other one from 0 (gate) or 1 (up); down: all.
  auto pick = [](const Stack& s) -> std::pair<int64_t, int64_t> {
    return s.kind == "down_proj" ? std::pair<int64_t, int64_t>{0, 1} : std::pair<int64_t, int64_t>{s.kind == "up_proj", 2};
  };
  TensorSource out = src;
  out.has = [src, fused](const std::string& n) {
    const auto s = stack_of(n);
    return s && !s->kind.empty() ? src.has(fused(*s)) : src.has(n);
  };
  out.read_f32 = [c, src, fused, pick](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    const auto s = stack_of(n);
    if (!s || s->kind.empty()) return src.read_f32(n, shape, dst);  // the router, attention, norms
    const auto [rows, cols] = expert_shape(c, s->kind);  // the engine's (out, in)
    const int64_t E = c.n_experts, F = c.expert_intermediate_size, C = c.hidden_size;
    const int64_t all_out = s->kind == "down_proj" ? C : 2 * F;  // the fused tensor's outputs
    const auto [first, step] = pick(*s);
    if (shape != (s->bias ? std::vector<int64_t>{E, rows} : std::vector<int64_t>{E, rows, cols}))
      fail(ErrorKind::Internal, "experts", "stack '" + n + "' read with another shape");
    std::vector<float> buf(size_t(E * all_out * (s->bias ? 1 : cols)));
    src.read_f32(fused(*s), *gpt_oss_tensor_shape(c, fused(*s)), buf.data());
    for (int64_t e = 0; e < E; e++)
      for (int64_t o = 0; o < rows; o++) {
        const int64_t fo = first + o * step;
        if (s->bias) {
          dst[e * rows + o] = buf[size_t(e * all_out + fo)];
          continue;
        }
        for (int64_t i = 0; i < cols; i++) dst[(e * rows + o) * cols + i] = buf[size_t((e * cols + i) * all_out + fo)];
      }
  };
  out.read_quantized = [c, src, fused, pick](const std::string& n, int64_t rows, int64_t cols, QuantizedTensor& q) {
    const auto s = stack_of(n);
    if (!s || s->kind.empty() || s->bias) return src.read_quantized ? src.read_quantized(n, rows, cols, q) : false;
    if (!src.read_quantized) return false;
    const int64_t all_out = s->kind == "down_proj" ? c.hidden_size : 2 * c.expert_intermediate_size;
    QuantizedTensor all;
    if (!src.read_quantized(fused(*s), c.n_experts * all_out, cols, all)) return false;
    if (all.params.format != QuantFormat::MXFP4)
      fail(ErrorKind::Unsupported, src.description + ": tensor '" + fused(*s) + "'",
           "gpt-oss experts are read as stored in MXFP4 only");
    // Expert e's gate row i is the stack's row e 2F + 2i = 2 (e F + i), its up row that + 1: over
    // all experts, every other row from 0 or 1 (down: every row).
    const auto [first, step] = pick(*s);
    q = mxfp4_rows(all, first, rows, step);
    return true;
  };
  return out;
}

}  // namespace

TensorSource experts_source(const LlamaConfig& c, const TensorSource& src) {
  if (!c.moe()) return src;
  if (c.model_type == "gpt_oss") return gpt_oss_experts_source(c, src);
  TensorSource out = src;
  out.has = [c, src](const std::string& n) {
    const auto s = stack_of(n);
    if (!s) return src.has(n);
    return s->kind.empty() ? src.has(hf_router_name(c, s->layer)) : src.has(hf_expert_name(c, s->layer, 0, s->kind));
  };
  out.read_f32 = [c, src](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    const auto s = stack_of(n);
    if (!s) return src.read_f32(n, shape, dst);
    if (s->kind.empty()) return src.read_f32(hf_router_name(c, s->layer), shape, dst);
    const auto [rows, cols] = expert_shape(c, s->kind);
    if (shape != std::vector<int64_t>{c.n_experts, rows, cols})
      fail(ErrorKind::Internal, "experts", "stack '" + n + "' read with another shape");
    for (int64_t e = 0; e < c.n_experts; e++)
      src.read_f32(hf_expert_name(c, s->layer, e, s->kind), {rows, cols}, dst + e * rows * cols);
  };
  if (src.read_quantized)
    out.read_quantized = [src](const std::string& n, int64_t rows, int64_t cols, QuantizedTensor& q) {
      return stack_of(n) ? false : src.read_quantized(n, rows, cols, q);
    };
  return out;
}

}  // namespace qlora
