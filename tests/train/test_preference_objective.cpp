// Preference objectives on per-sequence log-probs: every method's gradient against central finite
// differences in double precision, the batch layout read from preference rows, and the metrics'
// definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "train/data.h"
#include "train/preference.h"

namespace qlora {
namespace {

struct Case {
  const char* name;
  PreferenceSpec spec;
};

PreferenceSpec spec_of(Objective m, DpoLoss l = DpoLoss::Sigmoid, double ls = 0.0) {
  PreferenceSpec s;
  s.method = m;
  s.loss = l;
  s.label_smoothing = ls;
  s.beta = m == Objective::Simpo ? 2.0 : 0.1;
  if (m == Objective::Simpo) s.cpo_alpha = 0.3;
  if (m == Objective::Kto) s.desirable_weight = 1.3, s.undesirable_weight = 0.7;
  return s;
}

// Sequences of `rows` rows with lengths 1..9, roles as the method lays them out (ORPO: with the
// chosen's scored prompt).
std::vector<PrefSeq> make_seqs(const PreferenceSpec& s, int rows, std::mt19937& g) {
  std::vector<PrefSeq> out;
  int64_t at = 0;
  for (int i = 0; i < rows; i++)
    for (int k = s.method == Objective::Orpo ? -1 : 0; k < 2; k++) {
      if (k < 0) {
        const int64_t len = 1 + int64_t(g() % 5);
        out.push_back({DocRole::Prompt, at, at + len});
        at += len;
        continue;
      }
      const int64_t len = 1 + int64_t(g() % 9);
      DocRole role = k == 0 ? DocRole::Chosen : DocRole::Rejected;
      if (!s.paired()) role = k == 1 ? DocRole::KlProbe : (i % 2 ? DocRole::Undesirable : DocRole::Desirable);
      out.push_back({role, at, at + len});
      at += len;
    }
  return out;
}

TEST(PreferenceObjective, GradientsMatchFiniteDifferences) {
  const std::vector<Case> cases = {
      {"dpo sigmoid", spec_of(Objective::Dpo)},
      {"dpo sigmoid smoothed", spec_of(Objective::Dpo, DpoLoss::Sigmoid, 0.2)},
      {"dpo ipo", spec_of(Objective::Dpo, DpoLoss::Ipo)},
      {"dpo hinge", spec_of(Objective::Dpo, DpoLoss::Hinge)},
      {"dpo robust", spec_of(Objective::Dpo, DpoLoss::Robust, 0.1)},
      {"orpo", spec_of(Objective::Orpo)},
      {"simpo", spec_of(Objective::Simpo, DpoLoss::Sigmoid, 0.1)},
      {"kto", spec_of(Objective::Kto)},
  };
  std::mt19937 g(7);
  std::normal_distribution<double> n(0.0, 1.0);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<PrefSeq> seqs = make_seqs(c.spec, 5, g);
    std::vector<double> lp, ref;
    for (const PrefSeq& s : seqs) {
      // log-probs of whole completions: about -2 per token (below -0.2 per token: ORPO's odds need
      // probabilities below 1), policy near the reference
      const double base = -2.0 * double(s.tokens()) + 0.5 * n(g);
      ref.push_back(base);
      lp.push_back(std::min(base + 3.0 * n(g), -0.2 * double(s.tokens())));
    }
    const PrefOutcome o = preference_objective(c.spec, seqs, lp, ref);
    ASSERT_EQ(o.dlogp.size(), seqs.size());
    double largest = 0;
    for (double d : o.dlogp) largest = std::max(largest, std::abs(d));
    EXPECT_GT(largest, 1e-4) << "no gradient at all";
    for (size_t i = 0; i < seqs.size(); i++) {
      const double h = 1e-5;
      std::vector<double> up = lp, dn = lp;
      up[i] += h;
      dn[i] -= h;
      const double fd = (preference_objective(c.spec, seqs, up, ref).loss - preference_objective(c.spec, seqs, dn, ref).loss) / (2 * h);
      if (!c.spec.paired() && i % 2 == 1) {
        // KTO's KL term is held constant (detached), as TRL holds it: no gradient reaches a probe.
        EXPECT_EQ(o.dlogp[i], 0.0);
        continue;
      }
      EXPECT_NEAR(o.dlogp[i], fd, 1e-7 + 1e-6 * std::abs(fd)) << "sequence " << i;
    }
  }
}

TEST(PreferenceObjective, DpoSigmoidAtTheReferenceIsLog2AndRewardsAreBetaLogRatios) {
  const PreferenceSpec s = spec_of(Objective::Dpo);
  const std::vector<PrefSeq> seqs = {{DocRole::Chosen, 0, 3}, {DocRole::Rejected, 3, 5}};
  const PrefOutcome same = preference_objective(s, seqs, {-4.0, -3.0}, {-4.0, -3.0});
  EXPECT_NEAR(same.loss, std::log(2.0), 1e-12);
  const PrefOutcome o = preference_objective(s, seqs, {-3.0, -5.0}, {-4.0, -3.0});
  EXPECT_NEAR(o.metrics.at("rewards/chosen"), 0.1 * 1.0, 1e-12);
  EXPECT_NEAR(o.metrics.at("rewards/rejected"), 0.1 * -2.0, 1e-12);
  EXPECT_NEAR(o.metrics.at("rewards/margins"), 0.3, 1e-12);
  EXPECT_EQ(o.metrics.at("rewards/accuracies"), 1.0);
  EXPECT_NEAR(o.loss, -std::log(1.0 / (1.0 + std::exp(-0.3))), 1e-12);
  EXPECT_EQ(o.metrics.at("logps/chosen"), -3.0);
}

TEST(PreferenceObjective, KtoClampsTheKlEstimateAtZero) {
  PreferenceSpec s = spec_of(Objective::Kto);
  const std::vector<PrefSeq> seqs = {{DocRole::Desirable, 0, 2}, {DocRole::KlProbe, 2, 4}};
  // probe below its reference: kl would be negative, and is 0
  const PrefOutcome o = preference_objective(s, seqs, {-2.0, -6.0}, {-3.0, -5.0});
  EXPECT_EQ(o.metrics.at("kl"), 0.0);
  EXPECT_NEAR(o.loss, 1.3 * (1.0 - 1.0 / (1.0 + std::exp(-0.1 * 1.0))), 1e-12);
  EXPECT_EQ(o.metrics.count("rewards/rejected"), 0u);  // no undesirable row in the batch
}

TEST(PreferenceObjective, MetricMeansSurviveTheRankAllReduceLayout) {
  PrefMetricMeans a;
  a.add({{"rewards/chosen", 1.0}, {"kl", 0.5}});
  a.add({{"rewards/chosen", 3.0}});
  const PrefMetricMeans b = PrefMetricMeans::from_flat(a.flat());
  EXPECT_EQ(b.means().at("rewards/chosen"), 2.0);
  EXPECT_EQ(b.means().at("kl"), 0.5);
  EXPECT_EQ(b.means().count("rewards/rejected"), 0u);
}

// A batch of preference rows: labeled positions map to their completions in order.
TEST(PreferenceBatch, SequencesFollowTheRowsDocuments) {
  using R = DocRole;
  Example a;  // prompt 2 tokens; chosen 3 tokens, rejected 2 tokens
  a.ids = {5, 6, 7, 8, 9, 5, 6, 10, 11};
  a.labels = {kNoLoss, kNoLoss, 7, 8, 9, kNoLoss, kNoLoss, 10, 11};
  a.roles = {R::Prompt, R::Prompt, R::Chosen, R::Chosen, R::Chosen, R::Prompt, R::Prompt, R::Rejected, R::Rejected};
  a.doc_lens = {5, 4};
  Example b;  // prompt 2 tokens; chosen 2, rejected 1
  b.ids = {5, 6, 7, 8, 5, 6, 10};
  b.labels = {kNoLoss, kNoLoss, 7, 8, kNoLoss, kNoLoss, 10};
  b.roles = {R::Prompt, R::Prompt, R::Chosen, R::Chosen, R::Prompt, R::Prompt, R::Rejected};
  b.doc_lens = {4, 3};
  const Batch x = pad_batch({&a, &b}, 0);
  const std::vector<PrefSeq> seqs = preference_sequences(x, spec_of(Objective::Dpo));
  ASSERT_EQ(seqs.size(), 4u);
  EXPECT_EQ(seqs[0].role, DocRole::Chosen);
  EXPECT_EQ(seqs[0].tokens(), 3);
  EXPECT_EQ(seqs[1].role, DocRole::Rejected);
  EXPECT_EQ(seqs[1].tokens(), 2);
  EXPECT_EQ(seqs[2].tokens(), 2);
  EXPECT_EQ(seqs[3].tokens(), 1);
  EXPECT_EQ(seqs[3].end, x.n_trained());
  // ORPO's rows also score the chosen's prompt (after its first token): a sequence of its own.
  Example c = a;
  c.labels[1] = 6;
  const std::vector<PrefSeq> orpo = preference_sequences(pad_batch({&c}, 0), spec_of(Objective::Orpo));
  ASSERT_EQ(orpo.size(), 3u);
  EXPECT_EQ(orpo[0].role, DocRole::Prompt);
  EXPECT_EQ(orpo[0].tokens(), 1);
  EXPECT_EQ(orpo[1].role, DocRole::Chosen);
  EXPECT_THROW(preference_sequences(pad_batch({&c}, 0), spec_of(Objective::Dpo)), Error);
  // The wrong method for these rows, and SFT rows, are refused.
  EXPECT_THROW(preference_sequences(x, spec_of(Objective::Kto)), Error);
  Example plain;
  plain.ids = {1, 2, 3};
  plain.labels = {1, 2, 3};
  EXPECT_THROW(preference_sequences(pad_batch({&plain}, 0), spec_of(Objective::Dpo)), Error);
}

TEST(PreferenceBatch, PositionWeightsAreMinusTheSequenceGradient) {
  const std::vector<PrefSeq> seqs = {{DocRole::Chosen, 0, 2}, {DocRole::Rejected, 2, 3}};
  const std::vector<float> w = position_weights(seqs, {0.5, -0.25}, 4, 0.5);
  EXPECT_EQ(w, (std::vector<float>{-0.25f, -0.25f, 0.125f, 0.0f}));
}

}  // namespace
}  // namespace qlora
