// The engine's limits per model, options and device (model/engine_limits.h).
#include "model/engine_limits.h"

#include "backend/backend.h"

namespace qlora {

std::vector<EngineLimit> engine_limits(const LlamaConfig& c, const ModelPlanOptions& o, DeviceKind device) {
  std::vector<EngineLimit> out;
  const bool cuda = device == DeviceKind::Cuda;
  // The own flash kernels take head dims that are multiples of 8 up to 256 (cuDNN's fused
  // attention up to 128; wider heads run on the own kernels).
  if (cuda && (c.head_dim % 8 != 0 || c.head_dim > 256))
    out.push_back({"model '" + c.name + "', head_dim " + std::to_string(c.head_dim),
                   "the cuda backend's attention (its own flash kernels) takes head dims that are multiples of 8 up "
                   "to 256",
                   "use device: cpu for this model"});
  // The CPU backend multiplies in f32: its base is f32, or quantized and dequantized per layer; a
  // bf16 or fp16 copy it would have to widen at every product is not implemented.
  if (!cuda && o.base_precision && (*o.base_precision == BasePrecision::Bf16 || *o.base_precision == BasePrecision::Fp16)) {
    const std::string name = base_precision_name(*o.base_precision);
    out.push_back({"base_precision " + name, "a " + name + " base is not implemented on the cpu backend (it multiplies in f32)",
                   "leave base_precision unset (the cpu holds the base in fp32) or quantize it: nf4, fp4, nvfp4, "
                   "mxfp4 or fp8"});
  }
  if (c.moe()) {
    const std::string where = "model '" + c.name + "' (" + c.model_type + ", mixture of experts)";
    auto refuse = [&](const std::string& what, const std::string& hint) {
      out.push_back({where, what + " is not implemented for mixture-of-experts models", hint});
    };
    if (o.base_shards > 0) refuse("sharding fsdp", "use sharding: none or zero1");
    if (o.gemm_dtype != GemmDtype::Bf16) refuse("FP8/FP4 base GEMMs", "use gemm_dtype bf16");
    if (o.mlp_tile > 0) refuse("the tiled MLP (mlp_tile)", "leave mlp_tile unset");
    if (c.experts_per_tok > 16 && cuda) refuse("more than 16 experts per token on the cuda backend", "use device: cpu");
  }
  if (o.method == Method::Full) {
    const std::string where = "finetuning_type full, model '" + c.name + "' (" + c.model_type + ")";
    auto refuse = [&](const std::string& what, const std::string& hint) {
      out.push_back({where, what + " is not implemented yet", hint});
    };
    if (cuda) refuse("full fine-tuning on the cuda backend", "use device: cpu, or finetuning_type: lora");
    if (c.moe()) refuse("full fine-tuning of a mixture of experts (experts and router)", "use finetuning_type: lora");
    if (c.attention_sinks) refuse("training attention sinks (gpt-oss)", "use finetuning_type: lora");
    if (c.fused_qkv || c.fused_gate_up) refuse("full fine-tuning of fused qkv_proj / gate_up_proj checkpoints (Phi-3)",
                                      "use finetuning_type: lora");
    if (!c.multimodal.empty()) refuse("full fine-tuning of a multimodal checkpoint's text model", "use finetuning_type: lora");
    if (o.base_shards > 0 || o.optimizer_shards > 1)
      refuse("sharded full fine-tuning (fsdp, zero1)", "use sharding: none (one process) for full fine-tuning");
  }
  return out;
}

}  // namespace qlora
