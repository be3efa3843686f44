// The config key table: one row per TrainConfig key.
#include "train/config_keys.h"

namespace qlora::train_keys {
namespace {


std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

const std::vector<std::string>& linear_modules() {
  static const std::vector<std::string> v = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return v;
}

// The single source of truth for keys.
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
      {.name = "dataset_format", .field = mode_field<&T::dataset_format, format_name, config_dataset_formats>(),
       .def = "auto",
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
      {.name = "finetuning_type", .field = mode_field<&T::finetuning_type, finetuning_type_name, finetuning_types>(),
       .def = "lora",
       .help = "lora: LoRA adapters on the frozen base (QLoRA with a quantized base); full: every weight trained "
               "(embeddings, norms, attention, MLP, LM head) with AdamW, written as a Hugging Face model directory.",
       .bad_value_hint = "use lora or full (freeze, training a chosen subset of layers, is not implemented)"},
      {.name = "r", .field = &T::r, .def = "16", .range = {.lo = 1}, .help = "LoRA rank."},
      {.name = "lora_alpha", .field = &T::lora_alpha, .def = "32", .range = {.lo = 0, .lo_open = true},
       .help = "LoRA scaling numerator: scale = lora_alpha / r (or / sqrt(r) with use_rslora)."},
      {.name = "lora_dropout", .field = &T::lora_dropout, .def = "0.05", .range = {.lo = 0, .hi = 1, .hi_open = true},
       .help = "Dropout on the LoRA input."},
      {.name = "target_modules", .field = &T::target_modules, .def = "all-linear",
       .choices = with(linear_modules(), {"all-linear"}),
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
      {.name = "base_precision", .field = mode_field<&T::base_precision, base_storage_name, base_storages>(), .def = "",
       .help = "Storage format of the frozen base weights; empty = as stored in the checkpoint."},
      {.name = "load_in_4bit", .field = &T::load_in_4bit, .def = "false",
       .help = "QLoRA: quantize the base to bnb_4bit_quant_type at load."},
      {.name = "bnb_4bit_quant_type", .field = mode_field<&T::bnb_4bit_quant_type, base_precision_name, bnb_4bit_formats>(),
       .def = "nf4",
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
      {.name = "attention_dq", .field = mode_field<&T::attention_dq, attn_dq_choice_name, attn_dq_choices>(), .def = "auto",
       .help = "How the CUDA attention backward forms dQ: accumulate sums it in an f32 buffer of every token "
               "(tokens x heads x head_dim x 4 bytes); recompute gives it its own pass, which recomputes the "
               "scores (about 40% more attention-backward work) and needs no such buffer. auto: accumulate "
               "unless the plan does not fit the GPU's free memory with it. The CPU computes dQ directly "
               "either way."},
      {.name = "bf16", .field = &T::bf16, .def = "false",
       .help = "Accepted for compatibility; compute precision follows the device (bf16 on CUDA, fp32 on CPU).",
       .value_aliases = {{"auto", "true"}}},
      {.name = "device", .field = mode_field<&T::device, device_choice_name, device_choices>(), .def = "auto",
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

std::vector<std::string> row_choices(const KeyRow& row) {
  if (const auto* m = std::get_if<ModeField>(&row.field)) return m->names();
  return row.choices;
}

bool takes_text(const KeyRow& row) {
  return std::holds_alternative<std::string TrainConfig::*>(row.field) || std::holds_alternative<ModeField>(row.field);
}

const KeyRow* find_row(const std::string& name) {
  for (const KeyRow& row : key_table())
    if (name == row.name) return &row;
  return nullptr;
}

}  // namespace qlora::train_keys
