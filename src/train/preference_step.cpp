// The preference micro-step: reference forward, policy forward + weighted backward.
#include "train/preference_step.h"

#include "core/error.h"

namespace qlora {

namespace {

// The reference's summed log-probs: the same forward with every adapter switched off.
std::vector<double> reference_logps(LlamaModel& model, const std::vector<PrefSeq>& seqs, const Batch& b) {
  model.set_adapters_enabled(false);
  std::vector<float> rows;
  try {
    rows = model.token_losses(b);
  } catch (...) {
    model.set_adapters_enabled(true);
    throw;
  }
  model.set_adapters_enabled(true);
  return sequence_logps(seqs, rows);
}

}  // namespace

PrefLogps preference_logps(LlamaModel& model, const PreferenceSpec& spec, const Batch& b) {
  PrefLogps out;
  out.seqs = preference_sequences(b, spec);
  if (spec.uses_reference()) out.reference = reference_logps(model, out.seqs, b);
  out.policy = sequence_logps(out.seqs, model.token_losses(b));
  return out;
}

MicroStepFn preference_micro_step(LlamaModel& model, const PreferenceSpec& spec, int64_t n_micro,
                                  PrefMetricMeans* metrics) {
  if (n_micro < 1) fail(ErrorKind::Internal, "preference step", "no micro-batch");
  const double scale = 1.0 / double(n_micro);
  return [&model, spec, scale, metrics](const Batch& b, int64_t, uint64_t seed) -> double {
    const std::vector<PrefSeq> seqs = preference_sequences(b, spec);
    std::vector<double> ref;
    if (spec.uses_reference()) ref = reference_logps(model, seqs, b);
    PrefOutcome outcome;
    model.forward_backward_weighted(
        b,
        [&](const std::vector<float>& rows) {
          outcome = preference_objective(spec, seqs, sequence_logps(seqs, rows), ref);
          return position_weights(seqs, outcome.dlogp, int64_t(rows.size()), scale);
        },
        seed);
    if (metrics) metrics->add(outcome.metrics);
    return outcome.loss * scale;
  };
}

PrefEvalTotals evaluate_preference(LlamaModel& model, const PreferenceSpec& spec, const std::vector<Batch>& batches) {
  PrefEvalTotals t;
  for (const Batch& b : batches) {
    const PrefLogps lp = preference_logps(model, spec, b);
    const PrefOutcome o = preference_objective(spec, lp.seqs, lp.policy, lp.reference);
    t.loss += o.loss / double(batches.size());
    t.metrics.add(o.metrics);
  }
  return t;
}

}  // namespace qlora
