// Helpers for the CPU backend op tests: random buffers, f32 views, fixtures and finite differences.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <omp.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"

namespace qlora::test {

using Vec = std::vector<float>;

// Normal(0, sd) values, rejected near zero so no test runs on (near-)zero inputs.
inline Vec randn(Rng& rng, size_t n, float sd = 1.0f) {
  Vec v(n);
  for (auto& x : v) {
    do x = rng.normal() * sd;
    while (std::fabs(x) < 1e-3f * sd);
  }
  return v;
}

inline Tensor view(Vec& v, std::initializer_list<int64_t> dims) { return f32_view(v.data(), dims); }

inline double weighted_sum(const Vec& w, const Vec& out) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); i++) s += double(w[i]) * double(out[i]);
  return s;
}

inline std::unique_ptr<Backend> cpu() { return make_cpu_backend(); }

// Runs f with an OpenMP team of n threads, then restores the previous setting. Ops write every
// output element from exactly one thread, so any n must give bit-identical results.
template <class F> void with_omp_threads(int n, F&& f) {
  const int old = omp_get_max_threads();
  omp_set_num_threads(n);
  f();
  omp_set_num_threads(old);
}

inline const nlohmann::json& hf_fixture() {
  static const nlohmann::json j = [] {
    std::ifstream f(std::string(QLORA_FIXTURES) + "/backend/hf_ops.json");
    if (!f) throw std::runtime_error("missing fixture tests/fixtures/backend/hf_ops.json");
    return nlohmann::json::parse(f);
  }();
  return j;
}
inline Vec fvec(const nlohmann::json& j) { return j.get<Vec>(); }

// |got - want| <= atol + rtol*|want| elementwise, reporting the first few offenders.
inline void expect_close(const Vec& got, const std::vector<double>& want, double atol, double rtol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i])) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i] << " err " << err;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements out of tolerance";
}
inline void expect_close(const Vec& got, const Vec& want, double atol, double rtol, const std::string& what) {
  expect_close(got, std::vector<double>(want.begin(), want.end()), atol, rtol, what);
}

// Central-difference check of an analytic gradient. loss() evaluates L with the current contents
// of x (it runs the forward op in f32 and sums in double). Each checked element is perturbed by
// +-h (the step actually taken after f32 rounding is used), then restored.
// Checks every element when x.size() <= max_checks, else a random subset of max_checks.
inline void expect_grad_matches_fd(const std::string& what, Vec& x, const Vec& analytic,
                                   const std::function<double()>& loss, float h, double atol,
                                   double rtol, size_t max_checks = 1u << 30, uint64_t seed = 7) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::vector<size_t> idx(x.size());
  for (size_t i = 0; i < idx.size(); i++) idx[i] = i;
  if (idx.size() > max_checks) {
    Rng rng(seed);
    for (size_t i = 0; i < max_checks; i++) std::swap(idx[i], idx[i + rng.below(idx.size() - i)]);
    idx.resize(max_checks);
  }
  int bad = 0;
  double worst = 0.0;
  for (size_t i : idx) {
    const float x0 = x[i], xp = x0 + h, xm = x0 - h;
    x[i] = xp;
    const double lp = loss();
    x[i] = xm;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (double(xp) - double(xm));
    const double err = std::fabs(fd - double(analytic[i]));
    worst = std::max(worst, err / (atol + rtol * std::fabs(fd)));
    if (!(err <= atol + rtol * std::fabs(fd)) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " finite difference " << fd;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << idx.size() << " gradient entries disagree";
  EXPECT_LE(worst, 1.0) << what;
}

}  // namespace qlora::test
