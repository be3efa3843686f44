// Preference objectives over the summed log-probabilities of whole completions: DPO (loss types
// sigmoid, ipo, hinge, robust), ORPO, SimPO and KTO, with TRL's definitions, defaults and metric
// names. Everything here is host arithmetic on per-sequence numbers; preference_step.h runs the model.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/batch.h"
#include "model/modes.h"
#include "text/dataset.h"

namespace qlora {

struct PreferenceSpec {
  Objective method = Objective::Dpo;
  DpoLoss loss = DpoLoss::Sigmoid;  // DPO only
  double beta = 0.1;             // DPO/KTO: the KL weight; ORPO: lambda; SimPO: the reward scale
  double label_smoothing = 0.0;  // DPO sigmoid (conservative DPO) and robust; SimPO
  double simpo_gamma = 0.5;      // SimPO: the target reward margin
  double cpo_alpha = 0.0;        // SimPO: weight of the NLL on chosen completions (CPO's term)
  double desirable_weight = 1.0, undesirable_weight = 1.0;  // KTO
  // DPO and KTO compare with a reference: the same model with every adapter switched off.
  bool uses_reference() const { return qlora::uses_reference(method); }
  // Pairs of chosen/rejected completions (DPO, ORPO, SimPO); KTO rows hold one completion.
  bool paired() const { return method != Objective::Kto; }
};

// One completion of a preference batch: its role and the range of the batch's labeled positions
// (in batch order, as DecoderModel::token_losses returns them) that score it.
struct PrefSeq {
  DocRole role = DocRole::Sft;
  int64_t begin = 0, end = 0;
  int64_t tokens() const { return end - begin; }
};

// The completions of a batch built from preference rows, in order: chosen then rejected for each
// pair; a desirable or undesirable completion then its KL probe for KTO. Internal error when the
// batch does not hold such rows (a role missing, a document without a labeled token).
std::vector<PrefSeq> preference_sequences(const Batch& b, const PreferenceSpec& spec);

// Summed log-probability of each sequence from the labeled positions' token losses (-log p).
std::vector<double> sequence_logps(const std::vector<PrefSeq>& seqs, const std::vector<float>& token_losses);

// One micro-batch's objective: its loss (TRL's per-batch reduction: the mean over pairs or rows),
// d loss / d(summed log-prob) of every sequence, and the metrics TRL logs for it (rewards/chosen,
// rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen, logps/rejected, and the
// method's own: nll_loss, log_odds_ratio, log_odds_chosen, kl). ref_logp is ignored (may be empty)
// when the method has no reference.
struct PrefOutcome {
  double loss = 0;
  std::vector<double> dlogp;
  std::map<std::string, double> metrics;
};
PrefOutcome preference_objective(const PreferenceSpec& spec, const std::vector<PrefSeq>& seqs,
                                 const std::vector<double>& logp, const std::vector<double>& ref_logp);

// Per-position gradient weights for DecoderModel::forward_backward_weighted: d(scale * loss)/d(token
// loss) = -scale * dlogp of the position's sequence; positions outside every sequence get 0.
std::vector<float> position_weights(const std::vector<PrefSeq>& seqs, const std::vector<double>& dlogp,
                                    int64_t n_positions, double scale);

// Means over micro-batches of their metrics (TRL logs the mean of the per-batch values; a batch
// without desirable rows, say, has no rewards/chosen and does not count for it).
struct PrefMetricMeans {
  std::map<std::string, double> sum;
  std::map<std::string, int64_t> count;
  void add(const std::map<std::string, double>& m);
  std::map<std::string, double> means() const;
  // Sums then counts, over preference_metric_names(): what ranks add up with one all-reduce.
  std::vector<double> flat() const;
  static PrefMetricMeans from_flat(const std::vector<double>& v);
};

// Every metric name an objective can report, in a fixed order.
const std::vector<std::string>& preference_metric_names();

}  // namespace qlora
