// CPU SwiGLU, dropout and fused cross-entropy: references, PyTorch fixtures, finite differences.
#include "backend_test_util.h"
#include "core/error.h"

namespace qlora::test {
namespace {

TEST(CpuOps, swiglu_fwd_MatchesNaiveAndTorch) {
  auto be = cpu();
  Rng rng(30);
  const int64_t n = 4 * 33;
  Vec g = randn(rng, size_t(n), 3.0f), u = randn(rng, size_t(n)), out(static_cast<size_t>(n));
  be->swiglu_fwd({view(out, {4, 33}), view(g, {4, 33}), view(u, {4, 33}), n});
  std::vector<double> want(static_cast<size_t>(n));
  for (size_t i = 0; i < want.size(); i++) want[i] = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
  expect_close(out, want, 1e-6, 1e-6, "swiglu vs double");

  const auto& f = hf_fixture()["swiglu"];
  const int64_t fn = f["n"];
  Vec fg = fvec(f["gate"]), fu = fvec(f["up"]), fo(static_cast<size_t>(fn));
  be->swiglu_fwd({view(fo, {fn}), view(fg, {fn}), view(fu, {fn}), fn});
  expect_close(fo, fvec(f["out"]), 1e-7, 1e-6, "swiglu vs F.silu(gate)*up");
}

TEST(CpuOps, swiglu_bwd_MatchesFiniteDifferences) {
  auto be = cpu();
  Rng rng(31);
  const int64_t n = 150;
  Vec g = randn(rng, size_t(n), 2.5f), u = randn(rng, size_t(n)), w = randn(rng, size_t(n));
  Vec dg(static_cast<size_t>(n), 9.0f), du(static_cast<size_t>(n), 9.0f), out(static_cast<size_t>(n));
  be->swiglu_bwd({view(dg, {n}), view(du, {n}), view(w, {n}), view(g, {n}), view(u, {n}), n});
  auto loss = [&] {
    be->swiglu_fwd({view(out, {n}), view(g, {n}), view(u, {n}), n});
    return weighted_sum(w, out);
  };
  expect_grad_matches_fd("swiglu dgate", g, dg, loss, 1e-2f, 1e-4, 1e-3);
  expect_grad_matches_fd("swiglu dup", u, du, loss, 1e-2f, 1e-4, 1e-3);
}

DropoutArgs dropout_args(Vec& out, Vec& x, float p, uint64_t seed, uint64_t stream) {
  const int64_t n = int64_t(x.size());
  return {view(out, {n}), view(x, {n}), n, p, seed, stream};
}

TEST(CpuOps, dropout_fwd_MaskIsDeterministicAndKeepsOneMinusP) {
  auto be = cpu();
  Rng rng(32);
  const size_t n = 200000;
  const float p = 0.1f;
  Vec x = randn(rng, n), a(n), b(n), c(n);
  be->dropout_fwd(dropout_args(a, x, p, 42, 3));
  be->dropout_fwd(dropout_args(b, x, p, 42, 3));
  be->dropout_fwd(dropout_args(c, x, p, 42, 4));
  EXPECT_EQ(a, b) << "same (seed, stream) must give the same mask";
  size_t kept = 0, differ = 0;
  const float inv_keep = 1.0f / (1.0f - p);
  for (size_t i = 0; i < n; i++) {
    // The mask is the documented one: keep iff hash_uniform(seed, stream, i) >= p.
    const bool keep = hash_uniform(42, 3, i) >= p;
    ASSERT_EQ(a[i], keep ? x[i] * inv_keep : 0.0f) << i;
    kept += keep;
    differ += (a[i] != 0.0f) != (c[i] != 0.0f);
  }
  // Binomial: sd of the kept fraction is sqrt(p(1-p)/n) = 6.7e-4; allow ~7 sd.
  EXPECT_NEAR(double(kept) / double(n), 1.0 - p, 5e-3);
  // Another stream is an independent mask: they disagree on ~2p(1-p) = 18% of elements.
  EXPECT_NEAR(double(differ) / double(n), 2.0 * p * (1.0 - p), 1e-2);

  Vec copy(n);
  be->dropout_fwd(dropout_args(copy, x, 0.0f, 42, 3));
  EXPECT_EQ(copy, x) << "p = 0 copies";
  EXPECT_THROW(be->dropout_fwd(dropout_args(copy, x, 1.5f, 42, 3)), Error);
}

TEST(CpuOps, dropout_bwd_UsesTheForwardMask) {
  auto be = cpu();
  Rng rng(33);
  const size_t n = 500;
  const float p = 0.3f;
  Vec x = randn(rng, n), w = randn(rng, n), out(n), dx(n);
  be->dropout_bwd(dropout_args(dx, w, p, 9, 1));
  be->dropout_fwd(dropout_args(out, x, p, 9, 1));
  for (size_t i = 0; i < n; i++) EXPECT_EQ(dx[i] == 0.0f, out[i] == 0.0f) << i;
  auto loss = [&] {
    be->dropout_fwd(dropout_args(out, x, p, 9, 1));
    return weighted_sum(w, out);
  };
  expect_grad_matches_fd("dropout dx", x, dx, loss, 1e-2f, 1e-4, 1e-4);
}

// -log softmax(logits)[label] in double; ignored rows give 0.
std::vector<double> ce_ref(const Vec& logits, const std::vector<int32_t>& labels, int64_t v,
                           std::vector<double>& dlogits, double grad_scale) {
  std::vector<double> losses(labels.size());
  dlogits.assign(logits.size(), 0.0);
  for (size_t i = 0; i < labels.size(); i++) {
    if (labels[i] == -100) continue;
    double mx = -INFINITY, z = 0;
    for (int64_t j = 0; j < v; j++) mx = std::max(mx, double(logits[i * size_t(v) + size_t(j)]));
    for (int64_t j = 0; j < v; j++) z += std::exp(logits[i * size_t(v) + size_t(j)] - mx);
    losses[i] = std::log(z) + mx - logits[i * size_t(v) + size_t(labels[i])];
    for (int64_t j = 0; j < v; j++)
      dlogits[i * size_t(v) + size_t(j)] =
          grad_scale * (std::exp(logits[i * size_t(v) + size_t(j)] - mx) / z - (j == labels[i] ? 1.0 : 0.0));
  }
  return losses;
}

CrossEntropyArgs ce_args(Vec& logits, Vec& dlogits, Vec& losses, const std::vector<int32_t>& labels, int64_t v,
                         float gs) {
  const int64_t n = int64_t(labels.size());
  return {view(logits, {n, v}), view(dlogits, {n, v}), view(losses, {n}), labels.data(), n, v, gs};
}

TEST(CpuOps, cross_entropy_fwd_bwd_IgnoredRowsAndTorchParity) {
  auto be = cpu();
  Rng rng(34);
  const int64_t v = 50;
  const std::vector<int32_t> labels = {4, -100, 49, 0, -100, 17, 17};
  Vec logits = randn(rng, labels.size() * size_t(v), 4.0f);
  Vec dl(logits.size(), 5.0f), losses(labels.size(), 5.0f);
  be->cross_entropy_fwd_bwd(ce_args(logits, dl, losses, labels, v, 0.5f));
  std::vector<double> want_dl;
  auto want = ce_ref(logits, labels, v, want_dl, 0.5);
  expect_close(losses, want, 1e-6, 1e-6, "ce losses");
  expect_close(dl, want_dl, 1e-6 * 0.5, 1e-5, "ce dlogits");
  EXPECT_EQ(losses[1], 0.0f);
  for (int64_t j = 0; j < v; j++) EXPECT_EQ(dl[size_t(v + j)], 0.0f);

  // OpenMP path: many rows against the double reference.
  std::vector<int32_t> big_labels(300);
  for (size_t i = 0; i < big_labels.size(); i++) big_labels[i] = i % 7 == 3 ? -100 : int32_t(rng.below(uint64_t(v)));
  Vec big_logits = randn(rng, big_labels.size() * size_t(v), 4.0f), big_dl(big_logits.size()),
      big_losses(big_labels.size());
  be->cross_entropy_fwd_bwd(ce_args(big_logits, big_dl, big_losses, big_labels, v, 0.01f));
  std::vector<double> big_want_dl;
  expect_close(big_losses, ce_ref(big_logits, big_labels, v, big_want_dl, 0.01), 1e-6, 1e-6, "ce parallel losses");
  // dlogits = gs (p - onehot) with p in [0,1] computed in f32 (as torch does): at the label, p near 1
  // loses its low bits to the subtraction, so the bound is a few f32 ulps of 1, times gs.
  expect_close(big_dl, big_want_dl, 1e-6 * 0.01, 1e-5, "ce parallel dlogits");

  // dlogits may overwrite logits.
  Vec inplace = logits;
  be->cross_entropy_fwd_bwd(ce_args(inplace, inplace, losses, labels, v, 0.5f));
  expect_close(inplace, dl, 0.0, 0.0, "ce in place");
  expect_close(losses, want, 1e-6, 1e-6, "ce losses in place");

  const auto& f = hf_fixture()["cross_entropy"];
  const int64_t fv = f["vocab"];
  auto flabels = f["labels"].get<std::vector<int32_t>>();
  Vec fl = fvec(f["logits"]), fdl(fl.size()), floss(flabels.size());
  be->cross_entropy_fwd_bwd(ce_args(fl, fdl, floss, flabels, fv, float(f["grad_scale"].get<double>())));
  expect_close(floss, fvec(f["losses"]), 2e-6, 1e-6, "ce losses vs F.cross_entropy");
  expect_close(fdl, fvec(f["dlogits"]), 1e-7, 1e-5, "ce dlogits vs torch autograd");
}

TEST(CpuOps, cross_entropy_fwd_bwd_GradientMatchesFiniteDifferences) {
  auto be = cpu();
  Rng rng(35);
  const int64_t v = 13;
  const std::vector<int32_t> labels = {2, 12, -100, 0};
  const float gs = 0.7f;
  Vec logits = randn(rng, labels.size() * size_t(v), 2.0f), dl(logits.size()), losses(labels.size());
  be->cross_entropy_fwd_bwd(ce_args(logits, dl, losses, labels, v, gs));
  Vec scratch(logits.size()), l2(labels.size());
  auto loss = [&] {
    be->cross_entropy_fwd_bwd(ce_args(logits, scratch, l2, labels, v, gs));
    double s = 0;
    for (float x : l2) s += double(gs) * x;
    return s;
  };
  expect_grad_matches_fd("ce dlogits", logits, dl, loss, 1e-2f, 1e-4, 2e-3);
}

TEST(CpuOps, cross_entropy_fwd_bwd_RejectsBadLabels) {
  auto be = cpu();
  Vec logits(2 * 4, 0.5f), dl(8), losses(2);
  for (int32_t bad : {4, -1, -99}) {
    std::vector<int32_t> labels = {1, bad};
    try {
      be->cross_entropy_fwd_bwd(ce_args(logits, dl, losses, labels, 4, 1.0f));
      ADD_FAILURE() << "no error for label " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Data);
      EXPECT_NE(e.where().find("row 1"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace qlora::test
