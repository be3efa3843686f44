// Learning-rate schedules: the lambdas of transformers' get_*_schedule_with_warmup, step for step.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "train/train_config.h"

namespace qlora {

double lr_lambda(const ScheduleParams& p, int64_t step) {
  const double s = double(step), w = double(p.warmup_steps), n = double(p.total_steps);
  if (p.type == LrScheduler::Constant) return 1.0;
  // HF divides by max(1, warmup): a warmup of 0 never reaches this branch, a warmup of 1 starts at 0.
  if (step < p.warmup_steps) return s / std::max(1.0, w);
  switch (p.type) {
    case LrScheduler::Constant:
    case LrScheduler::ConstantWithWarmup: return 1.0;
    case LrScheduler::Linear: return std::max(0.0, (n - s) / std::max(1.0, n - w));
    case LrScheduler::Cosine: {
      const double progress = (s - w) / std::max(1.0, n - w);
      return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * p.num_cycles * 2.0 * progress)));
    }
  }
  return 1.0;
}

double lr_at(const ScheduleParams& p, int64_t step) { return p.base_lr * lr_lambda(p, step); }

int64_t warmup_steps_for(const TrainConfig& cfg, int64_t total_steps) {
  if (cfg.warmup_steps > 0) return cfg.warmup_steps;
  return int64_t(std::ceil(double(total_steps) * cfg.warmup_ratio));
}

int64_t total_optimizer_steps(const TrainConfig& cfg, int64_t micro_batches_per_epoch, int64_t world) {
  if (cfg.max_steps > 0) return cfg.max_steps;
  if (micro_batches_per_epoch <= 0)
    fail(ErrorKind::Data, "train_file '" + cfg.train_file + "'", "the training set yields no batches",
         "check that the file has rows that survive max_length/truncation");
  const int64_t ga = cfg.gradient_accumulation_steps * std::max<int64_t>(world, 1);
  const int64_t per_epoch = std::max<int64_t>((micro_batches_per_epoch + ga - 1) / ga, 1);
  return int64_t(std::ceil(cfg.num_train_epochs * double(per_epoch)));
}

ScheduleParams schedule_from_config(const TrainConfig& cfg, int64_t total_steps) {
  ScheduleParams p;
  p.type = cfg.lr_scheduler_type;
  p.base_lr = cfg.learning_rate;
  p.total_steps = total_steps;
  p.warmup_steps = warmup_steps_for(cfg, total_steps);
  return p;
}

double lr_at(const TrainConfig& cfg, int64_t total_steps, int64_t step) {
  return lr_at(schedule_from_config(cfg, total_steps), step);
}

}  // namespace qlora
