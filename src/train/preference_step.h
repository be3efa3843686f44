// A preference objective on the model: each micro-batch of preference rows runs the reference
// forward (the adapters off, nothing kept for a backward) when the method has one, then the policy
// forward, the objective over the completions' summed log-probs, and one backward weighted by it.
// No second model, no padding between chosen and rejected (two documents of one row).
#pragma once
#include <cstdint>
#include <vector>

#include "model/llama_model.h"
#include "train/preference.h"
#include "train/step.h"

namespace qlora {

// The MicroStepFn of a preference step of `n_micro` micro-batches (all ranks together): each
// micro-batch's objective (its own mean over pairs or rows, as TRL reduces a batch) counts 1/n_micro,
// as gradient accumulation averages TRL's per-batch losses. Adds each micro-batch's metrics to
// *metrics (may be null).
MicroStepFn preference_micro_step(LlamaModel& model, const PreferenceSpec& spec, int64_t n_micro,
                                  PrefMetricMeans* metrics);

// Forward only, in order: the mean of the batches' objectives and the means of their metrics.
struct PrefEvalTotals {
  double loss = 0;
  PrefMetricMeans metrics;
};
PrefEvalTotals evaluate_preference(LlamaModel& model, const PreferenceSpec& spec, const std::vector<Batch>& batches);

// The summed log-probs of every completion of a batch under the policy (adapters on) and under
// the reference (adapters off; empty when the method has none). Forward only.
struct PrefLogps {
  std::vector<PrefSeq> seqs;
  std::vector<double> policy, reference;
};
PrefLogps preference_logps(LlamaModel& model, const PreferenceSpec& spec, const Batch& b);

}  // namespace qlora
