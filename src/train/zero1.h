// ZeRO-1: AdamW moments split across data-parallel ranks; gradients reduce-scattered, each rank
// updates its share of every LoRA tensor, the updated weights all-gathered.
#pragma once
#include <string>
#include <vector>

#include "core/comm.h"
#include "train/step.h"

namespace qlora {

// Rank r's share of a tensor of n elements: [r*per, min(n, (r+1)*per)) with per = ceil(n / ranks),
// the layout shard_plan() plans (the last ranks' shares may be shorter, or empty).
Slice zero1_share(size_t n, int rank, int world);

class Zero1Optimizer {
 public:
  Zero1Optimizer(DecoderModel& model, Comm& comm);
  // After the local forward/backward: reduce-scatter the gradients, the global norm (from every
  // rank's share, summed in f64 in rank order, with the shares of the loss and the stop vote in sums[0..1]),
  // clipping, AdamW on this rank's share and the all-gather of the updated weights. Fills
  // r.loss from sums[0], r.grad_norm and *stop_any. Non-finite loss or norm: weights untouched.
  void step(const OptimHyper& h, double lr, int64_t step, double sums[2], StepResult& r, bool* stop_any);
  // Every rank's moments assembled (collective): per LoRA parameter m then v, full shape.
  std::vector<std::vector<float>> gather_moments();
  // A checkpoint's optimizer.safetensors (full moments, as written by any world size): this
  // rank's shares.
  void load_moments(const std::string& path);

 private:
  DecoderModel& model_;
  Comm& comm_;
  std::vector<size_t> block_;            // elements of each rank's block in flat_
  std::vector<float> flat_;              // rank-major: rank 0's shares of every tensor, then rank 1's, ...
  std::vector<std::vector<Slice>> share_;  // [param][rank]
};

// optimizer.safetensors from gathered moments (the file write_optimizer_state writes).
void write_gathered_optimizer_state(const std::string& path, DecoderModel& model,
                                    const std::vector<std::vector<float>>& moments);

}  // namespace qlora
