// The engine's modes as types: each parsed once from its key (a config key or a command-line
// flag, named in the error) and compared as a type everywhere else.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/attention_dq.h"
#include "core/dtype.h"

namespace qlora {

// None: every layer's activations are kept for the backward. Full: only each layer's input is
// kept, and the layer's forward runs again in the backward. Offload: as Full, with the kept
// inputs in pinned host memory.
enum class Checkpointing { None, Full, Offload };

const char* checkpointing_name(Checkpointing c);  // "none" | "full" | "offload"
std::vector<std::string> checkpointing_names();  // the names, in checkpointing_modes() order
// none | full | offload; anything else is an Error(Config) naming `key`, the value and the closest
// choice.
Checkpointing parse_checkpointing(const std::string& value, const std::string& key);
// None, Full, Offload: the order reports list them in.
const std::vector<Checkpointing>& checkpointing_modes();
inline bool recomputes(Checkpointing c) { return c != Checkpointing::None; }

// attention_dq: how the CUDA attention backward forms dQ (core/attention_dq.h).
const char* attn_dq_name(AttnDq d);  // "accumulate" | "recompute"
AttnDq parse_attn_dq(const std::string& value, const std::string& key);
const std::vector<AttnDq>& attn_dq_modes();  // Accumulate, Recompute

// The tensor-core dtype of the frozen base's forward GEMMs (gemm_dtype, --gemm-dtype; what each
// needs of the base and the device: model/gemm_dtype.h). Bf16: the base is dequantized a layer
// ahead. Fp8: an fp8 base read as stored. Fp4: an NVFP4/MXFP4 base read as stored.
enum class GemmDtype { Bf16, Fp8, Fp4 };

const char* gemm_dtype_name(GemmDtype g);  // "bf16" | "fp8" | "fp4"
GemmDtype parse_gemm_dtype(const std::string& value, const std::string& key);
const std::vector<GemmDtype>& gemm_dtypes();  // Bf16, Fp8, Fp4
std::vector<std::string> gemm_dtype_names();

// The training objective. Sft: the mean token loss of the labeled tokens. Dpo, Orpo, Simpo: a
// preference between a chosen and a rejected completion of one prompt (rows of two documents);
// Kto: completions rated desirable or not (train/preference.h has their definitions). Dpo and Kto
// also run the reference: the same model with the adapters off.
enum class Objective { Sft, Dpo, Orpo, Simpo, Kto };

const char* objective_name(Objective o);  // "sft" | "dpo" | "orpo" | "simpo" | "kto"
std::vector<std::string> objective_names();
// Also takes cpo_simpo (= simpo) and the empty string (= sft).
Objective parse_objective(const std::string& value, const std::string& key);
const std::vector<Objective>& objectives();
inline bool is_preference(Objective o) { return o != Objective::Sft; }
inline bool uses_reference(Objective o) { return o == Objective::Dpo || o == Objective::Kto; }

// DPO's loss on the reward margin: sigmoid (with label smoothing: conservative DPO), ipo, hinge,
// robust.
enum class DpoLoss { Sigmoid, Ipo, Hinge, Robust };

const char* dpo_loss_name(DpoLoss l);
std::vector<std::string> dpo_loss_names();
DpoLoss parse_dpo_loss(const std::string& value, const std::string& key);
const std::vector<DpoLoss>& dpo_losses();

// What is trained. Full: every weight (planned; the engine trains adapters only). Lora: adapters on
// a float base. Qlora: adapters on a quantized base.
enum class Method { Full, Lora, Qlora };

const char* method_name(Method m);  // "full" | "lora" | "qlora"
Method parse_method(const std::string& value, const std::string& key);

// How the frozen base is stored. Fp32, Bf16, Fp16: float weights. Fp8 (e4m3, one scale per
// tensor), Nf4 and Fp4 (bitsandbytes blocks, optionally double-quantized), Nvfp4, Mxfp4: quantized.
enum class BasePrecision { Fp32, Bf16, Fp16, Fp8, Nf4, Fp4, Nvfp4, Mxfp4 };

const char* base_precision_name(BasePrecision p);  // "fp32" | "bf16" | ... | "mxfp4"
// Also takes the spellings f32, f16 and fp8_e4m3.
BasePrecision parse_base_precision(const std::string& value, const std::string& key);
const std::vector<BasePrecision>& base_precisions();  // in the order messages list them
// "" -> unset (the default for the method and device); anything else as parse_base_precision.
std::optional<BasePrecision> optional_base_precision(const std::string& value, const std::string& key);
inline bool is_quantized(BasePrecision p) { return p >= BasePrecision::Fp8; }
inline bool is_bnb_4bit(BasePrecision p) { return p == BasePrecision::Nf4 || p == BasePrecision::Fp4; }
// The dtype of a float base's weights (Fp32 F32, Bf16 BF16, Fp16 F16); a quantized base's bytes: U8.
DType storage_dtype(BasePrecision p);
// The float base of a compute dtype (F32 -> Fp32, BF16 -> Bf16, F16 -> Fp16).
BasePrecision float_base(DType compute);

// The AdamW moments' dtype: fp32 (also f32) | bf16.
const char* optimizer_dtype_name(DType d);  // "fp32" | "bf16"
DType parse_optimizer_dtype(const std::string& value, const std::string& key);

// What data-parallel ranks split. Zero1: the optimizer state; Zero2: also the gradients; Zero3:
// also the parameters, frozen base included (planned only). Fsdp: what the engine runs, ZeRO-1's
// optimizer split plus an even byte split of each decoder layer's frozen base.
enum class Sharding { None, Zero1, Zero2, Zero3, Fsdp };

const char* sharding_name(Sharding s);  // "none" | "zero1" | "zero2" | "zero3" | "fsdp"
// Also takes ddp (= none) and zero-1, zero-2, zero-3.
Sharding parse_sharding(const std::string& value, const std::string& key);

}  // namespace qlora
