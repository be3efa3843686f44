// Preference objectives as TRL 1.16 defines them (trl/trainer/dpo_trainer.py, kto_trainer.py;
// trl/experimental/orpo, cpo), with their gradients with respect to each completion's summed
// log-probability written out by hand. tests/train/test_preference_objective.cpp checks every
// gradient against finite differences and tests/train/test_preference_parity.cpp the whole step
// against TRL's trainers.
#include "train/preference.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qlora {

std::vector<PrefSeq> preference_sequences(const Batch& b, const PreferenceSpec& spec) {
  const int64_t n = b.n();
  if (int64_t(b.roles.size()) != n || int64_t(b.seg.size()) != n)
    fail(ErrorKind::Internal, "preference batch", "the batch carries no token roles (not built from preference rows)");
  // A labeled position scores the next token: its sequence is that token's (row, document, role).
  std::vector<PrefSeq> seqs;
  int64_t k = 0, last_row = -1, last_seg = -1;
  DocRole last_role = DocRole::Sft;
  for (int64_t i = 0; i + 1 < n; i++) {
    if (b.targets[size_t(i)] == kIgnoreIndex) continue;
    const int64_t row = i / b.t, seg = b.seg[size_t(i)];
    const DocRole role = DocRole(b.roles[size_t(i + 1)]);
    if (row != last_row || seg != last_seg || role != last_role) {
      seqs.push_back({role, k, k});
      last_row = row, last_seg = seg, last_role = role;
    }
    seqs.back().end = ++k;
  }
  if (k != b.n_trained())
    fail(ErrorKind::Internal, "preference batch", "a labeled position at the end of the batch scores no token");
  // Paired: [scored prompt] chosen rejected, per row; KTO: a rated completion then its KL probe.
  for (size_t s = 0; s < seqs.size();) {
    const std::string at = "completion " + std::to_string(s);
    auto need = [&](bool ok) {
      if (!ok)
        fail(ErrorKind::Internal, "preference batch",
             at + " is not laid out as " + objective_name(spec.method) + " rows are");
    };
    if (spec.paired()) {
      if (seqs[s].role == DocRole::Prompt) {
        need(spec.method == Objective::Orpo);
        s++;
      }
      need(s + 1 < seqs.size() && seqs[s].role == DocRole::Chosen && seqs[s + 1].role == DocRole::Rejected);
    } else {
      need(s + 1 < seqs.size() &&
           (seqs[s].role == DocRole::Desirable || seqs[s].role == DocRole::Undesirable) &&
           seqs[s + 1].role == DocRole::KlProbe);
    }
    s += 2;
  }
  return seqs;
}

std::vector<double> sequence_logps(const std::vector<PrefSeq>& seqs, const std::vector<float>& losses) {
  std::vector<double> out;
  for (const PrefSeq& s : seqs) {
    if (s.end > int64_t(losses.size())) fail(ErrorKind::Internal, "preference batch", "sequence beyond the token losses");
    double sum = 0;
    for (int64_t i = s.begin; i < s.end; i++) sum -= double(losses[size_t(i)]);
    out.push_back(sum);
  }
  return out;
}

namespace {

double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }
double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
// log(1 - exp(a)) for a < 0, accurate at both ends.
double log1mexp(double a) { return a > -0.6931471805599453 ? std::log(-std::expm1(a)) : std::log1p(-std::exp(a)); }

// Paired methods: index p's chosen is seqs[2p], its rejected seqs[2p+1].
struct Pair {
  size_t c, r;
};

// One pair's share of the objective: its loss, d loss / d(summed log-prob) of the chosen (dc) and
// rejected (dr) completion, the implicit rewards and the log-probs the metrics show.
struct PairTerms {
  double loss = 0, dc = 0, dr = 0, reward_c = 0, reward_r = 0, shown_c = 0, shown_r = 0;
  double log_odds_ratio = 0, log_odds = 0;  // ORPO: log_sigmoid(lo) and lo
};

