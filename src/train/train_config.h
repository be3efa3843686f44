// TrainConfig: every training option under its Hugging Face spelling, loaded from YAML + key=value overrides.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/modes.h"
#include "text/dataset.h"
#include "train/train_modes.h"

namespace qlora {

// Defaults, allowed values and help text live in one table in train_config.cpp; the constructor
// fills every field from it (then derives as loading does), so `TrainConfig c;` equals loading an
// empty YAML file.
struct TrainConfig {
  TrainConfig();

  // model + output
  std::string model_name_or_path;
  std::string output_dir;
  // data
  std::string train_file;      // JSONL
  std::vector<std::string> dataset_mix;  // several train files: "PATH [weight=W] [format=F]" each
  std::string eval_file;       // "" = none
  double val_set_size;         // 0 = none; (0,1) fraction of train rows; >= 1 row count
  DatasetFormat dataset_format;  // config_dataset_formats(): auto detects it per file
  std::string dataset_text_field;     // text format: the field holding the text
  std::string field_messages;         // chat formats: the list of messages ("" = messages / conversations)
  std::string message_field_role;     // "" = role / from
  std::string message_field_content;  // "" = content / value
  std::string chat_template;   // "" = tokenizer's own
  bool train_on_inputs;
  std::vector<std::string> roles_to_train;
  bool skip_bad_rows;
  Truncation truncation;
  bool packing;
  int64_t max_length;
  std::string dataset_prepared_path;  // prepared-data cache folder; "" = the user cache, "none" = off
  // batch + steps
  int64_t per_device_train_batch_size;
  int64_t per_device_eval_batch_size;  // after loading: never 0 (0 in YAML = train batch size)
  int64_t gradient_accumulation_steps;
  double num_train_epochs;
  int64_t max_steps;  // -1 = from num_train_epochs
  // optimizer + schedule
  Optim optim;
  double learning_rate;
  LrScheduler lr_scheduler_type;
  double warmup_ratio;
  int64_t warmup_steps;  // > 0 wins over warmup_ratio
  double weight_decay;
  double adam_beta1, adam_beta2, adam_epsilon;
  double max_grad_norm;  // 0 = no clipping
  NanPolicy nan_policy;  // what a step with a non-finite loss or gradient norm does
  // logging / eval / checkpoints
  int64_t logging_steps;
  ReportTo report_to;
  std::string logging_dir;  // TensorBoard event files; "" = output_dir/runs/<date>_<host>
  EvalStrategy eval_strategy;
  int64_t eval_steps;         // 0 = only at the end
  int64_t save_steps;         // 0 = only at the end
  int64_t save_total_limit;   // 0 = keep all
  std::vector<std::string> sample_prompts;  // user messages answered greedily before and after training
  int64_t sample_max_new_tokens;
  std::string resume_from_checkpoint;  // "" none | "latest" | path
  int64_t seed;
  // LoRA
  FinetuningType finetuning_type;  // lora (adapters) or full (every weight)
  int64_t r;
  double lora_alpha;
  double lora_dropout;
  std::vector<std::string> target_modules;  // after loading: explicit names, "all-linear" expanded
  std::vector<std::string> target_parameters;  // PEFT's: a mixture of experts' mlp.experts.gate_up_proj / down_proj
  // A mixture of experts' load-balancing loss coefficient: "auto" (the model's own) or a number >= 0
  // (router_aux_loss_coef_value reads it).
  std::string router_aux_loss_coef;
  bool use_rslora;
  // preference training (rl != sft)
  Objective rl;               // the objective
  DpoLoss loss_type;          // dpo only
  double beta;                // dpo/kto: KL weight; orpo: lambda; simpo: reward scale
  double label_smoothing;     // dpo sigmoid/robust, simpo
  double simpo_gamma;         // simpo: target margin
  double cpo_alpha;           // simpo: weight of the chosen NLL
  double desirable_weight, undesirable_weight;  // kto
  bool precompute_ref_log_probs;
  DisableDropout disable_dropout;  // no LoRA dropout (auto: for the preference objectives, as TRL)
  // precision + memory
  BaseStorage base_precision;  // nullopt = as stored
  bool load_in_4bit;
  BasePrecision bnb_4bit_quant_type;  // bnb_4bit_formats(): nf4 | fp4
  bool bnb_4bit_use_double_quant;
  int64_t quant_blocksize;
  GemmDtype gemm_dtype;                // the base's forward GEMMs (ModelPlanOptions::gemm_dtype)
  Checkpointing gradient_checkpointing;
  int64_t ce_chunk_size;
  int64_t mlp_tile_tokens;             // tokens per MLP tile under checkpointing; 0 = auto
  AttnDqChoice attention_dq;           // the CUDA attention backward's dQ; nullopt: auto
  bool bf16;                           // informational: compute precision follows the backend
  // runtime
  DeviceChoice device;
  int64_t threads;     // 0 = all cores
  Sharding sharding;  // what data-parallel ranks split (zero1: the AdamW moments; fsdp: those and
                      // each decoder layer's frozen base bytes); trained_shardings() only
  double ddp_timeout;  // seconds a rank waits for the others in a collective before failing (multi-rank runs)

  bool operator==(const TrainConfig&) const = default;
};


// Loads a YAML config, then applies overrides ("key=value"; value parsed as a YAML scalar or flow
// sequence, so `target_modules=[q_proj,v_proj]` works; dotted torchtune keys like `optimizer.lr`).
// Aliases from axolotl / LLaMA-Factory / torchtune / older TRL are normalized and each one adds a
// note such as "lora_r -> r" to *notes (may be null). Errors: missing file -> Io; syntax, unknown
// key, bad type/value, conflicting fields -> Config naming file:line:col or the override.
// require_train_inputs: model_name_or_path and train_file must be set (false for `qlora plan`).
TrainConfig load_train_config(const std::string& yaml_path, const std::vector<std::string>& overrides,
                              std::vector<std::string>* notes, bool require_train_inputs = true);

// Same from YAML text; `origin` names it in messages (a file name, "<string>").
TrainConfig parse_train_config(const std::string& yaml_text, const std::string& origin,
                               const std::vector<std::string>& overrides,
                               std::vector<std::string>* notes, bool require_train_inputs = false);

// Re-runs the cross-field checks and derivations of loading on a config built in code
// (per_device_eval_batch_size 0 -> train batch size, target_modules order/expansion, 4-bit flags).
void finalize_train_config(TrainConfig& cfg, std::vector<std::string>* notes = nullptr);

// router_aux_loss_coef as a number, nullopt for auto (the model's own); Error(Config) naming the key
// for anything but auto or a finite number >= 0.
std::optional<double> router_aux_loss_coef_value(const TrainConfig& cfg);

// YAML with every effective value in table order; loading it back gives the same TrainConfig.
std::string dump_train_config(const TrainConfig& cfg);

// report_to as the trainer uses it: whether TensorBoard event files are written (tensorboard, all).
bool reports_to_tensorboard(const TrainConfig& cfg);

// Markdown table of every key: type, default, allowed values, help and accepted aliases.
std::string config_reference_markdown();

// One row of the key table, for docs and tests.
struct ConfigKeyDoc {
  std::string name, type, default_value, allowed, help;
  std::vector<std::string> aliases;
};
std::vector<ConfigKeyDoc> config_key_docs();

// Closest canonical key or alias to `key` within a small edit distance, or "" when none is close.
std::string suggest_config_key(const std::string& key);

}  // namespace qlora
