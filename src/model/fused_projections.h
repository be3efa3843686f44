// Checkpoints that fuse projections (Phi-3/Phi-4: qkv_proj, gate_up_proj) read as the seven the
// engine keeps: each projection's weight is its rows of the fused tensor.
#pragma once
#include "model/llama_config.h"
#include "model/decoder_model.h"

namespace qlora {

// src itself when the model fuses nothing; else a source that answers "...self_attn.q_proj.weight"
// (k_proj, v_proj, mlp.gate_proj, mlp.up_proj) with those rows of the fused tensor, which it reads
// through src in f32 (a quantized fused tensor is dequantized, the part quantized again). Every
// other name goes to src unchanged.
TensorSource unfused_source(const LlamaConfig& c, const TensorSource& src);

}  // namespace qlora