// DPO with loss type s.loss over the chosen and rejected summed log-probs (lc, lr), their
// reference values (ref_c, ref_r) and token counts (Lc, Lr).
PairTerms dpo_terms(const PreferenceSpec& s, double lc, double lr, double ref_c, double ref_r, double Lc, double Lr) {
  const double beta = s.beta, ls = s.label_smoothing;
  PairTerms t;
  t.shown_c = lc;
  t.shown_r = lr;
  const double xc = lc - ref_c, xr = lr - ref_r;  // log-ratios
  t.reward_c = beta * xc;
  t.reward_r = beta * xr;
  const double z = beta * (xc - xr);
  double dz = 0;  // d loss / d z
  switch (s.loss) {
    case DpoLoss::Sigmoid:  // with label_smoothing: conservative DPO
      t.loss = -(1 - ls) * log_sigmoid(z) - ls * log_sigmoid(-z);
      dz = -(1 - ls) * sigmoid(-z) + ls * sigmoid(z);
      break;
    case DpoLoss::Robust:
      t.loss = (-(1 - ls) * log_sigmoid(z) + ls * log_sigmoid(-z)) / (1 - 2 * ls);
      dz = (-(1 - ls) * sigmoid(-z) - ls * sigmoid(z)) / (1 - 2 * ls);
      break;
    case DpoLoss::Hinge:
      t.loss = std::max(0.0, 1 - z);
      dz = 1 - z > 0 ? -1.0 : 0.0;
      break;
    case DpoLoss::Ipo: {  // log-ratios averaged over each completion's tokens
      const double u = xc / Lc - xr / Lr - 1 / (2 * beta);
      t.loss = u * u;
      t.dc = 2 * u / Lc;
      t.dr = -2 * u / Lr;
      break;
    }
  }
  if (s.loss != DpoLoss::Ipo) {
    t.dc = dz * beta;
    t.dr = -dz * beta;
  }
  return t;
}

// ORPO over average log-probs; loss = nll - beta * logsigmoid(log odds ratio), the nll joining
// once per batch (add_nll_term).
PairTerms orpo_terms(const PreferenceSpec& s, double lc, double lr, double Lc, double Lr) {
  const double beta = s.beta;
  PairTerms t;
  const double ac = lc / Lc, ar = lr / Lr;
  const double lo = (ac - ar) - (log1mexp(ac) - log1mexp(ar));
  const double ratio = log_sigmoid(lo);
  t.loss = -beta * ratio;
  const double dlo = -beta * sigmoid(-lo);
  t.dc = dlo / (-std::expm1(ac)) / Lc;  // d lo / d ac = 1 / (1 - e^ac)
  t.dr = -dlo / (-std::expm1(ar)) / Lr;
  t.reward_c = beta * ac;
  t.reward_r = beta * ar;
  t.shown_c = ac;
  t.shown_r = ar;
  t.log_odds_ratio = ratio;
  t.log_odds = lo;
  return t;
}

// SimPO: average log-probs with a target margin gamma.
PairTerms simpo_terms(const PreferenceSpec& s, double lc, double lr, double Lc, double Lr) {
  const double beta = s.beta, ls = s.label_smoothing;
  PairTerms t;
  const double ac = lc / Lc, ar = lr / Lr;
  const double z = beta * (ac - ar) - s.simpo_gamma;
  t.loss = -(1 - ls) * log_sigmoid(z) - ls * log_sigmoid(-z);
  const double dz = -(1 - ls) * sigmoid(-z) + ls * sigmoid(z);
  t.dc = dz * beta / Lc;
  t.dr = -dz * beta / Lr;
  t.reward_c = beta * ac;
  t.reward_r = beta * ar;
  t.shown_c = ac;
  t.shown_r = ar;
  return t;
}

PairTerms pair_terms(const PreferenceSpec& s, const std::vector<PrefSeq>& seqs, const std::vector<double>& lp,
                     const std::vector<double>& ref, const Pair& pr) {
  const size_t c = pr.c, r = pr.r;
  const double Lc = double(seqs[c].tokens()), Lr = double(seqs[r].tokens());
  switch (s.method) {
    case Objective::Dpo: return dpo_terms(s, lp[c], lp[r], ref[c], ref[r], Lc, Lr);
    case Objective::Orpo: return orpo_terms(s, lp[c], lp[r], Lc, Lr);
    case Objective::Simpo: return simpo_terms(s, lp[c], lp[r], Lc, Lr);
    case Objective::Sft:
    case Objective::Kto: QLORA_ASSERT(false);
  }
  PairTerms t;
  t.shown_c = lp[c];
  t.shown_r = lp[r];
  return t;
}

// The NLL term (ORPO; SimPO with cpo_alpha): the mean token loss of the chosen sequences, over
// ORPO's scored prompt tokens too.
struct NllTerm {
  std::vector<size_t> seqs;  // the chosen (and ORPO's prompt) sequences it covers
  int64_t tokens = 0;
  double nll = 0;
};

