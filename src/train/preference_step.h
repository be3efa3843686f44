// A preference objective on the model: each micro-batch of preference rows runs the reference
// forward (the adapters off, nothing kept for a backward) when the method has one, then the policy
// forward, the objective over the completions' summed log-probs, and one backward weighted by it.
// No second model, no padding between chosen and rejected (two documents of one row).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/comm.h"
#include "model/decoder_model.h"
#include "text/dataset.h"
#include "text/example_store.h"
#include "train/preference.h"
#include "train/step.h"

namespace qlora {

// The MicroStepFn of a preference step of `n_micro` micro-batches (all ranks together): each
// micro-batch's objective (its own mean over pairs or rows, as TRL reduces a batch) counts 1/n_micro,
// as gradient accumulation averages TRL's per-batch losses. Adds each micro-batch's metrics to
// *metrics (may be null).
MicroStepFn preference_micro_step(DecoderModel& model, const PreferenceSpec& spec, int64_t n_micro,
                                  PrefMetricMeans* metrics);

// Forward only, in order: the mean of the batches' objectives and the means of their metrics.
struct PrefEvalTotals {
  double loss = 0;
  PrefMetricMeans metrics;
};
// on_batch (may be empty) sees the totals after each batch: the number done and the sums so far.
PrefEvalTotals evaluate_preference(DecoderModel& model, const PreferenceSpec& spec, const std::vector<Batch>& batches,
                                   const std::function<void(size_t, const PrefEvalTotals&)>& on_batch = {});

// The summed log-probs of every completion of a batch under the policy (adapters on) and under
// the reference (adapters off, or the batch's precomputed ref_logps; empty when the method has
// none). Forward only.
struct PrefLogps {
  std::vector<PrefSeq> seqs;
  std::vector<double> policy, reference;
};
PrefLogps preference_logps(DecoderModel& model, const PreferenceSpec& spec, const Batch& b);

// precompute_ref_log_probs: every document's reference log-prob (adapters off) into its example's
// ref_logps, in batches of batch_size examples in order. With a Comm of several ranks each rank
// runs its share of the batches (under fsdp all run the same number of forwards) and the values
// are summed over ranks, so every rank ends with all of them. `progress` (may be null) gets the
// batches done and their total.
void precompute_reference_logps(DecoderModel& model, const PreferenceSpec& spec, ExampleSet& examples,
                                int64_t batch_size, int32_t pad_id, Comm* comm,
                                const std::function<void(int64_t, int64_t)>& progress = nullptr);

}  // namespace qlora
