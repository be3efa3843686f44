// One decoder layer's saved activations: the planned buffers "act.layers.<l>.<name>" (checkpointing:
// the one shared set "act.cur.<name>"). kLayerActRows lists each with its dtype and shape; the plan
// adds exactly these buffers (plan_model_buffers) and the model binds exactly these members
// (DecoderModel::resolve_views), so neither spells a name the other lacks, and a member without
// a row does not compile (the static_assert below).
#pragma once
#include <cstdint>
#include <iterator>
#include <vector>

#include "backend/backend.h"
#include "model/llama_config.h"

namespace qlora {

struct LayerActs {
  Tensor ln1, rstd1, q, k, v;
  Tensor q_raw, k_raw, rstd_q, rstd_k;  // qk_norm: q, k before the per-head norm; its 1/rms per head
  Tensor att, lse, xmid, ln2, rstd2;
  // sandwich_norms: o_proj's output before its norm (xmid = x + norm(attn_out)) and down_proj's
  // (one MLP tile's rows), with each norm's 1/rms (N)
  Tensor attn_out, rstd_pa, mlp_out, rstd_pf;
  // Mixture of experts: router logits (N,E); the routing (MoeRouteArgs: expert, row, token, weight,
  // row_weight, offsets); the experts' inputs and outputs in the expert-sorted layout (N*K, C).
  Tensor moe_logits, moe_expert, moe_row, moe_token, moe_weight, moe_row_weight, moe_offsets, moe_x, moe_y;
  // The MLP: (T, F) rows, T = mlp_rows (a tile, all tokens, or a MoE layer's N*K routed rows).
  Tensor gate, up, h;
};

enum class ActFeature : uint8_t { All, QkNorm, SandwichNorms, Moe };  // which models hold the buffer
enum class ActDtype : uint8_t { Compute, F32, I32 };
// The planned shape: N tokens of the micro-batch, C hidden, Q q_dim, KV kv_dim, Hq / Hkv heads,
// E experts, K experts per token; T the MLP's rows (mlp_rows), F its width (intermediate_size, or
// expert_intermediate_size in a MoE layer); Tile: the (T, C) output of one MLP tile.
enum class ActShape : uint8_t { NC, N, NQ, NKV, NHq, NHkv, HqN, TileC, NE, NK, E1, TC, TF };

struct LayerActRow {
  Tensor LayerActs::*member;
  const char* name;
  ActFeature feature;
  ActDtype dtype;
  ActShape shape;
};

inline constexpr LayerActRow kLayerActRows[] = {
    {&LayerActs::ln1, "ln1", ActFeature::All, ActDtype::Compute, ActShape::NC},
    {&LayerActs::rstd1, "rstd1", ActFeature::All, ActDtype::F32, ActShape::N},
    {&LayerActs::q, "q", ActFeature::All, ActDtype::Compute, ActShape::NQ},
    {&LayerActs::k, "k", ActFeature::All, ActDtype::Compute, ActShape::NKV},
    {&LayerActs::v, "v", ActFeature::All, ActDtype::Compute, ActShape::NKV},
    {&LayerActs::q_raw, "q_raw", ActFeature::QkNorm, ActDtype::Compute, ActShape::NQ},
    {&LayerActs::k_raw, "k_raw", ActFeature::QkNorm, ActDtype::Compute, ActShape::NKV},
    {&LayerActs::rstd_q, "rstd_q", ActFeature::QkNorm, ActDtype::F32, ActShape::NHq},
    {&LayerActs::rstd_k, "rstd_k", ActFeature::QkNorm, ActDtype::F32, ActShape::NHkv},
    {&LayerActs::att, "att", ActFeature::All, ActDtype::Compute, ActShape::NQ},
    {&LayerActs::lse, "lse", ActFeature::All, ActDtype::F32, ActShape::HqN},
    {&LayerActs::xmid, "xmid", ActFeature::All, ActDtype::Compute, ActShape::NC},
    {&LayerActs::ln2, "ln2", ActFeature::All, ActDtype::Compute, ActShape::NC},
    {&LayerActs::rstd2, "rstd2", ActFeature::All, ActDtype::F32, ActShape::N},
    {&LayerActs::attn_out, "attn_out", ActFeature::SandwichNorms, ActDtype::Compute, ActShape::NC},
    {&LayerActs::rstd_pa, "rstd_pa", ActFeature::SandwichNorms, ActDtype::F32, ActShape::N},
    {&LayerActs::mlp_out, "mlp_out", ActFeature::SandwichNorms, ActDtype::Compute, ActShape::TileC},
    {&LayerActs::rstd_pf, "rstd_pf", ActFeature::SandwichNorms, ActDtype::F32, ActShape::N},
    // The router's logits in f32 on every backend (a bf16 rounding of them reorders near ties).
    {&LayerActs::moe_logits, "moe_logits", ActFeature::Moe, ActDtype::F32, ActShape::NE},
    {&LayerActs::moe_expert, "moe_expert", ActFeature::Moe, ActDtype::I32, ActShape::NK},
    {&LayerActs::moe_row, "moe_row", ActFeature::Moe, ActDtype::I32, ActShape::NK},
    {&LayerActs::moe_token, "moe_token", ActFeature::Moe, ActDtype::I32, ActShape::NK},
    {&LayerActs::moe_weight, "moe_weight", ActFeature::Moe, ActDtype::F32, ActShape::NK},
    {&LayerActs::moe_row_weight, "moe_row_weight", ActFeature::Moe, ActDtype::F32, ActShape::NK},
    {&LayerActs::moe_offsets, "moe_offsets", ActFeature::Moe, ActDtype::I32, ActShape::E1},
    {&LayerActs::moe_x, "moe_x", ActFeature::Moe, ActDtype::Compute, ActShape::TC},
    {&LayerActs::moe_y, "moe_y", ActFeature::Moe, ActDtype::Compute, ActShape::TC},
    {&LayerActs::gate, "gate", ActFeature::All, ActDtype::Compute, ActShape::TF},
    {&LayerActs::up, "up", ActFeature::All, ActDtype::Compute, ActShape::TF},
    {&LayerActs::h, "h", ActFeature::All, ActDtype::Compute, ActShape::TF},
};
static_assert(std::size(kLayerActRows) * sizeof(Tensor) == sizeof(LayerActs),
              "every LayerActs member has its row in kLayerActRows");

// Whether model c holds the buffers of `f`.
bool has_act_feature(const LlamaConfig& c, ActFeature f);
// The planned shape of a row: N tokens, T MLP rows (model_plan.h's mlp_rows).
std::vector<int64_t> layer_act_shape(const LlamaConfig& c, ActShape s, int64_t n, int64_t t);
// The rows a step of n tokens uses, as a view: n, n*heads, n*K or the MLP's (mlp_n; tile_n for
// TileC); HqN is viewed as (Hq, n); E1 keeps its shape.
Tensor layer_act_view(const LlamaConfig& c, ActShape s, Tensor t, int64_t n, int64_t mlp_n, int64_t tile_n);

}  // namespace qlora