// The batch's pairs, and the sequences of its NLL term (their tokens and NLL filled by nll_totals).
std::vector<Pair> pairs_of(const std::vector<PrefSeq>& seqs, NllTerm* nll) {
  std::vector<Pair> pairs;
  for (size_t i = 0; i < seqs.size(); i++) {
    if (seqs[i].role == DocRole::Chosen) pairs.push_back({i, i + 1});
    if (seqs[i].role == DocRole::Chosen || seqs[i].role == DocRole::Prompt) nll->seqs.push_back(i);
  }
  return pairs;
}

void nll_totals(const std::vector<PrefSeq>& seqs, const std::vector<double>& lp, NllTerm* nll) {
  double nll_logp = 0;
  for (size_t i : nll->seqs) {
    nll->tokens += seqs[i].tokens();
    nll_logp += lp[i];
  }
  nll->nll = nll->tokens ? -nll_logp / double(nll->tokens) : 0.0;
}

// Sums over the pairs of their losses and of what the metrics average.
struct PairSums {
  double loss = 0, rc = 0, rr = 0, acc = 0, margin = 0, lpc = 0, lpr = 0, lor = 0, loc = 0;

  void add(const PreferenceSpec& s, const PairTerms& t) {
    if (s.method == Objective::Orpo) {
      lor += t.log_odds_ratio;
      loc += t.log_odds;
    }
    loss += t.loss;
    rc += t.reward_c;
    rr += t.reward_r;
    acc += t.reward_c > t.reward_r ? 1.0 : 0.0;
    margin += t.reward_c - t.reward_r;
    lpc += t.shown_c;
    lpr += t.shown_r;
  }
};

// The NLL term into the loss and the gradients, where the method has one; whether it did.
bool add_nll_term(const PreferenceSpec& s, const NllTerm& nll, PrefOutcome* o) {
  const bool with_nll = s.method == Objective::Orpo || (s.method == Objective::Simpo && s.cpo_alpha != 0);
  if (with_nll) {
    const double w = s.method == Objective::Orpo ? 1.0 : s.cpo_alpha;
    o->loss += w * nll.nll;
    for (size_t i : nll.seqs) o->dlogp[i] -= w / double(nll.tokens);
  }
  return with_nll;
}

std::map<std::string, double> paired_metrics(const PreferenceSpec& s, const PairSums& m, double inv, bool with_nll,
                                             double nll) {
  std::map<std::string, double> out = {
      {"rewards/chosen", m.rc * inv},     {"rewards/rejected", m.rr * inv}, {"rewards/accuracies", m.acc * inv},
      {"rewards/margins", m.margin * inv}, {"logps/chosen", m.lpc * inv},   {"logps/rejected", m.lpr * inv}};
  if (s.method != Objective::Dpo) out["nll_loss"] = with_nll ? nll : 0.0;
  if (s.method == Objective::Orpo) {
    out["log_odds_ratio"] = m.lor * inv;
    out["log_odds_chosen"] = m.loc * inv;
  }
  return out;
}

PrefOutcome paired_objective(const PreferenceSpec& s, const std::vector<PrefSeq>& seqs, const std::vector<double>& lp,
                             const std::vector<double>& ref) {
  PrefOutcome o;
  o.dlogp.assign(seqs.size(), 0.0);
  NllTerm nll;
  const std::vector<Pair> pairs = pairs_of(seqs, &nll);
  const size_t P = pairs.size();
  if (P == 0) return o;
  const double inv = 1.0 / double(P);
  nll_totals(seqs, lp, &nll);
  PairSums sums;
  for (const Pair& pr : pairs) {
    const PairTerms t = pair_terms(s, seqs, lp, ref, pr);
    sums.add(s, t);
    o.dlogp[pr.c] = t.dc * inv;
    o.dlogp[pr.r] = t.dr * inv;
  }
  o.loss = sums.loss * inv;
  const bool with_nll = add_nll_term(s, nll, &o);
  o.metrics = paired_metrics(s, sums, inv, with_nll, nll.nll);
  return o;
}

