// TrainConfig loading: one key table drives defaults, parsing, validation, docs and suggestions.
#include "train/train_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <variant>

#include "core/error.h"
#include "core/mode_names.h"
#include "core/strings.h"
#include "model/modes.h"
#include "text/unicode.h"

namespace qlora {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A mode key: an enum field of TrainConfig (train_modes.h, model/modes.h, text/dataset.h) read and
// written through its names, which are the key's allowed values.
struct ModeField {
  std::string (*get)(const TrainConfig&);
  void (*set)(TrainConfig&, const std::string& name);  // name: one of names()
  std::vector<std::string> (*names)();
};

// The ModeField of member M, whose enum has the name function NameOf and the values Values().
template <auto M, auto NameOf, auto Values>
ModeField mode_field() {
  return {[](const TrainConfig& c) { return std::string(NameOf(c.*M)); },
          [](TrainConfig& c, const std::string& name) {
            if (const auto v = mode_by_name(Values(), NameOf, name)) c.*M = *v;
          },
          [] {
            std::vector<std::string> n;
            for (auto v : Values()) n.push_back(NameOf(v));
            return n;
          }};
}

using Field = std::variant<std::string TrainConfig::*, int64_t TrainConfig::*, double TrainConfig::*,
                           bool TrainConfig::*, std::vector<std::string> TrainConfig::*, ModeField>;
enum FieldType { kStr, kInt, kFloat, kBool, kList, kMode };  // order = Field alternatives
const char* const kTypeNames[] = {"string", "int", "float", "bool", "list", "string"};

struct Range {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
};

struct KeyRow {
  const char* name;
  Field field;
  const char* def;  // default, written as it would be in YAML
  std::vector<std::string> choices = {};  // allowed values ({} = any; a mode's: its names); for lists: per element
  Range range = {};
  const char* help = "";
  // Spellings of a value that mean a canonical one (YAML true -> "full", "unsloth" -> "offload").
  std::vector<std::pair<std::string, std::string>> value_aliases = {};
  const char* null_as = nullptr;    // what YAML null means (strings: always "")
  const char* bad_value_hint = "";  // replaces the generic "allowed: ..." hint
  bool list_of_text = false;  // lists: a scalar is one item, never split at commas
};

const std::vector<std::string> kLinear = {"q_proj", "k_proj", "v_proj", "o_proj",
                                          "gate_proj", "up_proj", "down_proj"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The single source of truth for keys. Order is the order of dump_train_config and the docs.
const std::vector<KeyRow>& key_table() {
  using T = TrainConfig;
  static const std::vector<KeyRow> rows = {
      {.name = "model_name_or_path", .field = &T::model_name_or_path, .def = "",
       .help = "Base model: a Hugging Face directory (config.json + *.safetensors) or a .gguf file. Required for train."},
      {.name = "output_dir", .field = &T::output_dir, .def = "out",
       .help = "Where the adapter, checkpoint-N/, metrics.jsonl and the effective config are written."},
      {.name = "train_file", .field = &T::train_file, .def = "",
       .help = "Training data, JSONL (one example per line) or a JSON array. Required for train (or dataset_mix)."},
      {.name = "dataset_mix", .field = &T::dataset_mix, .def = "",
       .help = "Several training files instead of train_file: \"PATH [weight=W] [format=F]\" each. weight = copies "
               "per epoch (fractions take a seeded subset; default 1); format overrides dataset_format for that file. "
               "axolotl's datasets: [{path, type, weight}] list lands here."},
      {.name = "eval_file", .field = &T::eval_file, .def = "", .help = "Evaluation data, JSONL. Empty = none."},
      {.name = "val_set_size", .field = &T::val_set_size, .def = "0", .range = {.lo = 0},
       .help = "Rows split off train_file for evaluation: a fraction in (0,1) or a count >= 1. 0 = none."},
      {.name = "dataset_format", .field = &T::dataset_format, .def = "auto",
       .choices = {"auto", "text", "pretokenized", "alpaca", "sharegpt", "messages", "prompt_completion", "segments"},
       .help = "Row format; auto detects it per file from the keys of its first valid row.",
       .value_aliases = {{"chat_template", "messages"}, {"completion", "text"}, {"pretrain", "text"},
                         {"input_output", "segments"}, {"openai", "messages"}, {"conversational", "messages"}}},
      {.name = "dataset_text_field", .field = &T::dataset_text_field, .def = "text",
       .help = "Text format: the field that holds the text."},
      {.name = "field_messages", .field = &T::field_messages, .def = "",
       .help = "Chat formats: the field that holds the message list. Empty = messages (or conversations for sharegpt)."},
      {.name = "message_field_role", .field = &T::message_field_role, .def = "",
       .help = "Chat formats: the message field that holds the role. Empty = role (or from)."},
      {.name = "message_field_content", .field = &T::message_field_content, .def = "",
       .help = "Chat formats: the message field that holds the text. Empty = content (or value)."},
      {.name = "chat_template", .field = &T::chat_template, .def = "",
       .help = "Chat template: a built-in name (chatml, llama3, mistral, alpaca, gemma), a path to a .jinja file, or Jinja "
               "text. Empty (or tokenizer_default) = the tokenizer's own; alpaca rows without any use alpaca.",
       .value_aliases = {{"tokenizer_default", ""}}},
      {.name = "train_on_inputs", .field = &T::train_on_inputs, .def = "false",
       .help = "Also compute loss on prompt/user tokens and template text (default: only on trained turns)."},
      {.name = "roles_to_train", .field = &T::roles_to_train, .def = "assistant",
       .choices = {"system", "user", "assistant", "tool"},
       .help = "Chat formats: roles whose turns get loss (content through the turn's end token).",
       .value_aliases = {{"gpt", "assistant"}, {"human", "user"}, {"observation", "tool"}}},
      {.name = "skip_bad_rows", .field = &T::skip_bad_rows, .def = "false",
       .help = "Skip (and count) rows with malformed JSON, missing fields or roles the template rejects, "
               "instead of stopping at the first."},
      {.name = "truncation", .field = mode_field<&T::truncation, truncation_name, truncations>(), .def = "truncate_right",
       .help = "What to do with examples longer than max_length; the count is reported at startup."},
      {.name = "packing", .field = &T::packing, .def = "false",
       .help = "Pack several examples into each max_length row (attention never crosses examples)."},
      {.name = "max_length", .field = &T::max_length, .def = "2048", .range = {.lo = 1},
       .help = "Maximum tokens per training row."},
      {.name = "dataset_prepared_path", .field = &T::dataset_prepared_path, .def = "",
       .help = "Folder of the prepared-dataset cache: the tokenized, masked and packed data, written once and reused "
               "while the data files, tokenizer, template and data options are unchanged. Empty = datasets/ under "
               "$QLORA_CACHE_DIR, $XDG_CACHE_HOME/qlora or ~/.cache/qlora; none = prepare every run in memory."},
      {.name = "per_device_train_batch_size", .field = &T::per_device_train_batch_size, .def = "1",
       .range = {.lo = 1}, .help = "Rows per micro-batch on each device."},
      {.name = "per_device_eval_batch_size", .field = &T::per_device_eval_batch_size, .def = "0",
       .range = {.lo = 0}, .help = "Rows per evaluation batch. 0 = per_device_train_batch_size."},
      {.name = "gradient_accumulation_steps", .field = &T::gradient_accumulation_steps, .def = "1",
       .range = {.lo = 1}, .help = "Micro-batches per optimizer step (loss normalized over all their tokens)."},
      {.name = "num_train_epochs", .field = &T::num_train_epochs, .def = "1.0", .range = {.lo = 0, .lo_open = true},
       .help = "Passes over the training data (fractions allowed); ignored when max_steps > 0."},
      {.name = "max_steps", .field = &T::max_steps, .def = "-1", .range = {.lo = -1},
       .help = "Total optimizer steps; -1 = derived from num_train_epochs."},
      {.name = "optim", .field = mode_field<&T::optim, optim_name, optims>(), .def = "adamw_torch",
       .help = "Optimizer. Only AdamW is implemented.",
       .value_aliases = {{"adamw", "adamw_torch"}, {"adamw_hf", "adamw_torch"}, {"torch.optim.AdamW", "adamw_torch"}},
       .bad_value_hint = "only AdamW is implemented: use adamw_torch (or adamw / adamw_torch_fused)"},
      {.name = "learning_rate", .field = &T::learning_rate, .def = "2e-4", .range = {.lo = 0, .lo_open = true},
       .help = "Peak learning rate (after warmup)."},
      {.name = "lr_scheduler_type", .field = mode_field<&T::lr_scheduler_type, lr_scheduler_name, lr_schedulers>(),
       .def = "cosine",
       .help = "Learning-rate schedule, with Hugging Face's formulas.",
       .value_aliases = {{"torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup", "cosine"},
                         {"torchtune.modules.get_cosine_schedule_with_warmup", "cosine"}}},
      {.name = "warmup_ratio", .field = &T::warmup_ratio, .def = "0", .range = {.lo = 0, .hi = 1, .hi_open = true},
       .help = "Warmup as a fraction of total steps: ceil(warmup_ratio * total_steps)."},
      {.name = "warmup_steps", .field = &T::warmup_steps, .def = "0", .range = {.lo = 0},
       .help = "Warmup steps; when > 0 it wins over warmup_ratio."},
      {.name = "weight_decay", .field = &T::weight_decay, .def = "0.0", .range = {.lo = 0},
       .help = "AdamW decoupled weight decay."},
      {.name = "adam_beta1", .field = &T::adam_beta1, .def = "0.9", .range = {.lo = 0, .hi = 1, .hi_open = true},
       .help = "AdamW beta1."},
      {.name = "adam_beta2", .field = &T::adam_beta2, .def = "0.999", .range = {.lo = 0, .hi = 1, .hi_open = true},
       .help = "AdamW beta2."},
      {.name = "adam_epsilon", .field = &T::adam_epsilon, .def = "1e-8", .range = {.lo = 0, .lo_open = true},
       .help = "AdamW epsilon."},
      {.name = "max_grad_norm", .field = &T::max_grad_norm, .def = "1.0", .range = {.lo = 0},
       .help = "Clip the global gradient norm to this; 0 = no clipping.", .null_as = "0"},
      {.name = "nan_policy", .field = mode_field<&T::nan_policy, nan_policy_name, nan_policies>(), .def = "stop",
       .help = "A step whose loss or gradient norm is not finite: stop (name the step and the first "
               "non-finite tensor; the last good state is checkpointed) or skip it (weights untouched, "
               "counted; 10 in a row stop the run)."},
      {.name = "logging_steps", .field = &T::logging_steps, .def = "1", .range = {.lo = 1},
       .help = "Log a line every N optimizer steps (metrics.jsonl gets every step)."},
      {.name = "report_to", .field = mode_field<&T::report_to, report_to_name, report_to_choices>(), .def = "none",
       .help = "Also log every metrics.jsonl value as TensorBoard scalars (train/loss, train/learning_rate, "
               "eval/loss, ...): tensorboard, or all (tensorboard is the one integration built in); none."},
      {.name = "logging_dir", .field = &T::logging_dir, .def = "",
       .help = "Where report_to: tensorboard writes its event file; default output_dir/runs/<date>_<host>, as "
               "transformers does (a resumed run starts a new one)."},
      {.name = "eval_strategy", .field = mode_field<&T::eval_strategy, eval_strategy_name, eval_strategies>(),
       .def = "steps",
       .help = "When to evaluate if eval data exists (and before training): steps = every eval_steps, epoch = at "
               "the end of each epoch (the step that draws its last micro-batch), each also at the end; no = never."},
      {.name = "eval_steps", .field = &T::eval_steps, .def = "0", .range = {.lo = 0},
       .help = "Evaluate every N optimizer steps; 0 = only at the end."},
      {.name = "save_steps", .field = &T::save_steps, .def = "0", .range = {.lo = 0},
       .help = "Write checkpoint-N/ every N optimizer steps; 0 = only at the end."},
      {.name = "save_total_limit", .field = &T::save_total_limit, .def = "0", .range = {.lo = 0},
       .help = "Keep at most this many checkpoints (oldest removed first); 0 = keep all."},
      {.name = "resume_from_checkpoint", .field = &T::resume_from_checkpoint, .def = "",
       .help = "Checkpoint directory to resume from; latest (or true) = newest checkpoint-N in output_dir.",
       .value_aliases = {{"true", "latest"}, {"false", ""}}},
      {.name = "sample_prompts", .field = &T::sample_prompts, .def = "",
       .help = "Prompts (each a user message, rendered with the chat template) the model answers greedily before "
               "training and after it; printed and written to output_dir/samples.json. Empty = none.",
       .list_of_text = true},
      {.name = "sample_max_new_tokens", .field = &T::sample_max_new_tokens, .def = "64", .range = {.lo = 1},
       .help = "Most tokens of each sample answer (generation also stops at EOS / the end-of-turn token)."},
      {.name = "seed", .field = &T::seed, .def = "42", .range = {.lo = 0}, .help = "Seed for LoRA init, shuffling and dropout."},
      {.name = "r", .field = &T::r, .def = "16", .range = {.lo = 1}, .help = "LoRA rank."},
      {.name = "lora_alpha", .field = &T::lora_alpha, .def = "32", .range = {.lo = 0, .lo_open = true},
       .help = "LoRA scaling numerator: scale = lora_alpha / r (or / sqrt(r) with use_rslora)."},
      {.name = "lora_dropout", .field = &T::lora_dropout, .def = "0.05", .range = {.lo = 0, .hi = 1, .hi_open = true},
       .help = "Dropout on the LoRA input."},
      {.name = "target_modules", .field = &T::target_modules, .def = "all-linear",
       .choices = with(kLinear, {"all-linear"}),
       .help = "Linear layers that get LoRA: a list or all-linear (every projection, not lm_head).",
       .value_aliases = {{"all", "all-linear"}}},
      {.name = "target_parameters", .field = &T::target_parameters, .def = "",
       .help = "Stacked expert weights that get LoRA in a mixture-of-experts model, as PEFT's target_parameters: "
               "mlp.experts.gate_up_proj and/or mlp.experts.down_proj (one rank-r pair per expert). Empty = none."},
      {.name = "router_aux_loss_coef", .field = &T::router_aux_loss_coef, .def = "auto",
       .help = "Mixtures of experts: the router's load-balancing loss (transformers' load_balancing_loss_func) "
               "is added to the training loss times this coefficient; 0 = none. auto = the model's own: its "
               "config.json's router_aux_loss_coef when it sets output_router_logits, else none (a GGUF has none).",
       .null_as = "auto"},
      {.name = "use_rslora", .field = &T::use_rslora, .def = "false",
       .help = "Rank-stabilized LoRA: scale = lora_alpha / sqrt(r)."},
      {.name = "rl", .field = mode_field<&T::rl, objective_name, objectives>(), .def = "sft",
       .help = "The objective: sft (supervised, the token loss of the trained tokens), or a preference method on "
               "preference rows: dpo (and its loss_type), orpo, simpo or kto. DPO and KTO compare with the base "
               "model with the adapters off (no second copy).",
       .value_aliases = {{"", "sft"}, {"cpo_simpo", "simpo"}, {"false", "sft"}},
       .bad_value_hint = "use sft, dpo, orpo, simpo or kto (ipo: rl: dpo with loss_type: ipo)"},
      {.name = "loss_type", .field = mode_field<&T::loss_type, dpo_loss_name, dpo_losses>(), .def = "sigmoid",
       .help = "rl: dpo only. sigmoid: -log sigmoid(beta * margin) (with label_smoothing: conservative DPO); "
               "ipo: squared distance of the per-token margin from 1/(2 beta); hinge: max(0, 1 - beta * margin); "
               "robust: the noise-robust sigmoid (label_smoothing = the flip rate)."},
      {.name = "beta", .field = &T::beta, .def = "0.1", .range = {.lo = 0, .lo_open = true},
       .help = "Preference objectives: DPO/KTO's weight of the deviation from the reference, ORPO's lambda on the "
               "odds-ratio term, SimPO's reward scale."},
      {.name = "label_smoothing", .field = &T::label_smoothing, .def = "0", .range = {.lo = 0, .hi = 0.5, .hi_open = true},
       .help = "rl: dpo (loss_type sigmoid or robust) and simpo: the assumed rate of flipped preference labels."},
      {.name = "simpo_gamma", .field = &T::simpo_gamma, .def = "0.5", .range = {.lo = 0},
       .help = "rl: simpo: the target reward margin (gamma)."},
      {.name = "cpo_alpha", .field = &T::cpo_alpha, .def = "0", .range = {.lo = 0},
       .help = "rl: simpo: weight of the NLL of the chosen completions added to the loss (CPO's term; 0 = pure SimPO)."},
      {.name = "desirable_weight", .field = &T::desirable_weight, .def = "1.0", .range = {.lo = 0, .lo_open = true},
       .help = "rl: kto: weight of the desirable rows' loss."},
      {.name = "undesirable_weight", .field = &T::undesirable_weight, .def = "1.0", .range = {.lo = 0, .lo_open = true},
       .help = "rl: kto: weight of the undesirable rows' loss."},
      {.name = "precompute_ref_log_probs", .field = &T::precompute_ref_log_probs, .def = "false",
       .help = "rl: dpo/kto: compute the reference log-probs of every train and eval example once before training "
               "(a forward per example with the adapters off) instead of in every step; kept in "
               "output_dir/reference_logps.json, which a resumed run (or a rerun on the same data) reads back."},
      {.name = "disable_dropout", .field = mode_field<&T::disable_dropout, disable_dropout_name, disable_dropout_choices>(),
       .def = "auto",
       .help = "Train without LoRA dropout: true for every objective, false never; auto (the default) is true "
               "for the preference objectives, as TRL's preference trainers do, and false for SFT.",
       .value_aliases = {{"yes", "true"}, {"no", "false"}, {"on", "true"}, {"off", "false"}}, .null_as = "auto"},
      {.name = "base_precision", .field = &T::base_precision, .def = "",
       .choices = {"", "fp32", "bf16", "fp8", "nf4", "fp4", "nvfp4", "mxfp4"},
       .help = "Storage format of the frozen base weights; empty = as stored in the checkpoint."},
      {.name = "load_in_4bit", .field = &T::load_in_4bit, .def = "false",
       .help = "QLoRA: quantize the base to bnb_4bit_quant_type at load."},
      {.name = "bnb_4bit_quant_type", .field = &T::bnb_4bit_quant_type, .def = "nf4", .choices = {"nf4", "fp4"},
       .help = "4-bit format used by load_in_4bit (bitsandbytes-compatible)."},
      {.name = "bnb_4bit_use_double_quant", .field = &T::bnb_4bit_use_double_quant, .def = "true",
       .help = "Quantize the 4-bit absmax scales again (8-bit, blocks of 256), as QLoRA does."},
      {.name = "quant_blocksize", .field = &T::quant_blocksize, .def = "64",
       .choices = {"32", "64", "128", "256", "512", "1024", "2048", "4096"},
       .help = "Elements per absmax block for nf4/fp4."},
      {.name = "gemm_dtype", .field = mode_field<&T::gemm_dtype, gemm_dtype_name, gemm_dtypes>(), .def = "bf16",
       .help = "Tensor-core dtype of the frozen base's forward GEMMs: fp8 reads a base_precision: fp8 base as "
               "stored (cuBLASLt FP8, sm_89 and later; the activation quantized to e4m3 per tensor); fp4 reads "
               "an nvfp4 or mxfp4 base as stored (cuBLASLt's block-scaled NVFP4 GEMM, compute capability 10.x; "
               "the activation quantized to NVFP4); bf16 dequantizes the base. Any other combination is an "
               "error before the first step. The backward stays bf16."},
      {.name = "gradient_checkpointing",
       .field = mode_field<&T::gradient_checkpointing, checkpointing_name, checkpointing_modes>(), .def = "none",
       .help = "Recompute layer activations in backward: none, full, or offload layer inputs to host memory.",
       .value_aliases = {{"true", "full"}, {"false", "none"}, {"unsloth", "offload"}}},
      {.name = "ce_chunk_size", .field = &T::ce_chunk_size, .def = "1024", .range = {.lo = 1},
       .help = "Tokens per cross-entropy chunk; full fp32 logits are never held."},
      {.name = "mlp_tile_tokens", .field = &T::mlp_tile_tokens, .def = "0", .range = {.lo = 0},
       .help = "With gradient_checkpointing: tokens per tile of the MLP (gate, up, activation, down and their "
               "gradients), so its intermediates are one tile long. 0 = tiles of 8192 tokens when a micro-batch "
               "holds more, else untiled. Needs gradient_checkpointing full or offload."},
      {.name = "attention_dq", .field = &T::attention_dq, .def = "auto", .choices = {"auto", "accumulate", "recompute"},
       .help = "How the CUDA attention backward forms dQ: accumulate sums it in an f32 buffer of every token "
               "(tokens x heads x head_dim x 4 bytes); recompute gives it its own pass, which recomputes the "
               "scores (about 40% more attention-backward work) and needs no such buffer. auto: accumulate "
               "unless the plan does not fit the GPU's free memory with it. The CPU computes dQ directly "
               "either way."},
      {.name = "bf16", .field = &T::bf16, .def = "false",
       .help = "Accepted for compatibility; compute precision follows the device (bf16 on CUDA, fp32 on CPU).",
       .value_aliases = {{"auto", "true"}}},
      {.name = "device", .field = &T::device, .def = "auto", .choices = {"auto", "cpu", "cuda"},
       .help = "Where to train; auto = cuda when a GPU is present.", .value_aliases = {{"gpu", "cuda"}}},
      {.name = "threads", .field = &T::threads, .def = "0", .range = {.lo = 0}, .help = "CPU threads; 0 = all cores."},
      {.name = "sharding", .field = mode_field<&T::sharding, sharding_name, trained_shardings>(), .def = "none",
       .help = "Multi-rank runs: none = every rank holds everything; zero1 = the AdamW moments are split across "
               "ranks (gradients reduce-scattered, weights all-gathered); fsdp = zero1 and each rank also holds "
               "1/N of every decoder layer's frozen base, all-gathered a layer ahead of use. As qlora plan "
               "--sharding plans them.",
       .value_aliases = {{"ddp", "none"}, {"zero-1", "zero1"}},
       .bad_value_hint = "none, zero1 or fsdp; zero2 and zero3 are planned by qlora plan --sharding but not "
                         "implemented in training yet"},
      {.name = "ddp_timeout", .field = &T::ddp_timeout, .def = "1800", .range = {.lo = 0},
       .help = "Multi-rank runs (mpirun, srun): seconds a rank waits for the others in a collective (gradient "
               "all-reduce, barrier) before it stops the job with an error; 0 = wait forever."},
  };
  return rows;
}

// The values a key allows: the row's, or a mode's names.
std::vector<std::string> row_choices(const KeyRow& row) {
  if (const auto* m = std::get_if<ModeField>(&row.field)) return m->names();
  return row.choices;
}

bool takes_text(const KeyRow& row) {  // a string or a mode: a value is text, YAML null is ""
  return std::holds_alternative<std::string TrainConfig::*>(row.field) || std::holds_alternative<ModeField>(row.field);
}

const KeyRow* find_row(const std::string& name) {
  for (const KeyRow& row : key_table())
    if (name == row.name) return &row;
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Aliases. A plain alias renames the key; an expanding one turns one entry into canonical entries.

struct Loc {
  std::string where;  // "cfg.yaml:3:5" or "override 'lr=1'"
  std::string given;  // the key as the user spelled it
};

struct Entry {
  std::string key;  // canonical
  YAML::Node value;
  Loc loc;
};

using Notes = std::vector<std::string>;
using Expand = std::function<std::vector<Entry>(const YAML::Node&, const Loc&, Notes&)>;

struct AliasRow {
  const char* alias;
  const char* canonical;  // for docs, and the target of plain aliases
  Expand expand = nullptr;
};

std::string scalar_text(const YAML::Node& n) { return n.IsScalar() ? n.Scalar() : std::string(); }

Entry make_entry(const std::string& key, const std::string& value, const Loc& loc) {
  return {key, YAML::Node(value), loc};
}

std::vector<Entry> expand_lora_target_linear(const YAML::Node& v, const Loc& loc, Notes& notes) {
  std::string s = ascii_lower(scalar_text(v));
  if (s == "true") {
    notes.push_back("lora_target_linear: true -> target_modules: all-linear");
    return {make_entry("target_modules", "all-linear", loc)};
  }
  if (s == "false" || v.IsNull()) {
    notes.push_back("lora_target_linear: false ignored (set target_modules)");
    return {};
  }
  fail(ErrorKind::Config, loc.where, "lora_target_linear: '" + s + "' is not true/false",
       "use target_modules: all-linear");
}

std::vector<Entry> expand_adapter(const YAML::Node& v, const Loc& loc, Notes& notes) {
  std::string s = ascii_lower(scalar_text(v));
  if (s == "lora") {
    notes.push_back("adapter: lora (the default)");
    return {};
  }
  if (s == "qlora") {
    notes.push_back("adapter: qlora -> load_in_4bit: true");
    return {make_entry("load_in_4bit", "true", loc)};
  }
  fail(ErrorKind::Config, loc.where, "adapter: '" + scalar_text(v) + "' is not supported",
       "use adapter: lora or adapter: qlora (DoRA/full fine-tuning are not implemented)");
}

std::vector<Entry> expand_quantization_bit(const YAML::Node& v, const Loc& loc, Notes& notes) {
  std::string s = scalar_text(v);
  if (s == "4") {
    notes.push_back("quantization_bit: 4 -> load_in_4bit: true");
    return {make_entry("load_in_4bit", "true", loc)};
  }
  fail(ErrorKind::Config, loc.where, "quantization_bit: '" + s + "' is not supported",
       "use quantization_bit: 4 (bitsandbytes 4-bit), or base_precision: fp8 for 8-bit weights");
}

// axolotl: message_property_mappings: {role: from, content: value}
std::vector<Entry> expand_message_property_mappings(const YAML::Node& v, const Loc& loc, Notes& notes) {
  if (!v.IsMap()) fail(ErrorKind::Config, loc.where, loc.given + " must be a map like {role: from, content: value}");
  std::vector<Entry> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    if (k != "role" && k != "content")
      fail(ErrorKind::Config, loc.where, loc.given + ": unsupported key '" + k + "'", "supported: role, content");
    notes.push_back(loc.given + "." + k + " -> message_field_" + k);
    out.push_back({"message_field_" + k, it->second, loc});
  }
  return out;
}

// TRL: completion_only_loss / assistant_only_loss: true == train_on_inputs: false.
std::vector<Entry> expand_only_loss(const YAML::Node& v, const Loc& loc, Notes& notes) {
  const std::string s = ascii_lower(scalar_text(v));
  if (s != "true" && s != "false")
    fail(ErrorKind::Config, loc.where, loc.given + ": '" + scalar_text(v) + "' is not true/false");
  const std::string inv = s == "true" ? "false" : "true";
  notes.push_back(loc.given + ": " + s + " -> train_on_inputs: " + inv);
  return {make_entry("train_on_inputs", inv, loc)};
}

// axolotl: datasets: [{path: data.jsonl, type: alpaca, weight: 2}, ...]. One plain entry sets
// train_file (+ dataset_format); several (or a weight) become dataset_mix entries.
std::vector<Entry> expand_datasets(const YAML::Node& v, const Loc& loc, Notes& notes) {
  if (!v.IsSequence() || v.size() == 0)
    fail(ErrorKind::Config, loc.where, "datasets must be a list of {path: ..., type: ..., weight: ...} entries",
         "or set train_file: data.jsonl and dataset_format: alpaca");
  std::vector<Entry> out;
  std::vector<std::string> mix;
  bool weighted = false;
  for (size_t i = 0; i < v.size(); i++) {
    const YAML::Node& d = v[i];
    const std::string at = "datasets[" + std::to_string(i) + "]";
    if (d.IsScalar() && v.size() == 1) {
      notes.push_back("datasets[0] -> train_file");
      return {{"train_file", d, loc}};
    }
    if (d.IsScalar()) {
      mix.push_back(d.Scalar());
      continue;
    }
    if (!d.IsMap()) fail(ErrorKind::Config, loc.where, at + " must be a map like {path: data.jsonl, type: alpaca}");
    std::string path, type, weight;
    for (auto it = d.begin(); it != d.end(); ++it) {
      std::string k = it->first.as<std::string>();
      Loc sub{loc.where, at + "." + k};
      if (k == "path" || k == "data_files") {
        path = scalar_text(it->second);
      } else if (k == "type") {
        type = scalar_text(it->second);
        for (const auto& [from, to] : find_row("dataset_format")->value_aliases)
          if (ascii_lower(type) == ascii_lower(from)) type = to;
      } else if (k == "weight") {
        weight = scalar_text(it->second);
        char* end = nullptr;
        const double w = std::strtod(weight.c_str(), &end);
        if (weight.empty() || *end != '\0' || !(w > 0) || !std::isfinite(w))
          fail(ErrorKind::Config, loc.where, at + ".weight: '" + weight + "' is not a positive number",
               "weight 2 = every row twice per epoch, 0.5 = a seeded half");
        weighted = true;
      } else if (k == "ds_type") {
        std::string t = ascii_lower(scalar_text(it->second));
        if (t != "json" && t != "jsonl")
          fail(ErrorKind::Config, loc.where, at + ".ds_type: '" + t + "' is not supported", "only JSON / JSONL files are read");
      } else if (k == "field_messages" || k == "roles_to_train" || k == "train_on_inputs") {
        notes.push_back(at + "." + k + " -> " + k + " (applies to every dataset)");
        out.push_back({k, it->second, sub});
      } else if (k == "message_property_mappings") {
        for (Entry& e : expand_message_property_mappings(it->second, sub, notes)) out.push_back(std::move(e));
      } else {
        fail(ErrorKind::Config, loc.where, at + ": unsupported key '" + k + "'",
             "supported: path, type, weight, ds_type: json, field_messages, message_property_mappings, roles_to_train");
      }
    }
    if (path.empty()) fail(ErrorKind::Config, loc.where, at + " has no path");
    if (v.size() == 1 && !weighted) {
      notes.push_back("datasets[0].path -> train_file");
      out.push_back({"train_file", YAML::Node(path), {loc.where, at + ".path"}});
      if (!type.empty()) {
        notes.push_back("datasets[0].type -> dataset_format");
        out.push_back({"dataset_format", d["type"], {loc.where, at + ".type"}});
      }
      return out;
    }
    mix.push_back(path + (weight.empty() ? "" : " weight=" + weight) + (type.empty() ? "" : " format=" + type));
  }
  notes.push_back("datasets -> dataset_mix (" + std::to_string(mix.size()) + " files)");
  YAML::Node list(YAML::NodeType::Sequence);
  for (const std::string& m : mix) list.push_back(m);
  out.push_back({"dataset_mix", list, loc});
  return out;
}

// torchtune: optimizer.betas: [0.9, 0.999]
std::vector<Entry> expand_betas(const YAML::Node& v, const Loc& loc, Notes& notes) {
  if (!v.IsSequence() || v.size() != 2)
    fail(ErrorKind::Config, loc.where, loc.given + " must be a list of two numbers like [0.9, 0.999]");
  notes.push_back(loc.given + " -> adam_beta1, adam_beta2");
  return {{"adam_beta1", v[0], loc}, {"adam_beta2", v[1], loc}};
}

// transformers >= 5 spells warmup_ratio as a fractional warmup_steps.
std::vector<Entry> expand_warmup_steps(const YAML::Node& v, const Loc& loc, Notes& notes) {
  std::string s = scalar_text(v);
  char* end = nullptr;
  double x = s.empty() ? 0 : std::strtod(s.c_str(), &end);
  if (end && *end == '\0' && x > 0 && x < 1) {
    notes.push_back("warmup_steps: " + s + " is a ratio -> warmup_ratio: " + s);
    return {{"warmup_ratio", v, loc}};
  }
  return {{"warmup_steps", v, loc}};
}

// LLaMA-Factory's stage: sft, dpo or kto (reward modelling and PPO are not implemented).
std::vector<Entry> expand_stage(const YAML::Node& v, const Loc& loc, Notes& notes) {
  const std::string s = ascii_lower(scalar_text(v));
  if (s == "sft" || s == "dpo" || s == "kto") {
    notes.push_back("stage: " + s + " -> rl: " + s);
    return {make_entry("rl", s, loc)};
  }
  fail(ErrorKind::Config, loc.where, "stage: '" + scalar_text(v) + "' is not supported",
       "use stage: sft, dpo or kto (pt, rm and ppo are not implemented)");
}

// LLaMA-Factory's pref_loss: sigmoid/hinge/ipo are DPO's loss types; orpo and simpo are methods.
std::vector<Entry> expand_pref_loss(const YAML::Node& v, const Loc& loc, Notes& notes) {
  const std::string s = ascii_lower(scalar_text(v));
  if (s == "sigmoid" || s == "hinge" || s == "ipo") {
    notes.push_back("pref_loss: " + s + " -> loss_type: " + s);
    return {make_entry("loss_type", s, loc)};
  }
  if (s == "orpo" || s == "simpo") {
    notes.push_back("pref_loss: " + s + " -> rl: " + s);
    return {make_entry("rl", s, loc)};
  }
  fail(ErrorKind::Config, loc.where, "pref_loss: '" + scalar_text(v) + "' is not supported",
       "use sigmoid, hinge, ipo (DPO), orpo or simpo; robust: loss_type: robust");
}

// TRL's truncation_mode: keep_start cuts the end of each sequence, keep_end its start.
std::vector<Entry> expand_truncation_mode(const YAML::Node& v, const Loc& loc, Notes& notes) {
  const std::string s = ascii_lower(scalar_text(v));
  const char* to = s == "keep_start" ? "truncate_right" : s == "keep_end" ? "truncate_left" : nullptr;
  if (!to)
    fail(ErrorKind::Config, loc.where, "truncation_mode: '" + scalar_text(v) + "' is not keep_start or keep_end",
         "or set truncation: drop | truncate_left | truncate_right | error");
  notes.push_back("truncation_mode: " + s + " -> truncation: " + to);
  return {make_entry("truncation", to, loc)};
}

// LLaMA-Factory keys that only confirm what qlora does anyway.
Expand accept_only(const char* key, const char* ok, const char* hint) {
  return [=](const YAML::Node& v, const Loc& loc, Notes& notes) -> std::vector<Entry> {
    if (ascii_lower(scalar_text(v)) != ok)
      fail(ErrorKind::Config, loc.where, std::string(key) + ": '" + scalar_text(v) + "' is not supported", hint);
    notes.push_back(std::string(key) + ": " + ok + " (the default)");
    return {};
  };
}

const std::vector<AliasRow>& alias_table() {
  static const std::vector<AliasRow> rows = {
      {"base_model", "model_name_or_path"},
      {"micro_batch_size", "per_device_train_batch_size"},
      {"batch_size", "per_device_train_batch_size"},
      {"num_epochs", "num_train_epochs"},
      {"epochs", "num_train_epochs"},
      {"lr", "learning_rate"},
      {"lr_scheduler", "lr_scheduler_type"},
      {"sequence_len", "max_length"},
      {"cutoff_len", "max_length"},
      {"max_seq_length", "max_length"},
      {"max_seq_len", "max_length"},
      {"lora_r", "r"},
      {"lora_rank", "r"},
      {"lora_target_modules", "target_modules"},
      {"lora_target", "target_modules"},
      {"lora_target_linear", "target_modules", expand_lora_target_linear},
      {"sample_packing", "packing"},
      {"val_size", "val_set_size"},
      {"evaluation_strategy", "eval_strategy"},
      {"optimizer", "optim"},
      {"clip_grad_norm", "max_grad_norm"},
      {"log_every_n_steps", "logging_steps"},
      {"enable_activation_checkpointing", "gradient_checkpointing"},
      {"datasets", "dataset_mix", expand_datasets},
      {"message_property_mappings", "message_field_role", expand_message_property_mappings},
      {"completion_only_loss", "train_on_inputs", expand_only_loss},
      {"assistant_only_loss", "train_on_inputs", expand_only_loss},
      {"train_on_prompt", "train_on_inputs"},
      {"train_on_input", "train_on_inputs"},
      {"dataset_type", "dataset_format"},
      {"adapter", "load_in_4bit", expand_adapter},
      {"quantization_bit", "load_in_4bit", expand_quantization_bit},
      {"quantization_method", "load_in_4bit",
       accept_only("quantization_method", "bitsandbytes", "only bitsandbytes-style 4-bit (nf4/fp4) is implemented")},
      {"finetuning_type", "r",
       accept_only("finetuning_type", "lora", "only LoRA is implemented (freeze/full fine-tuning are not)")},
      // torchtune component fields, as dotted overrides or nested maps
      {"optimizer.lr", "learning_rate"},
      {"optimizer._component_", "optim"},
      {"optimizer.weight_decay", "weight_decay"},
      {"optimizer.eps", "adam_epsilon"},
      {"optimizer.betas", "adam_beta1", expand_betas},
      {"lr_scheduler._component_", "lr_scheduler_type"},
      {"lr_scheduler.num_warmup_steps", "warmup_steps"},
      {"warmup_steps", "warmup_steps", expand_warmup_steps},
      // preference training: axolotl (rl_beta, kto_*_weight), LLaMA-Factory (stage, pref_*), TRL
      {"rl_beta", "beta"},
      {"moe_aux_loss_coef", "router_aux_loss_coef"},  // LLaMA-Factory
      {"pref_beta", "beta"},
      {"dpo_beta", "beta"},
      {"dpo_label_smoothing", "label_smoothing"},
      {"dpo_loss_type", "loss_type"},
      {"kto_desirable_weight", "desirable_weight"},
      {"kto_chosen_weight", "desirable_weight"},
      {"kto_undesirable_weight", "undesirable_weight"},
      {"kto_rejected_weight", "undesirable_weight"},
      {"stage", "rl", expand_stage},
      {"pref_loss", "loss_type", expand_pref_loss},
      {"truncation_mode", "truncation", expand_truncation_mode},
  };
  return rows;
}

const AliasRow* find_alias(const std::string& name) {
  for (const AliasRow& a : alias_table())
    if (name == a.alias) return &a;
  return nullptr;
}

// Optimal string alignment distance: a transposition counts as one typo.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  size_t limit = std::clamp<size_t>(word.size() / 4, 1, 4);
  return best_d <= limit ? best : std::string();
}

// ---------------------------------------------------------------------------------------------
// Conversion of one value into one field.

std::string fmt_double(double x) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, res.ptr);
  return s;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + (v[i].empty() ? std::string("\"\"") : v[i]);
  return s;
}


