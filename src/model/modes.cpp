#include "model/modes.h"

#include "core/error.h"
#include "io/json_util.h"

namespace qlora {

namespace {

template <class Mode>
std::vector<std::string> names_of(const std::vector<Mode>& modes, const char* (*name)(Mode)) {
  std::vector<std::string> names;
  for (Mode m : modes) names.push_back(name(m));
  return names;
}

// The mode of `modes` whose name is `value`; else an Error(Config) naming `key`, the value, the
// closest name and `choices` (the names, with what each does where that helps).
template <class Mode>
Mode parse_mode(const std::string& value, const std::string& key, const std::vector<Mode>& modes,
                const char* (*name)(Mode), const std::string& choices) {
  for (Mode m : modes)
    if (value == name(m)) return m;
  const std::string close = closest_name(names_of(modes, name), value, 3);
  fail(ErrorKind::Config, key + " " + value, "unknown value '" + value + "'",
       (close.empty() ? std::string() : "did you mean '" + close + "'? ") + "choose one of " + choices);
}

// The same with other spellings of a name: aliases[i] = {spelling, name}.
template <class Mode>
Mode parse_mode(std::string value, const std::string& key, const std::vector<Mode>& modes, const char* (*name)(Mode),
                const std::string& choices, const std::vector<std::pair<const char*, const char*>>& aliases) {
  for (const auto& [spelling, canonical] : aliases)
    if (value == spelling) return parse_mode(std::string(canonical), key, modes, name, choices);
  return parse_mode(value, key, modes, name, choices);
}

}  // namespace

const char* checkpointing_name(Checkpointing c) {
  switch (c) {
    case Checkpointing::None: return "none";
    case Checkpointing::Full: return "full";
    case Checkpointing::Offload: return "offload";
  }
  return "none";
}

Checkpointing parse_checkpointing(const std::string& value, const std::string& key) {
  return parse_mode(value, key, checkpointing_modes(), checkpointing_name,
                    "none (keep every activation), full (recompute each layer), offload (full, with the layer "
                    "inputs in host memory)");
}

std::vector<std::string> checkpointing_names() { return names_of(checkpointing_modes(), checkpointing_name); }

const std::vector<Checkpointing>& checkpointing_modes() {
  static const std::vector<Checkpointing> m = {Checkpointing::None, Checkpointing::Full, Checkpointing::Offload};
  return m;
}

const char* attn_dq_name(AttnDq d) { return d == AttnDq::Recompute ? "recompute" : "accumulate"; }

AttnDq parse_attn_dq(const std::string& value, const std::string& key) {
  return parse_mode(value, key, attn_dq_modes(), attn_dq_name,
                    "accumulate (dQ summed in an f32 buffer of every token), recompute (dQ in its own pass, no "
                    "such buffer)");
}

const std::vector<AttnDq>& attn_dq_modes() {
  static const std::vector<AttnDq> m = {AttnDq::Accumulate, AttnDq::Recompute};
  return m;
}

const char* gemm_dtype_name(GemmDtype g) {
  switch (g) {
    case GemmDtype::Bf16: return "bf16";
    case GemmDtype::Fp8: return "fp8";
    case GemmDtype::Fp4: return "fp4";
  }
  return "bf16";
}

const std::vector<GemmDtype>& gemm_dtypes() {
  static const std::vector<GemmDtype> all = {GemmDtype::Bf16, GemmDtype::Fp8, GemmDtype::Fp4};
  return all;
}

std::vector<std::string> gemm_dtype_names() { return names_of(gemm_dtypes(), gemm_dtype_name); }

GemmDtype parse_gemm_dtype(const std::string& value, const std::string& key) {
  return parse_mode(value, key, gemm_dtypes(), gemm_dtype_name, "bf16, fp8, fp4");
}

const char* method_name(Method m) {
  switch (m) {
    case Method::Full: return "full";
    case Method::Lora: return "lora";
    case Method::Qlora: return "qlora";
  }
  return "lora";
}

Method parse_method(const std::string& value, const std::string& key) {
  static const std::vector<Method> all = {Method::Full, Method::Lora, Method::Qlora};
  return parse_mode(value, key, all, method_name, "full, lora, qlora");
}

const char* base_precision_name(BasePrecision p) {
  switch (p) {
    case BasePrecision::Fp32: return "fp32";
    case BasePrecision::Bf16: return "bf16";
    case BasePrecision::Fp16: return "fp16";
    case BasePrecision::Fp8: return "fp8";
    case BasePrecision::Nf4: return "nf4";
    case BasePrecision::Fp4: return "fp4";
    case BasePrecision::Nvfp4: return "nvfp4";
    case BasePrecision::Mxfp4: return "mxfp4";
  }
  return "fp32";
}

const std::vector<BasePrecision>& base_precisions() {
  static const std::vector<BasePrecision> all = {BasePrecision::Bf16,  BasePrecision::Fp16, BasePrecision::Fp32,
                                                 BasePrecision::Fp8,   BasePrecision::Nf4,  BasePrecision::Fp4,
                                                 BasePrecision::Nvfp4, BasePrecision::Mxfp4};
  return all;
}

BasePrecision parse_base_precision(const std::string& value, const std::string& key) {
  return parse_mode(value, key, base_precisions(), base_precision_name,
                    "bf16, fp16, fp32 (float), fp8, nf4, fp4, nvfp4, mxfp4 (quantized)",
                    {{"f32", "fp32"}, {"f16", "fp16"}, {"fp8_e4m3", "fp8"}});
}

std::optional<BasePrecision> optional_base_precision(const std::string& value, const std::string& key) {
  if (value.empty()) return std::nullopt;
  return parse_base_precision(value, key);
}

DType storage_dtype(BasePrecision p) {
  switch (p) {
    case BasePrecision::Fp32: return DType::F32;
    case BasePrecision::Bf16: return DType::BF16;
    case BasePrecision::Fp16: return DType::F16;
    default: return DType::U8;
  }
}

BasePrecision float_base(DType compute) {
  if (compute == DType::BF16) return BasePrecision::Bf16;
  if (compute == DType::F16) return BasePrecision::Fp16;
  return BasePrecision::Fp32;
}

const char* optimizer_dtype_name(DType d) { return d == DType::BF16 ? "bf16" : "fp32"; }

DType parse_optimizer_dtype(const std::string& value, const std::string& key) {
  static const std::vector<DType> all = {DType::F32, DType::BF16};
  return parse_mode(value, key, all, optimizer_dtype_name, "fp32, bf16", {{"f32", "fp32"}});
}

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::None: return "none";
    case Sharding::Zero1: return "zero1";
    case Sharding::Zero2: return "zero2";
    case Sharding::Zero3: return "zero3";
    case Sharding::Fsdp: return "fsdp";
  }
  return "none";
}

