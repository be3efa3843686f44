// FLOPs per training token, counted from the model shape (reference/perf_anchors.md §10):
// matmuls only; elementwise work and dequantization are memory traffic, priced in speed_model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/modes.h"

namespace qlora {

struct FlopOptions {
  Method method = Method::Lora;
  int64_t lora_r = 16;
  std::vector<std::string> targets;  // adapted projections (ignored for full)
  std::vector<std::string> expert_targets;  // adapted expert stacks (LoraSpec::expert_targets)
  int64_t attn_len = 2048;           // tokens a query attends within: the sequence, or the document when packed
  bool recompute = false;            // activation checkpointing re-runs each layer's forward
  bool reference = false;            // DPO/KTO: one more forward, the adapters off, nothing kept
  bool dq_recompute = false;         // the attention backward's dq in its own pass (AttnDq::Recompute)
  // The key-major backward's dK/dV split over two warps per key rows, each computing S^T and dP^T
  // (the GPU's own kernels at head dims over 128): S and dP once more.
  bool dkv_split = false;
};

// FLOPs of one pass, split by where they run (base GEMMs may use fp8/fp4 tensor cores).
struct FlopParts {
  double base = 0;  // decoder projections (frozen or trained)
  double head = 0;  // lm_head (tied or not)
  double lora = 0;  // adapter matmuls x@A and (xA)@B
  double attn = 0;  // QK^T and PV (causal)
  double total() const { return base + head + lora + attn; }
};

struct FlopCounts {  // per token
  FlopParts fwd, bwd, recompute, reference;
  double total() const { return fwd.total() + bwd.total() + recompute.total() + reference.total(); }
  // Forward + backward without recompute: the "model FLOPs" that MFU is measured on.
  double model() const { return fwd.total() + bwd.total(); }
};

// Shape sums the formula uses.
struct ShapeSums {
  double n_lin = 0;   // decoder projection parameters: sum of out*in over layers
  double n_head = 0;  // lm_head parameters: vocab * hidden
  double p_l = 0;     // sum of (in + out) over adapted projections and layers: LoRA params = r * p_l
                      // (adapted experts: their in + out once per routed expert, the work per token)
};
ShapeSums shape_sums(const LlamaConfig& c, const std::vector<std::string>& targets,
                     const std::vector<std::string>& expert_targets = {});

// Per-token FLOPs. Attention counts the exact causal pairs: a document of D tokens has D(D+1)/2
// query-key pairs, i.e. (D+1)/2 keys per token (the perf_anchors formula rounds this to D/2).
// forward  = 2 n_lin + 2 n_head + 2 r p_l + A,  A = 4 q_dim (D+1)/2 L
// backward = 2 n_lin + 2 n_head + 4 r p_l + 2.5 A      (frozen base: dgrad only; FA backward = 2.5x)
//          = 4 n_lin + 4 n_head           + 2.5 A      (full fine-tune: dgrad + wgrad)
// recompute = 2 n_lin + 2 r p_l + A                    (LM head is not recomputed)
// reference = 2 n_lin + 2 n_head + A                   (DPO/KTO: the forward with the adapters off)
FlopCounts flops_per_token(const LlamaConfig& c, const FlopOptions& o);

}  // namespace qlora