std::string range_text(const Range& r) {
  std::string lo = std::isinf(r.lo) ? "" : (r.lo_open ? "> " : ">= ") + fmt_double(r.lo);
  std::string hi = std::isinf(r.hi) ? "" : (r.hi_open ? "< " : "<= ") + fmt_double(r.hi);
  if (!lo.empty() && !hi.empty()) return lo + " and " + hi;
  return lo + hi;
}

struct Setter {
  const KeyRow& row;
  const Loc& loc;
  Notes& notes;

  [[noreturn]] void bad(const std::string& what, const std::string& hint) const {
    std::string key = "'" + std::string(row.name) + "'";
    if (loc.given != row.name) key += " (given as '" + loc.given + "')";
    fail(ErrorKind::Config, loc.where, "key " + key + ": " + what, hint);
  }

  std::string allowed_hint(const std::string& value) const {
    if (*row.bad_value_hint) return row.bad_value_hint;
    const std::vector<std::string> choices = row_choices(row);
    std::string hint = "allowed: " + join(choices, ", ");
    std::string near = closest(value, choices);
    if (!near.empty()) hint = "did you mean '" + near + "'? " + hint;
    return hint;
  }

  // Maps a value alias to its canonical spelling and checks it against the choices.
  std::string canonical_value(const std::string& raw) const {
    std::string v = raw;
    for (const auto& [from, to] : row.value_aliases)
      if (ascii_lower(raw) == ascii_lower(from)) {
        notes.push_back(std::string(row.name) + ": " + raw + " -> " + (to.empty() ? "\"\"" : to));
        v = to;
      }
    const std::vector<std::string> choices = row_choices(row);
    if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
      bad("'" + raw + "' is not allowed", allowed_hint(raw));
    return v;
  }

