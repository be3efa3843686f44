// The data-parallel step: forward/backward over this rank's micro-batches, one fp32 all-reduce of
// every LoRA gradient flattened into one buffer, one f64 all-reduce of the loss sum and stop flag,
// then train_step's own clipping and AdamW on gradients that are identical on every rank.
#include "train/data_parallel.h"

#include <string>

#include "core/error.h"

namespace qlora {

Slice micro_batch_share(int64_t n, const Comm& comm) { return slice_of(size_t(n), comm.rank(), comm.size()); }

DataParallelStep::DataParallelStep(DecoderModel& model, Comm& comm, bool shard_optimizer, DeviceReducer* device)
    : model_(model), comm_(comm) {
  if (shard_optimizer) {
    zero1_ = std::make_unique<Zero1Optimizer>(model_, comm_);
    return;
  }
  if (device) {
    device_ = device;
    return;
  }
  size_t n = 0;
  for (auto& p : model_.trainable_params()) n += size_t(p.g.numel());
  flat_.resize(n);
}

void DataParallelStep::reduce_grads() {
  Backend& be = model_.backend();
  if (device_) {  // in place on the device, after the backward has finished
    be.synchronize();
    std::vector<std::pair<float*, size_t>> bufs;
    for (auto& p : model_.trainable_params()) bufs.emplace_back(static_cast<float*>(p.g.data), size_t(p.g.numel()));
    device_->allreduce_sum(bufs);
    return;
  }
  size_t at = 0;
  for (auto& p : model_.trainable_params()) {
    QLORA_ASSERT(p.g.dtype == DType::F32);
    be.copy_to_host(flat_.data() + at, p.g.data, size_t(p.g.nbytes()));
    at += size_t(p.g.numel());
  }
  comm_.allreduce_sum(flat_.data(), flat_.size());
  at = 0;
  for (auto& p : model_.trainable_params()) {
    be.copy_to_device(p.g.data, flat_.data() + at, size_t(p.g.nbytes()));
    at += size_t(p.g.numel());
  }
}

StepResult DataParallelStep::run(const std::vector<Batch>& global, const OptimHyper& h, double lr, int64_t step,
                                 uint64_t dropout_seed, bool stop_here, bool* stop_any, const MicroStepFn& micro) {
  StepResult r;
  for (const auto& b : global) {  // every rank holds the whole step: the normalizer needs no message
    r.tokens += b.n();
    r.trained_tokens += b.n_trained();
  }
  if (r.trained_tokens == 0) fail(ErrorKind::Data, "step " + std::to_string(step + 1), "no trained token in the step's micro-batches");
  const Slice mine = micro_batch_share(int64_t(global.size()), comm_);
  model_.zero_grads();
  double sums[2] = {0, stop_here ? 1.0 : 0.0};  // my micro-batches' shares of the loss, stop votes
  for (size_t j = mine.begin; j < mine.end(); j++) {
    const uint64_t seed = micro_batch_seed(dropout_seed, step, int64_t(j));
    sums[0] += micro ? micro(global[j], int64_t(j), seed)
                     : token_mean_share(model_, global[j], r.trained_tokens, int64_t(global.size()), seed);
  }
  if (zero1_) {
    zero1_->step(h, lr, step, sums, r, stop_any);
    return r;
  }
  reduce_grads();
  comm_.allreduce_sum(sums, 2);
  r.loss = sums[0];
  if (stop_any) *stop_any = sums[1] > 0;
  apply_optimizer(model_, h, lr, step, r);
  return r;
}

}  // namespace qlora
