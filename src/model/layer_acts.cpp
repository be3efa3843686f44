#include "model/layer_acts.h"

#include <algorithm>

#include "model/tensor_views.h"

namespace qlora {

bool has_act_feature(const LlamaConfig& c, ActFeature f) {
  switch (f) {
    case ActFeature::All: return true;
    case ActFeature::QkNorm: return c.qk_norm;
    case ActFeature::SandwichNorms: return c.sandwich_norms;
    case ActFeature::Moe: return c.moe();
  }
  return false;
}

std::vector<int64_t> layer_act_shape(const LlamaConfig& c, ActShape s, int64_t n, int64_t t) {
  const int64_t C = c.hidden_size, F = c.moe() ? c.expert_intermediate_size : c.intermediate_size;
  switch (s) {
    case ActShape::NC: return {n, C};
    case ActShape::N: return {n};
    case ActShape::NQ: return {n, c.q_dim()};
    case ActShape::NKV: return {n, c.kv_dim()};
    case ActShape::NHq: return {n * c.n_head};
    case ActShape::NHkv: return {n * c.n_head_kv};
    case ActShape::HqN: return {c.n_head, n};
    case ActShape::TileC: return {t, C};
    case ActShape::NE: return {n, c.n_experts};
    case ActShape::NK: return {n * c.experts_per_tok};
    case ActShape::E1: return {c.n_experts + 1};
    case ActShape::TC: return {t, C};
    case ActShape::TF: return {t, F};
  }
  return {};
}

Tensor layer_act_view(const LlamaConfig& c, ActShape s, Tensor t, int64_t n, int64_t mlp_n, int64_t tile_n) {
  switch (s) {
    case ActShape::NHq: return with_rows(t, n * c.n_head);
    case ActShape::NHkv: return with_rows(t, n * c.n_head_kv);
    case ActShape::HqN: return as_matrix(t, c.n_head, n);  // (Hq, N) storage used as (B,Hq,T)
    case ActShape::TileC: return with_rows(t, tile_n);
    case ActShape::NK: case ActShape::TC: case ActShape::TF: return with_rows(t, mlp_n);
    case ActShape::E1: return t;
    default: return with_rows(t, n);
  }
}

}  // namespace qlora