  std::string scalar(const YAML::Node& n, const char* expected) const {
    if (!n.IsScalar()) bad(std::string("expected ") + expected + ", got a " + (n.IsMap() ? "map" : "list"),
                           "write it as key: value");
    return trim(n.Scalar());
  }

  void check_range(double x, const std::string& text) const {
    const Range& r = row.range;
    bool low = r.lo_open ? x <= r.lo : x < r.lo;
    bool high = r.hi_open ? x >= r.hi : x > r.hi;
    if (low || high) bad(text + " is out of range", "must be " + range_text(r));
  }

  void operator()(std::string TrainConfig::*f, TrainConfig& c, const YAML::Node& n) const {
    c.*f = canonical_value(n.IsNull() ? std::string() : scalar(n, "a string"));
  }

  void operator()(const ModeField& f, TrainConfig& c, const YAML::Node& n) const {
    f.set(c, canonical_value(n.IsNull() ? std::string() : scalar(n, "a string")));
  }

  void operator()(int64_t TrainConfig::*f, TrainConfig& c, const YAML::Node& n) const {
    std::string s = scalar(n, "an integer");
    int64_t x = 0;
    auto res = std::from_chars(s.data() + (s.size() && s[0] == '+'), s.data() + s.size(), x);
    if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size())
      bad("'" + s + "' is not an integer", "write a whole number like 8");
    if (!row.choices.empty()) canonical_value(std::to_string(x));
    check_range(double(x), s);
    c.*f = x;
  }

  void operator()(double TrainConfig::*f, TrainConfig& c, const YAML::Node& n) const {
    std::string s = scalar(n, "a number");
    char* end = nullptr;
    double x = s.empty() ? 0 : std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(x))
      bad("'" + s + "' is not a number", "write a number like 2e-4 or 0.05");
    check_range(x, s);
    c.*f = x;
  }

  void operator()(bool TrainConfig::*f, TrainConfig& c, const YAML::Node& n) const {
    std::string s = scalar(n, "true or false");
    for (const auto& [from, to] : row.value_aliases)
      if (ascii_lower(s) == ascii_lower(from)) {
        notes.push_back(std::string(row.name) + ": " + s + " -> " + to);
        s = to;
      }
    std::string l = ascii_lower(s);
    if (l == "true" || l == "yes" || l == "on") c.*f = true;
    else if (l == "false" || l == "no" || l == "off") c.*f = false;
    else bad("'" + s + "' is not a boolean", "write true or false");
  }

  void operator()(std::vector<std::string> TrainConfig::*f, TrainConfig& c, const YAML::Node& n) const {
    std::vector<std::string> items;
    if (n.IsSequence()) {
      for (const YAML::Node& e : n) items.push_back(scalar(e, row.list_of_text ? "a list of texts" : "a list of names"));
    } else if (n.IsScalar() && row.list_of_text) {
      if (!trim(n.Scalar()).empty()) items.push_back(trim(n.Scalar()));
    } else if (n.IsScalar()) {
      // LLaMA-Factory style "q_proj,v_proj"
      items = split_commas(n.Scalar());
    } else if (!n.IsNull()) {
      bad("expected a list, got a map", "write [a, b] or a, b");
    }
    for (std::string& it : items) it = canonical_value(it);
    c.*f = items;
  }
};