// KTO: rows are (rated completion, KL probe). kl = max(0, mean over the batch's probes of the
// policy-reference log-ratio), held constant; desirable rows lose 1 - sigmoid(beta (x - kl)),
// undesirable ones 1 - sigmoid(beta (kl - x)), weighted; the loss is the mean over rows.
PrefOutcome kto_objective(const PreferenceSpec& s, const std::vector<PrefSeq>& seqs, const std::vector<double>& lp,
                          const std::vector<double>& ref) {
  PrefOutcome o;
  const size_t R = seqs.size() / 2;
  o.dlogp.assign(seqs.size(), 0.0);
  if (R == 0) return o;
  double kl = 0;
  for (size_t i = 0; i < R; i++) kl += lp[2 * i + 1] - ref[2 * i + 1];
  kl = std::max(0.0, kl / double(R));
  const double beta = s.beta, inv = 1.0 / double(R);
  double sum_loss = 0, rc = 0, rr = 0, lpc = 0, lpr = 0;
  int64_t nc = 0, nr = 0;
  for (size_t i = 0; i < R; i++) {
    const double x = lp[2 * i] - ref[2 * i];
    if (seqs[2 * i].role == DocRole::Desirable) {
      const double sg = sigmoid(beta * (x - kl));
      sum_loss += s.desirable_weight * (1 - sg);
      o.dlogp[2 * i] = -s.desirable_weight * beta * sg * (1 - sg) * inv;
      rc += beta * x;
      lpc += lp[2 * i];
      nc++;
    } else {
      const double sg = sigmoid(beta * (kl - x));
      sum_loss += s.undesirable_weight * (1 - sg);
      o.dlogp[2 * i] = s.undesirable_weight * beta * sg * (1 - sg) * inv;
      rr += beta * x;
      lpr += lp[2 * i];
      nr++;
    }
  }
  o.loss = sum_loss * inv;
  o.metrics["kl"] = kl;
  if (nc) {
    o.metrics["rewards/chosen"] = rc / double(nc);
    o.metrics["logps/chosen"] = lpc / double(nc);
  }
  if (nr) {
    o.metrics["rewards/rejected"] = rr / double(nr);
    o.metrics["logps/rejected"] = lpr / double(nr);
  }
  if (nc && nr) o.metrics["rewards/margins"] = rc / double(nc) - rr / double(nr);
  return o;
}

}  // namespace

PrefOutcome preference_objective(const PreferenceSpec& spec, const std::vector<PrefSeq>& seqs,
                                 const std::vector<double>& logp, const std::vector<double>& ref_logp) {
  if (logp.size() != seqs.size() || (spec.uses_reference() && ref_logp.size() != seqs.size()))
    fail(ErrorKind::Internal, "preference objective", "log-probs do not match the sequences");
  return spec.method == Objective::Kto ? kto_objective(spec, seqs, logp, ref_logp)
                                        : paired_objective(spec, seqs, logp, ref_logp);
}

std::vector<float> position_weights(const std::vector<PrefSeq>& seqs, const std::vector<double>& dlogp,
                                    int64_t n_positions, double scale) {
  std::vector<float> w(size_t(n_positions), 0.0f);
  for (size_t s = 0; s < seqs.size(); s++)
    for (int64_t i = seqs[s].begin; i < seqs[s].end && i < n_positions; i++) w[size_t(i)] = float(-dlogp[s] * scale);
  return w;
}

void PrefMetricMeans::add(const std::map<std::string, double>& m) {
  for (const auto& [k, v] : m) {
    sum[k] += v;
    count[k]++;
  }
}

const std::vector<std::string>& preference_metric_names() {
  static const std::vector<std::string> names = {
      "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
      "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen", "kl"};
  return names;
}

std::vector<double> PrefMetricMeans::flat() const {
  const auto& names = preference_metric_names();
  std::vector<double> v(2 * names.size(), 0.0);
  for (size_t i = 0; i < names.size(); i++) {
    if (auto it = sum.find(names[i]); it != sum.end()) v[i] = it->second;
    if (auto it = count.find(names[i]); it != count.end()) v[names.size() + i] = double(it->second);
  }
  for (const auto& [k, c] : count)
    if (std::find(names.begin(), names.end(), k) == names.end())
      fail(ErrorKind::Internal, "preference metrics", "metric '" + k + "' is not in preference_metric_names()");
  return v;
}

PrefMetricMeans PrefMetricMeans::from_flat(const std::vector<double>& v) {
  const auto& names = preference_metric_names();
  QLORA_ASSERT(v.size() == 2 * names.size());
  PrefMetricMeans m;
  for (size_t i = 0; i < names.size(); i++)
    if (v[names.size() + i] > 0) {
      m.sum[names[i]] = v[i];
      m.count[names[i]] = int64_t(v[names.size() + i] + 0.5);
    }
  return m;
}

std::map<std::string, double> PrefMetricMeans::means() const {
  std::map<std::string, double> out;
  for (const auto& [k, v] : sum) out[k] = v / double(count.at(k));
  return out;
}

}  // namespace qlora
