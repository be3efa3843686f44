// The preference micro-step: reference forward, policy forward + weighted backward.
#include "train/preference_step.h"

#include "core/error.h"
#include "train/data.h"

namespace qlora {

namespace {

// The reference's summed log-probs: precomputed with the batch, or the same forward with every
// adapter switched off.
std::vector<double> reference_logps(DecoderModel& model, const std::vector<PrefSeq>& seqs, const Batch& b) {
  if (!b.ref_logps.empty()) {
    if (b.ref_logps.size() != seqs.size())
      fail(ErrorKind::Internal, "preference batch",
           std::to_string(b.ref_logps.size()) + " precomputed reference log-probs for " + std::to_string(seqs.size()) +
               " completions");
    return b.ref_logps;
  }
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

PrefLogps preference_logps(DecoderModel& model, const PreferenceSpec& spec, const Batch& b) {
  PrefLogps out;
  out.seqs = preference_sequences(b, spec);
  if (spec.uses_reference()) out.reference = reference_logps(model, out.seqs, b);
  out.policy = sequence_logps(out.seqs, model.token_losses(b));
  return out;
}

MicroStepFn preference_micro_step(DecoderModel& model, const PreferenceSpec& spec, int64_t n_micro,
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

PrefEvalTotals evaluate_preference(DecoderModel& model, const PreferenceSpec& spec, const std::vector<Batch>& batches,
                                   const std::function<void(size_t, const PrefEvalTotals&)>& on_batch) {
  PrefEvalTotals t;
  for (size_t j = 0; j < batches.size(); j++) {
    const PrefLogps lp = preference_logps(model, spec, batches[j]);
    const PrefOutcome o = preference_objective(spec, lp.seqs, lp.policy, lp.reference);
    t.loss += o.loss / double(batches.size());
    t.metrics.add(o.metrics);
    if (on_batch) on_batch(j + 1, t);
  }
  return t;
}

void precompute_reference_logps(DecoderModel& model, const PreferenceSpec& spec, ExampleSet& examples,
                                int64_t batch_size, int32_t pad_id, Comm* comm,
                                const std::function<void(int64_t, int64_t)>& progress) {
  if (!spec.uses_reference()) fail(ErrorKind::Internal, "precompute_reference_logps", "the objective has no reference");
  examples.clear_ref_logps();
  const std::vector<Batch> batches = make_batches(examples, batch_size, pad_id);
  const int world = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  // Where each batch's documents start in the flat list of every example's documents.
  std::vector<size_t> first(batches.size() + 1, 0);
  size_t n_docs = 0, at = 0;
  for (size_t j = 0; j < batches.size(); j++) {
    first[j] = n_docs;
    for (int64_t r = 0; r < batches[j].b; r++) n_docs += size_t(examples.docs(at++));
  }
  first[batches.size()] = n_docs;
  std::vector<double> all(n_docs, 0.0);
  const size_t per_rank = (batches.size() + size_t(world) - 1) / size_t(world);
  for (size_t k = 0; k < per_rank; k++) {
    const size_t j = k * size_t(world) + size_t(rank);
    const bool mine = j < batches.size();
    // Under fsdp every rank gathers every layer with the others: a rank out of batches repeats the last.
    const Batch& b = batches[mine ? j : batches.size() - 1];
    const std::vector<PrefSeq> seqs = preference_sequences(b, spec);
    const std::vector<double> ref = reference_logps(model, seqs, b);
    if (mine) {
      if (ref.size() != first[j + 1] - first[j])
        fail(ErrorKind::Internal, "precompute_reference_logps", "a document without a scored completion");
      std::copy(ref.begin(), ref.end(), all.begin() + std::ptrdiff_t(first[j]));
    }
    if (progress) progress(int64_t(std::min(batches.size(), (k + 1) * size_t(world))), int64_t(batches.size()));
  }
  if (world > 1) comm->allreduce_sum(all.data(), all.size());
  at = 0;
  for (size_t i = 0; i < examples.size(); i++) {
    const size_t n = size_t(examples.docs(i));
    examples.set_ref_logps(i, std::vector<double>(all.begin() + std::ptrdiff_t(at), all.begin() + std::ptrdiff_t(at + n)));
    at += n;
  }
}

}  // namespace qlora
