// CPU mixture-of-experts ops against references written here: top-k routing and the expert-sorted
// layout, the routing backward against finite differences in double, and the row movers.
#include <numeric>

#include "backend_test_util.h"

namespace qlora::test {
namespace {

Tensor i32_view(std::vector<int32_t>& v) { return Tensor(v.data(), DType::I32, {int64_t(v.size())}); }

struct Routed {
  std::vector<int32_t> expert, row, token, offsets;
  Vec weight, row_weight;
};

Routed route(Backend& be, Vec& logits, int64_t n, int64_t e, int64_t k, bool norm) {
  Routed r;
  r.expert.assign(size_t(n * k), -1);
  r.row.assign(size_t(n * k), -1);
  r.token.assign(size_t(n * k), -1);
  r.offsets.assign(size_t(e + 1), -1);
  r.weight.assign(size_t(n * k), -1.0f);
  r.row_weight.assign(size_t(n * k), -1.0f);
  be.moe_route_fwd({view(logits, {n, e}), i32_view(r.expert), view(r.weight, {n * k}), i32_view(r.row),
                    i32_view(r.token), view(r.row_weight, {n * k}), i32_view(r.offsets), n, e, k, norm});
  return r;
}

// softmax in double, then the top k (descending, lower expert first among equals).
std::vector<std::pair<int, double>> topk_ref(const float* l, int64_t e, int64_t k, bool norm) {
  std::vector<double> p(static_cast<size_t>(e));
  double mx = -INFINITY, z = 0;
  for (int64_t i = 0; i < e; i++) mx = std::max(mx, double(l[i]));
  for (int64_t i = 0; i < e; i++) z += (p[size_t(i)] = std::exp(double(l[i]) - mx));
  std::vector<int> idx(static_cast<size_t>(e));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
  double zk = 0;
  for (int64_t j = 0; j < k; j++) zk += p[size_t(idx[size_t(j)])] / z;
  std::vector<std::pair<int, double>> out;
  for (int64_t j = 0; j < k; j++) out.push_back({idx[size_t(j)], p[size_t(idx[size_t(j)])] / z / (norm ? zk : 1.0)});
  return out;
}

TEST(CpuOps, moe_route_fwd_TopKAndExpertSortedLayout) {
  Rng rng(5);
  const int64_t n = 37, e = 8, k = 3;
  Vec logits = randn(rng, size_t(n * e), 2.0f);
  logits[size_t(4 * e + 2)] = logits[size_t(4 * e + 6)] = 9.0f;  // a tie on top: expert 2 before 6
  for (int64_t t = 0; t < n; t++) logits[size_t(t * e + 7)] = -20.0f;  // expert 7 gets no token
  for (bool norm : {true, false}) {
    auto be = cpu();
    const Routed r = route(*be, logits, n, e, k, norm);
    std::vector<int32_t> count(size_t(e), 0);
    for (int64_t t = 0; t < n; t++) {
      const auto want = topk_ref(logits.data() + t * e, e, k, norm);
      for (int64_t j = 0; j < k; j++) {
        const size_t i = size_t(t * k + j);
        EXPECT_EQ(r.expert[i], want[size_t(j)].first) << "token " << t << " choice " << j;
        EXPECT_NEAR(r.weight[i], want[size_t(j)].second, 1e-6) << "token " << t << " choice " << j;
        // The sorted layout: row i of the pair lies in its expert's range and points back to it.
        const int32_t row = r.row[i], ex = r.expert[i];
        EXPECT_GE(row, r.offsets[size_t(ex)]);
        EXPECT_LT(row, r.offsets[size_t(ex) + 1]);
        EXPECT_EQ(r.token[size_t(row)], t);
        EXPECT_EQ(r.row_weight[size_t(row)], r.weight[i]);
        count[size_t(ex)]++;
      }
    }
    EXPECT_EQ(r.expert[size_t(4 * k)], 2);
    EXPECT_EQ(r.expert[size_t(4 * k + 1)], 6);
    EXPECT_EQ(r.offsets[0], 0);
    for (int64_t x = 0; x < e; x++) EXPECT_EQ(r.offsets[size_t(x) + 1] - r.offsets[size_t(x)], count[size_t(x)]);
    EXPECT_EQ(count[7], 0);
    EXPECT_EQ(r.offsets[size_t(e)], n * k);
    for (int64_t x = 0; x < e; x++)  // an expert's rows in token order
      for (int32_t row = r.offsets[size_t(x)] + 1; row < r.offsets[size_t(x) + 1]; row++)
        EXPECT_LT(r.token[size_t(row - 1)], r.token[size_t(row)]) << "expert " << x << " row " << row;
  }
}

// The function moe_route_bwd differentiates, in double, with the choice held fixed:
// sum_tj g_tj w_tj(l), w the chosen p (renormalised with norm), plus sum_t mask_t sum_e aux_e p_te
// when aux is given (mask empty: 1).
double routing_objective(const std::vector<double>& l, const Vec& g, const std::vector<int32_t>& expert, int64_t n,
                         int64_t e, int64_t k, bool norm, const Vec& aux = {}, const Vec& mask = {}) {
  double s = 0;
  for (int64_t t = 0; t < n; t++) {
    double mx = -INFINITY, z = 0, zk = 0;
    for (int64_t i = 0; i < e; i++) mx = std::max(mx, l[size_t(t * e + i)]);
    for (int64_t i = 0; i < e; i++) z += std::exp(l[size_t(t * e + i)] - mx);
    for (int64_t j = 0; j < k; j++) zk += std::exp(l[size_t(t * e + expert[size_t(t * k + j)])] - mx) / z;
    for (int64_t j = 0; j < k; j++)
      s += g[size_t(t * k + j)] * std::exp(l[size_t(t * e + expert[size_t(t * k + j)])] - mx) / z / (norm ? zk : 1.0);
    for (size_t i = 0; i < aux.size(); i++)
      s += (mask.empty() ? 1.0 : double(mask[size_t(t)])) * aux[i] * std::exp(l[size_t(t * e) + i] - mx) / z;
  }
  return s;
}

// dl against central differences of f at the logits (step 1e-6, absolute bound 2e-6); returns the
// largest |dl|.
template <class F>
double expect_matches_central_differences(const Vec& dl, const Vec& logits, F f, const std::string& what) {
  std::vector<double> l(logits.begin(), logits.end());
  double largest = 0;
  for (size_t i = 0; i < l.size(); i++) {
    const double h = 1e-6, keep = l[i];
    l[i] = keep + h;
    const double up = f(l);
    l[i] = keep - h;
    const double down = f(l);
    l[i] = keep;
    EXPECT_NEAR(dl[i], (up - down) / (2 * h), 2e-6) << "logit " << i << what;
    largest = std::max(largest, double(std::fabs(dl[i])));
  }
  return largest;
}

TEST(CpuOps, moe_route_bwd_FiniteDifferences) {
  Rng rng(6);
  const int64_t n = 9, e = 6, k = 2;
  Vec logits = randn(rng, size_t(n * e), 1.5f), g = randn(rng, size_t(n * k));
  for (bool norm : {true, false}) {
    auto be = cpu();
    const Routed r = route(*be, logits, n, e, k, norm);
    Vec dl(size_t(n * e), NAN);
    std::vector<int32_t> expert = r.expert;
    be->moe_route_bwd({view(dl, {n, e}), view(g, {n * k}), view(logits, {n, e}), i32_view(expert), n, e, k, norm});
    expect_matches_central_differences(
        dl, logits, [&](const std::vector<double>& l) { return routing_objective(l, g, expert, n, e, k, norm); },
        norm ? " renormalised" : "");
  }
}

// The load-balancing loss's pieces: moe_router_stats adds each counted token's probabilities and
// choices (a masked token none), and moe_route_bwd with aux_grad adds the gradient of
// sum_t mask[t] sum_e aux_grad[e] p[t,e] to the routing weights' (finite differences in double).
TEST(CpuOps, moe_router_stats_AndTheAuxGradientMatchReferences) {
  Rng rng(7);
  const int64_t n = 9, e = 6, k = 2;
  Vec logits = randn(rng, size_t(n * e), 1.5f), g = randn(rng, size_t(n * k)), aux = randn(rng, size_t(e));
  Vec mask(size_t(n), 1.0f);
  mask[3] = mask[7] = 0.0f;
  auto be = cpu();
  const Routed r = route(*be, logits, n, e, k, true);
  std::vector<int32_t> expert = r.expert;
  Vec ps(size_t(e), 0.5f), cs(size_t(e), 2.0f);  // "+=": a previous layer's sums
  be->moe_router_stats({view(ps, {e}), view(cs, {e}), view(logits, {n, e}), i32_view(expert), view(mask, {n}), n, e, k});
  for (int64_t x = 0; x < e; x++) {
    double p = 0, c = 0;
    for (int64_t t = 0; t < n; t++) {
      if (mask[size_t(t)] == 0) continue;
      double mx = -INFINITY, z = 0;
      for (int64_t i = 0; i < e; i++) mx = std::max(mx, double(logits[size_t(t * e + i)]));
      for (int64_t i = 0; i < e; i++) z += std::exp(double(logits[size_t(t * e + i)]) - mx);
      p += std::exp(double(logits[size_t(t * e + x)]) - mx) / z;
      for (int64_t j = 0; j < k; j++) c += expert[size_t(t * k + j)] == x;
    }
    EXPECT_NEAR(ps[size_t(x)], 0.5 + p, 1e-6) << "expert " << x;
    EXPECT_EQ(cs[size_t(x)], 2.0 + c) << "expert " << x;
  }
  Vec dl(size_t(n * e), NAN);
  MoeRouteBwdArgs a{view(dl, {n, e}), view(g, {n * k}), view(logits, {n, e}), i32_view(expert), n, e, k, true};
  a.aux_grad = view(aux, {e});
  a.mask = view(mask, {n});
  be->moe_route_bwd(a);
  const double moved = expect_matches_central_differences(
      dl, logits, [&](const std::vector<double>& l) { return routing_objective(l, g, expert, n, e, k, true, aux, mask); },
      " with the aux gradient");
  EXPECT_GT(moved, 0.01);
}

TEST(CpuOps, gather_rows_ScaledAndPlain) {
  Rng rng(7);
  const int64_t rows = 5, c = 11, m = 7;
  Vec src = randn(rng, size_t(rows * c)), scale = randn(rng, size_t(m));
  std::vector<int32_t> index = {4, 0, 0, 3, 1, 4, 2};
  auto be = cpu();
  for (bool scaled : {true, false}) {
    Vec dst(size_t(m * c), NAN);
    be->gather_rows({view(dst, {m, c}), view(src, {rows, c}), scaled ? view(scale, {m}) : Tensor(), index.data(), m, c});
    for (int64_t r = 0; r < m; r++)
      for (int64_t i = 0; i < c; i++)
        EXPECT_EQ(dst[size_t(r * c + i)], src[size_t(index[size_t(r)] * c + i)] * (scaled ? scale[size_t(r)] : 1.0f));
  }
  Vec dst(static_cast<size_t>(c));
  std::vector<int32_t> bad = {rows};
  EXPECT_THROW(be->gather_rows({view(dst, {1, c}), view(src, {rows, c}), Tensor(), bad.data(), 1, c}), Error);
}

TEST(CpuOps, combine_rows_WeightedSumAndAccumulate) {
  Rng rng(8);
  const int64_t n = 6, k = 3, c = 13, m = n * k;
  Vec src = randn(rng, size_t(m * c)), w = randn(rng, size_t(n * k)), base = randn(rng, size_t(n * c));
  std::vector<int32_t> row(static_cast<size_t>(m));
  std::iota(row.begin(), row.end(), 0);
  std::reverse(row.begin(), row.end());
  auto be = cpu();
  for (int mode = 0; mode < 3; mode++) {  // weighted "=", unweighted "=", weighted "+="
    Vec out = mode == 2 ? base : Vec(size_t(n * c), NAN);
    be->combine_rows({view(out, {n, c}), view(src, {m, c}), mode == 1 ? Tensor() : view(w, {n * k}), row.data(), n, k, c,
                      mode == 2});
    for (int64_t t = 0; t < n; t++)
      for (int64_t i = 0; i < c; i++) {
        double want = mode == 2 ? base[size_t(t * c + i)] : 0.0;
        for (int64_t j = 0; j < k; j++)
          want += (mode == 1 ? 1.0 : double(w[size_t(t * k + j)])) * src[size_t(row[size_t(t * k + j)] * c + i)];
        EXPECT_NEAR(out[size_t(t * c + i)], want, 1e-5 * (1 + std::fabs(want)));
      }
  }
}

TEST(CpuOps, row_dots_PerChoice) {
  Rng rng(9);
  const int64_t n = 5, k = 2, c = 17, m = 12;
  Vec a = randn(rng, size_t(n * c)), b = randn(rng, size_t(m * c)), out(size_t(n * k), NAN);
  std::vector<int32_t> row = {3, 11, 0, 0, 7, 2, 5, 9, 1, 10};
  cpu()->row_dots({view(out, {n, k}), view(a, {n, c}), view(b, {m, c}), row.data(), n, k, c});
  for (int64_t t = 0; t < n; t++)
    for (int64_t j = 0; j < k; j++) {
      double want = 0;
      for (int64_t i = 0; i < c; i++) want += double(a[size_t(t * c + i)]) * b[size_t(row[size_t(t * k + j)] * c + i)];
      EXPECT_NEAR(out[size_t(t * k + j)], want, 1e-5 * (1 + std::fabs(want)));
    }
}

}  // namespace
}  // namespace qlora::test