void set_field(TrainConfig& c, const KeyRow& row, YAML::Node value, const Loc& loc, Notes& notes) {
  if (value.IsNull() && row.null_as) value = YAML::Node(std::string(row.null_as));
  if (value.IsNull() && !takes_text(row) && !std::holds_alternative<std::vector<std::string> TrainConfig::*>(row.field))
    Setter{row, loc, notes}.bad("has no value", std::string("expected ") + kTypeNames[row.field.index()]);
  Setter s{row, loc, notes};
  std::visit([&](auto f) { s(f, c, value); }, row.field);
}

// ---------------------------------------------------------------------------------------------
// Collecting entries from the file and the overrides.

std::string mark_where(const std::string& origin, const YAML::Mark& m) {
  return origin + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

std::vector<std::string> all_key_names() {
  std::vector<std::string> names;
  for (const KeyRow& r : key_table()) names.push_back(r.name);
  for (const AliasRow& a : alias_table()) names.push_back(a.alias);
  return names;
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& where) {
  std::string near = suggest_config_key(key);
  fail(ErrorKind::Config, where, "unknown key '" + key + "'",
       near.empty() ? "run `qlora train --help-config` for the list of keys" : "did you mean '" + near + "'?");
}

// Resolves aliases (recursively through expansions) into canonical entries.
void resolve(const std::string& key, const YAML::Node& value, const Loc& loc, Notes& notes,
             std::vector<Entry>& out) {
  if (value.IsNull()) {
    // An empty value keeps the default (axolotl configs list unset keys that way), unless null
    // means something for that key (torchtune clip_grad_norm: null = no clipping).
    const AliasRow* a = find_alias(key);
    const KeyRow* row = find_row(a && !a->expand ? a->canonical : key);
    if (!a && !row) unknown_key(key, loc.where);
    if (!row || !row->null_as || (a && a->expand)) return;
  }
  // torchtune nests component fields: optimizer: {_component_: ..., lr: ...}
  if (value.IsMap() && (key == "optimizer" || key == "lr_scheduler")) {
    for (auto it = value.begin(); it != value.end(); ++it)
      resolve(key + "." + it->first.as<std::string>(), it->second, {loc.where, key + "." + it->first.as<std::string>()},
              notes, out);
    return;
  }
  if (const AliasRow* a = find_alias(key)) {
    if (a->expand) {
      for (Entry& e : a->expand(value, loc, notes)) out.push_back(std::move(e));
    } else {
      notes.push_back(key + " -> " + a->canonical);
      out.push_back({a->canonical, value, loc});
    }
    return;
  }
  if (!find_row(key)) unknown_key(key, loc.where);
  out.push_back({key, value, loc});
}

YAML::Node parse_yaml_text(const std::string& text, const std::string& origin) {
  auto reject = [&](size_t bad, const char* what, const char* hint) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < bad; i++) text[i] == '\n' ? (line++, col = 1) : col++;
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(text[bad]));
    fail(ErrorKind::Config, origin + ":" + std::to_string(line) + ":" + std::to_string(col),
         std::string(what) + " (byte " + byte + ")", hint);
  };
  // YAML is UTF-8 text; yaml-cpp would pass other bytes through into paths and names.
  if (size_t bad = 0; !unicode::is_valid_utf8(text, &bad)) reject(bad, "invalid UTF-8", "save the file as UTF-8");
  // YAML streams hold printable characters only (YAML 1.2, 5.1 c-printable): of the C0 controls
  // just tab, line feed and carriage return. A NUL or \x01 would otherwise end up inside a path.
  for (size_t i = 0; i < text.size(); i++) {
    const unsigned char ch = static_cast<unsigned char>(text[i]);
    if ((ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') || ch == 0x7f)
      reject(i, "a control character, which YAML does not allow", "remove it");
  }
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    fail(ErrorKind::Config, mark_where(origin, e.mark), "YAML syntax error: " + e.msg,
         "check indentation and that every key is followed by ': '");
  }
}

