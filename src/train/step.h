// One optimizer step over a list of micro-batches: accumulate, clip, AdamW.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/decoder_model.h"

namespace qlora {

struct OptimHyper {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double max_grad_norm = 1.0;  // 0 = no clipping
};

struct StepResult {
  double loss = 0;            // token-weighted mean loss over all micro-batches
  double grad_norm = 0;       // global L2 norm before clipping
  int64_t tokens = 0, trained_tokens = 0;
};

// How micro-batch j of a step becomes gradients: LoRA grads "+=" the gradient of the micro-batch's
// share of the step's loss, which it returns (the step's loss is the sum of the shares). Empty: the
// token mean, each micro-batch's summed token loss over the trained tokens of the whole step, so
// accumulation equals one large batch. Preference objectives bring their own (preference_step.h).
using MicroStepFn = std::function<double(const Batch& b, int64_t j, uint64_t dropout_seed)>;

// `step` is 0-based; AdamW bias correction uses step+1. Gradients that are not finite leave the
// weights untouched (result.grad_norm is NaN/inf).
StepResult train_step(DecoderModel& model, const std::vector<Batch>& micro_batches, const OptimHyper& h, double lr,
                      int64_t step, uint64_t dropout_seed, const MicroStepFn& micro = {});

// The dropout seed of micro-batch j (0-based, in the step) of optimizer step `step`; data-parallel
// ranks use the global index j, so dropout is the same at any world size.
uint64_t micro_batch_seed(uint64_t dropout_seed, int64_t step, int64_t j);

// train_step's two halves, for callers that time them apart (qlora bench); train_step is exactly
// accumulate_grads followed by apply_optimizer.
// Zeroes the LoRA grads and runs forward + backward over every micro-batch: fills loss and tokens.
StepResult accumulate_grads(DecoderModel& model, const std::vector<Batch>& micro_batches, int64_t step,
                            uint64_t dropout_seed, const MicroStepFn& micro = {});
// The share of one micro-batch (MicroStepFn's default) in a step of `trained_tokens` over
// `micro_batches`: its token losses over trained_tokens, plus (mixture of experts with
// output_router_logits) router_aux_loss_coef times its load-balancing loss over micro_batches, so
// the step's objective is the token mean plus the coefficient times the micro-batches' mean aux.
double token_mean_share(DecoderModel& model, const Batch& b, int64_t trained_tokens, int64_t micro_batches, uint64_t seed);
// Global grad norm (into r.grad_norm), clipping and AdamW; leaves the weights untouched when the
// loss or the norm is not finite.
void apply_optimizer(DecoderModel& model, const OptimHyper& h, double lr, int64_t step, StepResult& r);

// After a step whose loss or norm is not finite: "the loss" when it is the loss, else the name of
// the first LoRA gradient (in parameter order) holding a NaN or infinity, else "" (the norm
// overflowed while every element is finite).
std::string first_non_finite(DecoderModel& model, double loss);

// Whether every LoRA weight and AdamW moment is finite (a checkpoint is only written from such a state).
bool optimizer_state_finite(DecoderModel& model);

}  // namespace qlora
