// The training loop's modes as types, parsed once by the config key table (train_config.cpp) from
// their names and compared as types everywhere else. Each has its name, its values in the order the
// docs list them, and the table derives the key's allowed values from those.
#pragma once
#include <optional>
#include <vector>

#include "core/attention_dq.h"
#include "model/modes.h"
#include "text/dataset.h"

namespace qlora {

// nan_policy: a step whose loss or gradient norm is not finite. Stop: name the step and the tensor,
// checkpoint the last good state. Skip: leave the weights, count it (10 in a row stop the run).
enum class NanPolicy { Stop, Skip };
const char* nan_policy_name(NanPolicy p);  // "stop" | "skip"
const std::vector<NanPolicy>& nan_policies();

// eval_strategy: when to evaluate, if there is eval data. No: never. Steps: every eval_steps and at
// the end. Epoch: at each epoch's end.
enum class EvalStrategy { No, Steps, Epoch };
const char* eval_strategy_name(EvalStrategy s);  // "no" | "steps" | "epoch"
const std::vector<EvalStrategy>& eval_strategies();

// report_to: None, or TensorBoard event files (All: every integration built in, which is TensorBoard).
enum class ReportTo { None, Tensorboard, All };
const char* report_to_name(ReportTo r);  // "none" | "tensorboard" | "all"
const std::vector<ReportTo>& report_to_choices();
inline bool writes_tensorboard(ReportTo r) { return r != ReportTo::None; }

// lr_scheduler_type, with Hugging Face's formulas (train/schedule.h).
enum class LrScheduler { Linear, Cosine, Constant, ConstantWithWarmup };
const char* lr_scheduler_name(LrScheduler s);  // "linear" | "cosine" | "constant" | "constant_with_warmup"
const std::vector<LrScheduler>& lr_schedulers();

// disable_dropout: Auto (off for the preference objectives, as TRL's trainers; on for SFT), Yes
// (no LoRA dropout for any objective), No (the configured dropout always).
enum class DisableDropout { Auto, Yes, No };
const char* disable_dropout_name(DisableDropout d);  // "auto" | "true" | "false"
const std::vector<DisableDropout>& disable_dropout_choices();

// optim: torch's AdamW, single-tensor or fused; the engine computes both the same way.
enum class Optim { AdamwTorch, AdamwTorchFused };
const char* optim_name(Optim o);  // "adamw_torch" | "adamw_torch_fused"
const std::vector<Optim>& optims();

// base_precision: the frozen base's storage format; nullopt (written "") as the checkpoint stores it.
using BaseStorage = std::optional<BasePrecision>;
const char* base_storage_name(BaseStorage b);  // "" | "fp32" | "bf16" | "fp8" | "nf4" | "fp4" | "nvfp4" | "mxfp4"
const std::vector<BaseStorage>& base_storages();

// bnb_4bit_quant_type: the 4-bit format load_in_4bit quantizes the base to (nf4 | fp4).
const std::vector<BasePrecision>& bnb_4bit_formats();

// attention_dq: nullopt (written "auto": the planner chooses by the memory budget) or a fixed way.
using AttnDqChoice = std::optional<AttnDq>;
const char* attn_dq_choice_name(AttnDqChoice d);  // "auto" | "accumulate" | "recompute"
const std::vector<AttnDqChoice>& attn_dq_choices();

// device: where to train. Auto: cuda when a GPU is present, else the CPU.
enum class DeviceChoice { Auto, Cpu, Cuda };
const char* device_choice_name(DeviceChoice d);  // "auto" | "cpu" | "cuda"
const std::vector<DeviceChoice>& device_choices();

// dataset_format: the formats a config names (the preference formats are found by detection).
const std::vector<DatasetFormat>& config_dataset_formats();

// finetuning_type (LLaMA-Factory's key): LoRA adapters on a frozen base, or every weight trained.
enum class FinetuningType { Lora, Full };
const char* finetuning_type_name(FinetuningType f);  // "lora" | "full"
const std::vector<FinetuningType>& finetuning_types();

// sharding: the splits training implements (qlora plan also plans zero2 and zero3).
const std::vector<Sharding>& trained_shardings();  // None, Zero1, Fsdp

}  // namespace qlora
