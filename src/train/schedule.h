// Learning-rate schedules with Hugging Face's formulas, and the step counts they depend on.
#pragma once
#include <cstdint>
#include <string>

#include "train/train_modes.h"

namespace qlora {

struct TrainConfig;

struct ScheduleParams {
  LrScheduler type = LrScheduler::Cosine;
  double base_lr = 2e-4;
  int64_t warmup_steps = 0;  // already resolved (see warmup_steps_for)
  int64_t total_steps = 1;   // optimizer steps of the whole run
  double num_cycles = 0.5;   // cosine only: 0.5 = one half-wave down to 0
};

// LambdaLR multiplier for 0-based optimizer step `step` (the LR used by that step is base_lr * it).
double lr_lambda(const ScheduleParams& p, int64_t step);
double lr_at(const ScheduleParams& p, int64_t step);

// HF TrainingArguments.get_warmup_steps: warmup_steps when > 0, else ceil(warmup_ratio * total).
int64_t warmup_steps_for(const TrainConfig& cfg, int64_t total_steps);

// Optimizer steps of the run, as HF Trainer counts them: max_steps when > 0, else
// ceil(num_train_epochs * max(ceil(micro_batches_per_epoch / (gradient_accumulation_steps * world)), 1)):
// a step of `world` data-parallel ranks consumes world times the micro-batches of one process.
int64_t total_optimizer_steps(const TrainConfig& cfg, int64_t micro_batches_per_epoch, int64_t world = 1);

ScheduleParams schedule_from_config(const TrainConfig& cfg, int64_t total_steps);
double lr_at(const TrainConfig& cfg, int64_t total_steps, int64_t step);

}  // namespace qlora
