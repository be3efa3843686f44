// Fused projections (qkv_proj, gate_up_proj) read one part at a time.
#include "model/fused_projections.h"

#include <algorithm>
#include <optional>

#include "model/model_plan.h"

namespace qlora {

namespace {

struct Part {
  std::string fused;  // the checkpoint's tensor
  int64_t row0 = 0, rows = 0, total_rows = 0;
};

// "model.layers.L.self_attn.k_proj.weight" -> rows [q_dim, q_dim + kv_dim) of
// "model.layers.L.self_attn.qkv_proj.weight"; nullopt for any other name.
std::optional<Part> part_of(const LlamaConfig& c, const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return std::nullopt;
  const std::string layer = name.substr(0, dot + 1), rest = name.substr(dot + 1);
  const int64_t q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
  struct Row {
    const char* rest;
    bool fused;
    const char* into;
    int64_t row0, rows, total;
  };
  const Row rows[] = {
      {"self_attn.q_proj.weight", c.fused_qkv, "self_attn.qkv_proj.weight", 0, q, q + 2 * kv},
      {"self_attn.k_proj.weight", c.fused_qkv, "self_attn.qkv_proj.weight", q, kv, q + 2 * kv},
      {"self_attn.v_proj.weight", c.fused_qkv, "self_attn.qkv_proj.weight", q + kv, kv, q + 2 * kv},
      {"mlp.gate_proj.weight", c.fused_gate_up, "mlp.gate_up_proj.weight", 0, f, 2 * f},
      {"mlp.up_proj.weight", c.fused_gate_up, "mlp.gate_up_proj.weight", f, f, 2 * f},
  };
  for (const Row& r : rows)
    if (r.fused && rest == r.rest) return Part{layer + r.into, r.row0, r.rows, r.total};
  return std::nullopt;
}

}  // namespace

TensorSource unfused_source(const LlamaConfig& c, const TensorSource& src) {
  if (!c.fused_qkv && !c.fused_gate_up) return src;
  TensorSource out = src;
  out.has = [c, src](const std::string& n) {
    const auto p = part_of(c, n);
    return src.has(p ? p->fused : n);
  };
  out.read_f32 = [c, src](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    const auto p = part_of(c, n);
    if (!p) return src.read_f32(n, shape, dst);
    const int64_t cols = shape.size() == 2 ? shape[1] : 0;
    std::vector<float> all(static_cast<size_t>(p->total_rows * cols));
    src.read_f32(p->fused, {p->total_rows, cols}, all.data());
    std::copy_n(all.data() + p->row0 * cols, p->rows * cols, dst);
  };
  if (src.read_quantized)
    out.read_quantized = [c, src](const std::string& n, int64_t rows, int64_t cols, QuantizedTensor& q) {
      return part_of(c, n) ? false : src.read_quantized(n, rows, cols, q);  // a part: quantized from f32
    };
  return out;
}

}  // namespace qlora