Sharding parse_sharding(const std::string& value, const std::string& key) {
  static const std::vector<Sharding> all = {Sharding::None, Sharding::Zero1, Sharding::Zero2, Sharding::Zero3,
                                            Sharding::Fsdp};
  return parse_mode(value, key, all, sharding_name,
                    "none, zero1 (optimizer), zero2 (+grads), zero3 (+parameters) or fsdp (zero1 + the frozen "
                    "base's decoder layers, as training runs it)",
                    {{"ddp", "none"}, {"zero-1", "zero1"}, {"zero-2", "zero2"}, {"zero-3", "zero3"}});
}

const char* objective_name(Objective o) {
  switch (o) {
    case Objective::Sft: return "sft";
    case Objective::Dpo: return "dpo";
    case Objective::Orpo: return "orpo";
    case Objective::Simpo: return "simpo";
    case Objective::Kto: return "kto";
  }
  return "sft";
}

const std::vector<Objective>& objectives() {
  static const std::vector<Objective> o = {Objective::Sft, Objective::Dpo, Objective::Orpo, Objective::Simpo,
                                           Objective::Kto};
  return o;
}

std::vector<std::string> objective_names() { return names_of(objectives(), objective_name); }

Objective parse_objective(const std::string& value, const std::string& key) {
  return parse_mode(value, key, objectives(), objective_name,
                    "sft (supervised), dpo, orpo, simpo or kto (preference training)",
                    {{"", "sft"}, {"cpo_simpo", "simpo"}});
}

const char* dpo_loss_name(DpoLoss l) {
  switch (l) {
    case DpoLoss::Sigmoid: return "sigmoid";
    case DpoLoss::Ipo: return "ipo";
    case DpoLoss::Hinge: return "hinge";
    case DpoLoss::Robust: return "robust";
  }
  return "sigmoid";
}

const std::vector<DpoLoss>& dpo_losses() {
  static const std::vector<DpoLoss> l = {DpoLoss::Sigmoid, DpoLoss::Ipo, DpoLoss::Hinge, DpoLoss::Robust};
  return l;
}

std::vector<std::string> dpo_loss_names() { return names_of(dpo_losses(), dpo_loss_name); }

DpoLoss parse_dpo_loss(const std::string& value, const std::string& key) {
  return parse_mode(value, key, dpo_losses(), dpo_loss_name, "sigmoid, ipo, hinge or robust");
}

}  // namespace qlora