bool same_value(const YAML::Node& a, const YAML::Node& b) {
  if (a.IsScalar() && b.IsScalar()) return ascii_lower(trim(a.Scalar())) == ascii_lower(trim(b.Scalar()));
  if (a.IsSequence() && b.IsSequence() && a.size() == b.size()) {
    for (size_t i = 0; i < a.size(); ++i)
      if (!same_value(a[i], b[i])) return false;
    return true;
  }
  return false;
}

std::vector<Entry> file_entries(const YAML::Node& root, const std::string& origin, Notes& notes) {
  std::vector<Entry> out;
  if (!root || root.IsNull()) return out;
  if (!root.IsMap())
    fail(ErrorKind::Config, mark_where(origin, root.Mark()), "the config must be a YAML map of key: value",
         "for example `learning_rate: 2e-4` on its own line");
  struct Seen {
    Loc loc;
    YAML::Node value;
  };
  std::map<std::string, Seen> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (!it->first.IsScalar())
      fail(ErrorKind::Config, mark_where(origin, it->first.Mark()), "keys must be plain names");
    std::string key = it->first.Scalar();
    Loc loc{mark_where(origin, it->second.IsNull() ? it->first.Mark() : it->second.Mark()), key};
    std::vector<Entry> resolved;
    try {
      resolve(key, it->second, loc, notes, resolved);
    } catch (const Error& e) {
      // unknown keys point at the key, not its value
      if (e.message().rfind("unknown key", 0) == 0)
        fail(e.kind(), mark_where(origin, it->first.Mark()), e.message(), e.hint());
      throw;
    }
    for (Entry& e : resolved) {
      auto [prev, fresh] = seen.emplace(e.key, Seen{e.loc, e.value});
      // `adapter: qlora` next to `load_in_4bit: true` says the same thing twice; that is fine
      if (!fresh && same_value(prev->second.value, e.value)) continue;
      if (!fresh)
        fail(ErrorKind::Config, e.loc.where,
             "'" + e.loc.given + "' sets '" + e.key + "', already set by '" + prev->second.loc.given + "' at " +
                 prev->second.loc.where + " to a different value",
             "keep only one of them");
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::vector<Entry> override_entries(const std::vector<std::string>& overrides, Notes& notes) {
  std::vector<Entry> out;
  for (const std::string& raw : overrides) {
    std::string ov = raw.rfind("--", 0) == 0 ? raw.substr(2) : raw;
    size_t eq = ov.find('=');
    std::string where = "override '" + raw + "'";
    if (eq == std::string::npos || eq == 0)
      fail(ErrorKind::Config, where, "overrides are key=value", "for example learning_rate=1e-4");
    std::string key = trim(ov.substr(0, eq)), text = trim(ov.substr(eq + 1));
    // Strings are taken verbatim (chat templates and paths are not YAML); the rest parse as YAML
    // so that lists like [q_proj,v_proj] work.
    std::string target = key;
    if (const AliasRow* a = find_alias(key); a && !a->expand) target = a->canonical;
    const KeyRow* row = find_row(target);
    YAML::Node value;
    if (row && takes_text(*row)) {
      value = YAML::Node(text);
    } else if (text.empty()) {
      value = YAML::Node(YAML::NodeType::Null);
    } else {
      value = parse_yaml_text(text, where);
    }
    resolve(key, value, {where, key}, notes, out);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Cross-field checks and derived values, after every entry is applied.

std::optional<double> parse_router_aux_loss_coef(const std::string& v, const std::string& where) {
  if (v == "auto" || v.empty()) return std::nullopt;
  double x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(x) || x < 0)
    fail(ErrorKind::Config, where, "router_aux_loss_coef '" + v + "' is not auto or a number >= 0",
         "e.g. router_aux_loss_coef: 0.001 (Qwen3-MoE's and gpt-oss's own), 0.02 (Mixtral's), 0 for none");
  return x;
}

// Whether c holds the key table's default for key (the one place defaults are written).
bool at_default(const TrainConfig& c, const char* key) {
  const KeyRow& row = *find_row(key);
  TrainConfig d = c;
  Notes ignored;
  set_field(d, row, YAML::Node(std::string(row.def)), {"default of " + std::string(row.name), row.name}, ignored);
  return d == c;
}

void finalize(TrainConfig& c, const std::map<std::string, Loc>& set_at, Notes& notes, bool require_inputs) {
  auto where = [&](const std::string& key) {
    auto it = set_at.find(key);
    return it != set_at.end() ? it->second.where : "config key '" + key + "'";
  };
  auto is_set = [&](const std::string& key) { return set_at.count(key) > 0; };

  if (require_inputs && c.model_name_or_path.empty())
    fail(ErrorKind::Config, "config key 'model_name_or_path'", "model_name_or_path is required",
         "set model_name_or_path: path/to/hf_model_dir (axolotl: base_model)");
  if (require_inputs && c.train_file.empty() && c.dataset_mix.empty())
    fail(ErrorKind::Config, "config key 'train_file'", "train_file is required",
         "set train_file: data.jsonl (axolotl: datasets: [{path: data.jsonl, type: alpaca}])");
  if (!c.train_file.empty() && !c.dataset_mix.empty())
    fail(ErrorKind::Config, where("dataset_mix"), "both train_file and dataset_mix (datasets) are set",
         "list every training file in dataset_mix / datasets, or use train_file alone");

  if (c.per_device_eval_batch_size == 0) c.per_device_eval_batch_size = c.per_device_train_batch_size;

  // target_modules: explicit names in Llama order, all-linear expanded
  auto& tm = c.target_modules;
  bool all = std::find(tm.begin(), tm.end(), "all-linear") != tm.end();
  if (tm.empty() && c.target_parameters.empty())  // LoRA on the experts alone leaves it empty (PEFT: null)
    fail(ErrorKind::Config, where("target_modules"), "target_modules is empty",
         "list modules like [q_proj, v_proj] or use all-linear");
  if (all && tm.size() > 1)
    fail(ErrorKind::Config, where("target_modules"), "all-linear cannot be combined with other modules",
         "use either all-linear or a list of modules");
  std::vector<std::string> ordered;
  for (const std::string& m : kLinear)
    if (all || std::find(tm.begin(), tm.end(), m) != tm.end()) ordered.push_back(m);
  tm = ordered;

  if (c.val_set_size >= 1 && c.val_set_size != std::floor(c.val_set_size))
    fail(ErrorKind::Config, where("val_set_size"), "val_set_size " + fmt_double(c.val_set_size) +
         " is neither a fraction below 1 nor a whole row count", "use e.g. 0.05 or 200");
  if (c.val_set_size > 0 && !c.eval_file.empty())
    fail(ErrorKind::Config, where("val_set_size"), "both eval_file and val_set_size are set",
         "use eval_file for a separate file, or val_set_size to split train_file, not both");
  for (size_t i = 0; i < c.sample_prompts.size(); i++)
    if (c.sample_prompts[i].empty())
      fail(ErrorKind::Config, where("sample_prompts"), "sample_prompts entry " + std::to_string(i + 1) + " is empty",
           "remove it, or write the question the model should answer");
  if (c.max_steps == 0)
    fail(ErrorKind::Config, where("max_steps"), "max_steps 0 would train nothing",
         "use -1 to derive steps from num_train_epochs, or a positive count");

  parse_router_aux_loss_coef(c.router_aux_loss_coef, where("router_aux_loss_coef"));  // auto or a number >= 0

  // Base precision and bitsandbytes-style 4-bit flags must describe one format.
  bool bp_4bit = c.base_precision == "nf4" || c.base_precision == "fp4";
  if (bp_4bit && !c.load_in_4bit) {
    if (is_set("bnb_4bit_quant_type") && c.bnb_4bit_quant_type != c.base_precision)
      fail(ErrorKind::Config, where("bnb_4bit_quant_type"),
           "base_precision " + c.base_precision + " conflicts with bnb_4bit_quant_type " + c.bnb_4bit_quant_type,
           "set only one of them");
    c.load_in_4bit = true;
    c.bnb_4bit_quant_type = c.base_precision;
    notes.push_back("base_precision: " + c.base_precision + " -> load_in_4bit: true");
  } else if (c.load_in_4bit) {
    if (!c.base_precision.empty() && c.base_precision != c.bnb_4bit_quant_type)
      fail(ErrorKind::Config, where("base_precision"),
           "load_in_4bit quantizes the base to " + c.bnb_4bit_quant_type + ", but base_precision is " +
               c.base_precision,
           "drop load_in_4bit (and adapter: qlora / quantization_bit) to keep " + c.base_precision +
               ", or drop base_precision");
    if (c.base_precision.empty())
      notes.push_back("load_in_4bit: base_precision -> " + c.bnb_4bit_quant_type);
    c.base_precision = c.bnb_4bit_quant_type;
    if (!is_set("bnb_4bit_use_double_quant"))
      notes.push_back("load_in_4bit: bnb_4bit_use_double_quant defaults to true (QLoRA)");
  }

  // Preference keys only where the objective uses them: a value that would change nothing is refused.
  {
    const Objective o = c.rl;
    const std::string m = objective_name(o);
    auto only_for = [&](const char* key, bool applies, const std::string& who) {
      if (!applies && !at_default(c, key))
        fail(ErrorKind::Config, where(key), std::string(key) + " applies to " + who + ", not to rl: " + m,
             std::string("remove ") + key + " or set rl accordingly");
    };
    const bool pref = is_preference(o);
    const bool dpo_smoothed = o == Objective::Dpo && (c.loss_type == DpoLoss::Sigmoid || c.loss_type == DpoLoss::Robust);
    only_for("loss_type", o == Objective::Dpo, "rl: dpo");
    only_for("beta", pref, "the preference objectives (rl: dpo, orpo, simpo, kto)");
    only_for("label_smoothing", dpo_smoothed || o == Objective::Simpo,
             "rl: dpo with loss_type sigmoid or robust, and rl: simpo");
    only_for("simpo_gamma", o == Objective::Simpo, "rl: simpo");
    only_for("cpo_alpha", o == Objective::Simpo, "rl: simpo");
    only_for("desirable_weight", o == Objective::Kto, "rl: kto");
    only_for("undesirable_weight", o == Objective::Kto, "rl: kto");
    only_for("precompute_ref_log_probs", uses_reference(o), "rl: dpo and kto (the objectives with a reference)");
    if (o == Objective::Kto && c.per_device_train_batch_size < 2)
      fail(ErrorKind::Config, where("per_device_train_batch_size"),
           "rl: kto needs per_device_train_batch_size of at least 2: each row's KL probe pairs its prompt with "
           "another row's completion of the same batch",
           "set per_device_train_batch_size: 2 or more (TRL refuses 1 too)");
    if (pref && c.packing)
      fail(ErrorKind::Config, where("packing"), "packing is not implemented for rl: " + m,
           "remove packing: each preference row already holds its completions back to back, unpadded");
    if (pref && c.train_on_inputs)
      fail(ErrorKind::Config, where("train_on_inputs"), "train_on_inputs does not apply to rl: " + m,
           "preference objectives score the completions only; remove train_on_inputs");
  }

  if (c.warmup_steps > 0 && c.warmup_ratio > 0)
    notes.push_back("warmup_steps " + std::to_string(c.warmup_steps) + " wins over warmup_ratio " +
                    fmt_double(c.warmup_ratio));
  if (c.lr_scheduler_type == LrScheduler::Constant && (c.warmup_steps > 0 || c.warmup_ratio > 0))
    notes.push_back("lr_scheduler_type constant ignores warmup (use constant_with_warmup)");
}

// Table defaults before derivation: eval batch size 0 and target_modules all-linear still unresolved.
void apply_table_defaults(TrainConfig& c) {
  Notes ignored;
  for (const KeyRow& row : key_table())
    set_field(c, row, YAML::Node(std::string(row.def)), {"default of " + std::string(row.name), row.name}, ignored);
}

TrainConfig build(const YAML::Node& root, const std::string& origin, const std::vector<std::string>& overrides,
                  Notes* notes_out, bool require_inputs) {
  Notes notes;
  std::vector<Entry> entries = file_entries(root, origin, notes);
  for (Entry& e : override_entries(overrides, notes)) entries.push_back(std::move(e));
  TrainConfig c;
  apply_table_defaults(c);
  std::map<std::string, Loc> set_at;
  for (const Entry& e : entries) {
    set_field(c, *find_row(e.key), e.value, e.loc, notes);
    set_at[e.key] = e.loc;
  }
  finalize(c, set_at, notes, require_inputs);
  if (notes_out) notes_out->insert(notes_out->end(), notes.begin(), notes.end());
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TrainConfig::TrainConfig() {
  Notes ignored;
  apply_table_defaults(*this);
  finalize(*this, {}, ignored, false);
}

void finalize_train_config(TrainConfig& cfg, std::vector<std::string>* notes) {
  Notes local;
  finalize(cfg, {}, notes ? *notes : local, false);
}

TrainConfig parse_train_config(const std::string& yaml_text, const std::string& origin,
                               const std::vector<std::string>& overrides, std::vector<std::string>* notes,
                               bool require_train_inputs) {
  return build(parse_yaml_text(yaml_text, origin), origin, overrides, notes, require_train_inputs);
}

TrainConfig load_train_config(const std::string& yaml_path, const std::vector<std::string>& overrides,
                              std::vector<std::string>* notes, bool require_train_inputs) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(yaml_path, ec))
    fail(ErrorKind::Io, yaml_path, "config file not found",
         "pass the path of a YAML file, e.g. qlora train examples/smollm2_qlora.yaml");
  std::ifstream in(yaml_path, std::ios::binary);
  if (!in) fail(ErrorKind::Io, yaml_path, "cannot read config file", "check its permissions");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_train_config(ss.str(), yaml_path, overrides, notes, require_train_inputs);
}

std::string dump_train_config(const TrainConfig& c) {
  YAML::Emitter out;
  out << YAML::Comment("effective qlora training config (every key, defaults included)") << YAML::Newline;
  out << YAML::BeginMap;
  for (const KeyRow& row : key_table()) {
    out << YAML::Key << row.name << YAML::Value;
    std::visit(
        [&](auto f) {
          using F = decltype(f);
          if constexpr (std::is_same_v<F, double TrainConfig::*>) out << fmt_double(c.*f);
          else if constexpr (std::is_same_v<F, std::vector<std::string> TrainConfig::*>)
            out << YAML::Flow << c.*f;
          else if constexpr (std::is_same_v<F, std::string TrainConfig::*>) out << YAML::DoubleQuoted << c.*f;
          else if constexpr (std::is_same_v<F, ModeField>) out << YAML::DoubleQuoted << f.get(c);
          else out << c.*f;
        },
        row.field);
  }
  out << YAML::EndMap;
  return std::string(out.c_str(), out.size()) + "\n";  // a value may hold a NUL (a "\0" escape)
}

std::vector<ConfigKeyDoc> config_key_docs() {
  std::vector<ConfigKeyDoc> docs;
  for (const KeyRow& row : key_table()) {
    ConfigKeyDoc d{row.name, kTypeNames[row.field.index()], row.def, "", row.help, {}};
    if (!row_choices(row).empty()) d.allowed = join(row_choices(row), ", ");
    else if (!std::isinf(row.range.lo) || !std::isinf(row.range.hi)) d.allowed = range_text(row.range);
    for (const auto& [from, to] : row.value_aliases)
      d.allowed += std::string(d.allowed.empty() ? "" : "; ") + from + " = " + (to.empty() ? "\"\"" : to);
    for (const AliasRow& a : alias_table())
      if (a.canonical == d.name && a.alias != d.name) d.aliases.push_back(a.alias);
    docs.push_back(std::move(d));
  }
  return docs;
}

std::string config_reference_markdown() {
  std::string md = "| key | type | default | allowed | description | aliases |\n|---|---|---|---|---|---|\n";
  auto cell = [](std::string s) {
    std::string out;
    for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return out;
  };
  for (const ConfigKeyDoc& d : config_key_docs()) {
    std::string aliases;
    for (const std::string& a : d.aliases) aliases += (aliases.empty() ? "`" : ", `") + a + "`";
    md += "| `" + d.name + "` | " + d.type + " | " + (d.default_value.empty() ? "\"\"" : "`" + d.default_value + "`") +
          " | " + cell(d.allowed) + " | " + cell(d.help) + " | " + aliases + " |\n";
  }
  md += "\nAlso accepted: `adapter: lora|qlora` (qlora = `load_in_4bit: true`), `quantization_bit: 4`, "
        "`lora_target_linear: true` (= `target_modules: all-linear`), axolotl `datasets: [{path, type, weight}]` "
        "(one entry = train_file, several = dataset_mix), `message_property_mappings: {role, content}`, TRL "
        "`completion_only_loss` / `assistant_only_loss` (= `train_on_inputs: false`), torchtune `optimizer.*` / `lr_scheduler.*` fields, and `warmup_steps` below 1 as a ratio.\n";
  return md;
}

std::string suggest_config_key(const std::string& key) { return closest(key, all_key_names()); }

bool reports_to_tensorboard(const TrainConfig& cfg) { return writes_tensorboard(cfg.report_to); }

std::optional<double> router_aux_loss_coef_value(const TrainConfig& c) {
  return parse_router_aux_loss_coef(c.router_aux_loss_coef, "config key 'router_aux_loss_coef'");
}

}  // namespace qlora
