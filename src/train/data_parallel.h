// Data-parallel optimizer step: each rank runs its share of the step's micro-batches, LoRA
// gradients and loss sums are summed over ranks, and every rank applies the same AdamW update.
#pragma once
#include <cstdint>
#include <vector>

#include <memory>

#include "core/comm.h"
#include "train/step.h"
#include "train/zero1.h"

namespace qlora {

// Rank r's micro-batches of a step of n: the contiguous share slice_of(n, r, w) of the step's list
// (with n = gradient_accumulation_steps x world, exactly gradient_accumulation_steps each).
Slice micro_batch_share(int64_t n_micro_batches, const Comm& comm);

class DataParallelStep {
 public:
  // shard_optimizer: ZeRO-1 (the model was planned with optimizer_shards = ranks). device: sums the
  // gradients where they are (NCCL on GPUs) instead of through host memory over `comm` (without
  // sharding only).
  DataParallelStep(DecoderModel& model, Comm& comm, bool shard_optimizer = false, DeviceReducer* device = nullptr);
  // `global` is the whole step, identical on every rank, in the order one process with
  // gradient_accumulation_steps x world would run it. Every micro-batch is normalized by the
  // trained tokens of all of them and gets the dropout seed of its global index, so the sum over
  // ranks is that process's gradient up to fp32 summation order. stop_here: this rank was asked to
  // stop (SIGTERM); *stop_any: whether any rank was, the same answer on every rank.
  // micro: as train_step's (empty: the token mean over the whole step's trained tokens).
  StepResult run(const std::vector<Batch>& global, const OptimHyper& h, double lr, int64_t step, uint64_t dropout_seed,
                 bool stop_here, bool* stop_any, const MicroStepFn& micro = {});
  // The ZeRO-1 optimizer, or null without sharding.
  Zero1Optimizer* zero1() { return zero1_.get(); }

 private:
  void reduce_grads();
  DecoderModel& model_;
  Comm& comm_;
  DeviceReducer* device_ = nullptr;
  std::vector<float> flat_;  // (sum of LoRA parameter sizes): every gradient, back to back (no sharding)
  std::unique_ptr<Zero1Optimizer> zero1_;
};

}  // namespace qlora
