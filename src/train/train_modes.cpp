#include "train/train_modes.h"

namespace qlora {

const char* nan_policy_name(NanPolicy p) { return p == NanPolicy::Skip ? "skip" : "stop"; }
const std::vector<NanPolicy>& nan_policies() {
  static const std::vector<NanPolicy> v = {NanPolicy::Stop, NanPolicy::Skip};
  return v;
}

const char* eval_strategy_name(EvalStrategy s) {
  switch (s) {
    case EvalStrategy::No: return "no";
    case EvalStrategy::Steps: return "steps";
    case EvalStrategy::Epoch: return "epoch";
  }
  return "steps";
}
const std::vector<EvalStrategy>& eval_strategies() {
  static const std::vector<EvalStrategy> v = {EvalStrategy::No, EvalStrategy::Steps, EvalStrategy::Epoch};
  return v;
}

const char* report_to_name(ReportTo r) {
  switch (r) {
    case ReportTo::None: return "none";
    case ReportTo::Tensorboard: return "tensorboard";
    case ReportTo::All: return "all";
  }
  return "none";
}
const std::vector<ReportTo>& report_to_choices() {
  static const std::vector<ReportTo> v = {ReportTo::None, ReportTo::Tensorboard, ReportTo::All};
  return v;
}

const char* lr_scheduler_name(LrScheduler s) {
  switch (s) {
    case LrScheduler::Linear: return "linear";
    case LrScheduler::Cosine: return "cosine";
    case LrScheduler::Constant: return "constant";
    case LrScheduler::ConstantWithWarmup: return "constant_with_warmup";
  }
  return "cosine";
}
const std::vector<LrScheduler>& lr_schedulers() {
  static const std::vector<LrScheduler> v = {LrScheduler::Linear, LrScheduler::Cosine, LrScheduler::Constant,
                                             LrScheduler::ConstantWithWarmup};
  return v;
}

const char* disable_dropout_name(DisableDropout d) {
  switch (d) {
    case DisableDropout::Auto: return "auto";
    case DisableDropout::Yes: return "true";
    case DisableDropout::No: return "false";
  }
  return "auto";
}
const std::vector<DisableDropout>& disable_dropout_choices() {
  static const std::vector<DisableDropout> v = {DisableDropout::Auto, DisableDropout::Yes, DisableDropout::No};
  return v;
}

const char* optim_name(Optim o) { return o == Optim::AdamwTorchFused ? "adamw_torch_fused" : "adamw_torch"; }
const std::vector<Optim>& optims() {
  static const std::vector<Optim> v = {Optim::AdamwTorch, Optim::AdamwTorchFused};
  return v;
}

const std::vector<Sharding>& trained_shardings() {
  static const std::vector<Sharding> v = {Sharding::None, Sharding::Zero1, Sharding::Fsdp};
  return v;
}

const char* base_storage_name(BaseStorage b) { return b ? base_precision_name(*b) : ""; }
const std::vector<BaseStorage>& base_storages() {
  static const std::vector<BaseStorage> v = {std::nullopt,        BasePrecision::Fp32, BasePrecision::Bf16,
                                             BasePrecision::Fp8,  BasePrecision::Nf4,  BasePrecision::Fp4,
                                             BasePrecision::Nvfp4, BasePrecision::Mxfp4};
  return v;
}

const std::vector<BasePrecision>& bnb_4bit_formats() {
  static const std::vector<BasePrecision> v = {BasePrecision::Nf4, BasePrecision::Fp4};
  return v;
}

const char* attn_dq_choice_name(AttnDqChoice d) { return d ? attn_dq_name(*d) : "auto"; }
const std::vector<AttnDqChoice>& attn_dq_choices() {
  static const std::vector<AttnDqChoice> v = {std::nullopt, AttnDq::Accumulate, AttnDq::Recompute};
  return v;
}

const char* device_choice_name(DeviceChoice d) {
  switch (d) {
    case DeviceChoice::Auto: return "auto";
    case DeviceChoice::Cpu: return "cpu";
    case DeviceChoice::Cuda: return "cuda";
  }
  return "auto";
}
const std::vector<DeviceChoice>& device_choices() {
  static const std::vector<DeviceChoice> v = {DeviceChoice::Auto, DeviceChoice::Cpu, DeviceChoice::Cuda};
  return v;
}

const std::vector<DatasetFormat>& config_dataset_formats() {
  static const std::vector<DatasetFormat> v = {DatasetFormat::Auto,     DatasetFormat::Text,
                                               DatasetFormat::Pretokenized, DatasetFormat::Alpaca,
                                               DatasetFormat::ShareGpt, DatasetFormat::Messages,
                                               DatasetFormat::PromptCompletion, DatasetFormat::Segments};
  return v;
}

const char* finetuning_type_name(FinetuningType f) { return f == FinetuningType::Full ? "full" : "lora"; }
const std::vector<FinetuningType>& finetuning_types() {
  static const std::vector<FinetuningType> v = {FinetuningType::Lora, FinetuningType::Full};
  return v;
}

}  // namespace qlora
