// The decoder's step state, private to its own files (decoder_*.cpp): one layer's saved
// activations, the workspaces and head buffers, and one forward's micro-batch on the device. All
// are views of planned buffers (model_plan.cpp names them), resolved once when the model is built;
// each step narrows them to its N rows.
#pragma once
#include <cstdint>

#include "model/decoder_model.h"
#include "model/layer_acts.h"
#include "model/projection_index.h"
#include "model/tensor_views.h"

namespace qlora {

// One layer's saved activations (model/layer_acts.h), its input x, and its adapters' intermediates.
struct DecoderModel::Acts : LayerActs {
  Tensor x;
  Tensor lora_h[7];      // per projection: its module's h = dropout(x) A^T (a fused module's shared)
  Tensor moe_lora_h[2];  // the experts' LoRA intermediates x A_e^T per routed row (gate_up_proj, down_proj)
};

// One layer's activations and where its output goes (its weights: BaseWeights::layer).
struct DecoderModel::LayerViews {
  Acts a;           // saved activations (checkpointing: the shared act.cur.* set)
  Tensor next;      // the next layer's input, or act.final_x
  Tensor inv_freq;  // this layer's RoPE frequencies (rope.inv_freq or, local layers, rope.inv_freq_local)
};

struct DecoderModel::StepViews {
  Tensor dres, dln, tmp, dgate, dup, datt, dq, dk, dv, lora_dh, lora_xd, inv_freq;
  Tensor moe_dy, moe_dlogits, moe_dw;  // mixture of experts
  Tensor moe_lora_dh;                  // s dy B_e per routed row (LoRA on the experts)
  Tensor embed, final_x, final_ln, final_rstd, norm, head, chunk, losses;
  // Full fine-tuning: the gradients of embed, norm and head (the embedding's when tied), and
  // ws.ones (N) for the biases' gradients; empty otherwise.
  Tensor embed_grad, norm_grad, head_grad, ones;
  // The micro-batch's int32 inputs on the device, and the mixture of experts' load-balancing
  // statistics (moe.router_stats (2,E), moe.aux_grad (E), batch.mask (N); with its loss only).
  Tensor batch_tokens, batch_targets, batch_positions, batch_seg, batch_label_rows, batch_label_targets;
  Tensor router_stats, aux_grad, batch_mask;
};

// One forward's micro-batch as uploaded (upload_batch): device pointers into the batch.* buffers.
struct DecoderModel::StepInputs {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  const int32_t* label_rows = nullptr;     // positions with a label (null when every position has one)
  const int32_t* label_targets = nullptr;  // their targets
  int64_t n_labeled = 0;
  const int32_t* positions = nullptr;
  const int32_t* seg = nullptr;
  int64_t n_docs = 0;  // documents of the packed batch (runs of equal seg per row), for attention
  int64_t b = 0, t = 0;
  bool decoding = false;  // a decode() chunk: k/v live in the KV cache
};

}  // namespace qlora
