// CPU embedding, RMSNorm and RoPE: naive references, Hugging Face fixtures and finite differences.
#include "backend_test_util.h"
#include "core/error.h"

namespace qlora::test {
namespace {

TEST(CpuOps, embedding_fwd_GathersRows) {
  auto be = cpu();
  Rng rng(10);
  const int64_t vocab = 11, c = 6, n = 8;
  Vec table = randn(rng, size_t(vocab * c)), out = randn(rng, size_t(n * c));
  std::vector<int32_t> tok = {3, 0, 10, 3, 7, 7, 1, 9};
  be->embedding_fwd({view(out, {n, c}), view(table, {vocab, c}), tok.data(), n, c, vocab});
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < c; j++) EXPECT_EQ(out[size_t(i * c + j)], table[size_t(tok[size_t(i)] * c + j)]);
}

TEST(CpuOps, embedding_fwd_RejectsOutOfRangeTokens) {
  auto be = cpu();
  Vec table(4 * 2, 1.0f), out(2 * 2);
  for (int32_t bad : {-1, 4, 1000}) {
    std::vector<int32_t> tok = {1, bad};
    try {
      be->embedding_fwd({view(out, {2, 2}), view(table, {4, 2}), tok.data(), 2, 2, 4});
      ADD_FAILURE() << "no error for token " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Data);
      EXPECT_NE(e.message().find(std::to_string(bad)), std::string::npos) << e.what();
      EXPECT_NE(e.message().find("size 4"), std::string::npos) << e.what();
      EXPECT_NE(e.where().find("token 1"), std::string::npos) << e.what();
    }
  }
}

TEST(CpuOps, embedding_bwd_ScatterAddMatchesFiniteDifferences) {
  auto be = cpu();
  Rng rng(11);
  const int64_t vocab = 9, c = 5, n = 10;
  std::vector<int32_t> tok = {2, 2, 8, 0, 2, 5, 8, 1, 0, 4};  // repeats must accumulate
  Vec table = randn(rng, size_t(vocab * c)), w = randn(rng, size_t(n * c));
  Vec dtable0 = randn(rng, size_t(vocab * c)), dtable = dtable0;  // "+=" onto prior contents
  be->embedding_bwd({view(dtable, {vocab, c}), view(w, {n, c}), tok.data(), n, c, vocab});
  Vec grad(dtable.size());
  for (size_t i = 0; i < grad.size(); i++) grad[i] = dtable[i] - dtable0[i];
  Vec out(size_t(n * c));
  auto loss = [&] {
    be->embedding_fwd({view(out, {n, c}), view(table, {vocab, c}), tok.data(), n, c, vocab});
    return weighted_sum(w, out);
  };
  // Linear op: the only finite-difference error is f32 rounding of the step.
  expect_grad_matches_fd("embedding dtable", table, grad, loss, 1e-2f, 1e-4, 1e-4);
  // Parallel path (threads split columns): many repeats of few tokens against a double scatter.
  const int64_t big_n = 300, big_c = 130;
  std::vector<int32_t> big_tok(static_cast<size_t>(big_n));
  for (auto& t : big_tok) t = int32_t(rng.below(uint64_t(vocab)));
  Vec big_dout = randn(rng, size_t(big_n * big_c)), big_dtable(size_t(vocab * big_c), 0.5f);
  std::vector<double> want(big_dtable.begin(), big_dtable.end());
  for (int64_t i = 0; i < big_n; i++)
    for (int64_t j = 0; j < big_c; j++)
      want[size_t(big_tok[size_t(i)] * big_c + j)] += big_dout[size_t(i * big_c + j)];
  be->embedding_bwd({view(big_dtable, {vocab, big_c}), view(big_dout, {big_n, big_c}), big_tok.data(), big_n,
                     big_c, vocab});
  expect_close(big_dtable, want, 2e-5, 1e-6, "embedding_bwd parallel scatter");

  std::vector<int32_t> bad = tok;
  bad[3] = int32_t(vocab);
  EXPECT_THROW(be->embedding_bwd({view(dtable, {vocab, c}), view(w, {n, c}), bad.data(), n, c, vocab}), Error);
}

// out = w * x / sqrt(mean(x^2) + eps) in double.
std::vector<double> rmsnorm_ref(const Vec& x, const Vec& w, int64_t n, int64_t c, double eps,
                                std::vector<double>* rstd = nullptr) {
  std::vector<double> out(x.size());
  for (int64_t i = 0; i < n; i++) {
    double ss = 0;
    for (int64_t j = 0; j < c; j++) ss += double(x[size_t(i * c + j)]) * x[size_t(i * c + j)];
    const double r = 1.0 / std::sqrt(ss / double(c) + eps);
    if (rstd) rstd->push_back(r);
    for (int64_t j = 0; j < c; j++) out[size_t(i * c + j)] = double(w[size_t(j)]) * x[size_t(i * c + j)] * r;
  }
  return out;
}

TEST(CpuOps, rmsnorm_fwd_MatchesNaiveAndHuggingFace) {
  auto be = cpu();
  Rng rng(12);
  const int64_t n = 70, c = 300;  // above the OpenMP threshold
  Vec x = randn(rng, size_t(n * c), 2.0f), w = randn(rng, size_t(c)), out(x.size()), rstd(static_cast<size_t>(n));
  be->rmsnorm_fwd({view(out, {n, c}), view(rstd, {n}), view(x, {n, c}), view(w, {c}), n, c, 1e-5f});
  std::vector<double> want_rstd;
  expect_close(out, rmsnorm_ref(x, w, n, c, 1e-5, &want_rstd), 1e-6, 1e-6, "rmsnorm out");
  expect_close(rstd, want_rstd, 0.0, 1e-6, "rmsnorm rstd");

  const auto& f = hf_fixture()["rmsnorm"];
  const int64_t hn = f["n"], hc = f["c"];
  Vec hx = fvec(f["x"]), hw = fvec(f["w"]), hout(hx.size()), hr(static_cast<size_t>(hn));
  be->rmsnorm_fwd({view(hout, {hn, hc}), view(hr, {hn}), view(hx, {hn, hc}), view(hw, {hc}), hn, hc,
                   float(f["eps"].get<double>())});
  // Same f32 recipe as LlamaRMSNorm; only the order of the mean's sum differs (a few ulp).
  expect_close(hout, fvec(f["out"]), 1e-6, 1e-6, "rmsnorm vs LlamaRMSNorm");
}

void check_rmsnorm_bwd(int64_t n, int64_t c, size_t max_checks) {
  auto be = cpu();
  Rng rng(uint64_t(13 + n));
  Vec x = randn(rng, size_t(n * c), 1.5f), wt = randn(rng, size_t(c)), dout = randn(rng, size_t(n * c));
  Vec out(x.size()), rstd(static_cast<size_t>(n));
  auto fwd = [&] {
    be->rmsnorm_fwd({view(out, {n, c}), view(rstd, {n}), view(x, {n, c}), view(wt, {c}), n, c, 1e-5f});
  };
  fwd();
  Vec dx(x.size()), dw0 = randn(rng, size_t(c)), dw = dw0;
  be->rmsnorm_bwd({view(dx, {n, c}), view(dw, {c}), view(dout, {n, c}), view(x, {n, c}), view(wt, {c}),
                   view(rstd, {n}), n, c});
  Vec gw(static_cast<size_t>(c));
  for (size_t j = 0; j < gw.size(); j++) gw[j] = dw[j] - dw0[j];
  auto loss = [&] { fwd(); return weighted_sum(dout, out); };
  // h=1e-2 on O(1) inputs: truncation ~1e-5, f32 noise ~1e-5; real mistakes are O(0.1).
  expect_grad_matches_fd("rmsnorm dx", x, dx, loss, 1e-2f, 2e-4, 2e-3, max_checks);
  expect_grad_matches_fd("rmsnorm dw", wt, gw, loss, 1e-2f, 2e-4, 2e-3, max_checks);

  // Frozen weight (empty dw) gives the same dx; dx may overwrite dout in place.
  fwd();
  Vec inplace = dout;
  be->rmsnorm_bwd({view(inplace, {n, c}), Tensor(), view(inplace, {n, c}), view(x, {n, c}), view(wt, {c}),
                   view(rstd, {n}), n, c});
  expect_close(inplace, dx, 0.0, 0.0, "rmsnorm dx in place, no dw");
}

TEST(CpuOps, rmsnorm_bwd_MatchesFiniteDifferences) {
  check_rmsnorm_bwd(6, 20, 1u << 30);
  check_rmsnorm_bwd(40, 450, 12);  // OpenMP path, random subset of entries
}

TEST(CpuOps, rmsnorm_bwd_ParallelPathIsRaceFree) {
  auto be = cpu();
  Rng rng(16);
  const int64_t n = 40, c = 450;
  Vec x = randn(rng, size_t(n * c)), wt = randn(rng, size_t(c)), dout = randn(rng, size_t(n * c));
  auto run = [&](int threads, Vec& dx, Vec& dw) {
    Vec out(x.size()), rstd(static_cast<size_t>(n));
    dx.assign(x.size(), 0.0f);
    dw.assign(static_cast<size_t>(c), 0.25f);
    with_omp_threads(threads, [&] {
      be->rmsnorm_fwd({view(out, {n, c}), view(rstd, {n}), view(x, {n, c}), view(wt, {c}), n, c, 1e-5f});
      be->rmsnorm_bwd({view(dx, {n, c}), view(dw, {c}), view(dout, {n, c}), view(x, {n, c}), view(wt, {c}),
                       view(rstd, {n}), n, c});
    });
  };
  Vec dx1, dw1, dx3, dw3;
  run(1, dx1, dw1);
  run(3, dx3, dw3);
  EXPECT_EQ(dx1, dx3);
  EXPECT_EQ(dw1, dw3);
}

// Rotation with the angle rounded to f32 first (HF's recipe), the rest in double: the first `rot`
// dims of each head (0: all), cos and sin times `scale`.
std::vector<double> rope_ref(const Vec& x, const Vec& inv_freq, const std::vector<int32_t>& pos, int64_t n,
                             int64_t h, int64_t d, int64_t rot = 0, double scale = 1.0) {
  std::vector<double> out(x.begin(), x.end());
  const int64_t half = (rot > 0 ? rot : d) / 2;
  for (int64_t i = 0; i < n; i++)
    for (int64_t hh = 0; hh < h; hh++)
      for (int64_t j = 0; j < half; j++) {
        const float ang = float(pos[size_t(i)]) * inv_freq[size_t(j)];
        const double c = scale * std::cos(double(ang)), s = scale * std::sin(double(ang));
        const size_t o = size_t((i * h + hh) * d + j);
        out[o] = x[o] * c - double(x[o + size_t(half)]) * s;
        out[o + size_t(half)] = double(x[o + size_t(half)]) * c + x[o] * s;
      }
  return out;
}

TEST(CpuOps, rope_fwd_RestartingPositionsMatchNaiveAndHuggingFace) {
  auto be = cpu();
  Rng rng(14);
  const int64_t n = 9, h = 3, d = 16;
  Vec inv_freq(size_t(d / 2));
  for (int64_t j = 0; j < d / 2; j++) inv_freq[size_t(j)] = float(std::pow(10000.0, -2.0 * double(j) / double(d)));
  std::vector<int32_t> pos = {0, 1, 2, 3, 0, 1, 0, 1, 2};  // packed documents restart at 0
  Vec x = randn(rng, size_t(n * h * d)), y = x;
  be->rope_fwd({view(y, {n, h, d}), view(inv_freq, {d / 2}), pos.data(), n, h, d});
  expect_close(y, rope_ref(x, inv_freq, pos, n, h, d), 1e-6, 1e-6, "rope vs naive");
  for (int64_t j = 0; j < h * d; j++) EXPECT_EQ(y[size_t(j)], x[size_t(j)]) << "position 0 is the identity";
  // OpenMP path: many tokens, positions restarting every 37.
  const int64_t big_n = 400;
  std::vector<int32_t> big_pos(static_cast<size_t>(big_n));
  for (int64_t i = 0; i < big_n; i++) big_pos[size_t(i)] = int32_t(i % 37);
  Vec bx = randn(rng, size_t(big_n * h * d)), by = bx;
  be->rope_fwd({view(by, {big_n, h, d}), view(inv_freq, {d / 2}), big_pos.data(), big_n, h, d});
  expect_close(by, rope_ref(bx, inv_freq, big_pos, big_n, h, d), 1e-6, 1e-6, "rope parallel vs naive");

  const auto& f = hf_fixture()["rope"];
  ASSERT_EQ(f["attention_scaling"].get<double>(), 1.0);
  const int64_t hn = f["n"], hh = f["n_head"], hd = f["head_dim"];
  Vec hx = fvec(f["x"]), hf_inv = fvec(f["inv_freq"]);
  auto hpos = f["positions"].get<std::vector<int32_t>>();
  be->rope_fwd({view(hx, {hn, hh, hd}), view(hf_inv, {hd / 2}), hpos.data(), hn, hh, hd});
  // Positions up to 4095 with Llama-3 scaled inv_freq: within 1e-5 of HF only with the f32 angle.
  expect_close(hx, fvec(f["out"]), 1e-5, 0.0, "rope vs HF apply_rotary_pos_emb");
}

TEST(CpuOps, rope_bwd_InverseRotationMatchesFiniteDifferences) {
  auto be = cpu();
  Rng rng(15);
  const int64_t n = 7, h = 2, d = 8;
  Vec inv_freq = {1.0f, 0.31f, 0.1f, 0.0316f};
  std::vector<int32_t> pos = {5, 6, 7, 0, 1, 2, 4000};
  Vec x = randn(rng, size_t(n * h * d)), w = randn(rng, x.size());
  Vec grad = w;
  be->rope_bwd({view(grad, {n, h, d}), view(inv_freq, {d / 2}), pos.data(), n, h, d});
  Vec y(x.size());
  auto loss = [&] {
    y = x;
    be->rope_fwd({view(y, {n, h, d}), view(inv_freq, {d / 2}), pos.data(), n, h, d});
    return weighted_sum(w, y);
  };
  expect_grad_matches_fd("rope dx", x, grad, loss, 1e-2f, 1e-4, 1e-4);
  // bwd undoes fwd (rotations are orthogonal).
  Vec z = x;
  be->rope_fwd({view(z, {n, h, d}), view(inv_freq, {d / 2}), pos.data(), n, h, d});
  be->rope_bwd({view(z, {n, h, d}), view(inv_freq, {d / 2}), pos.data(), n, h, d});
  expect_close(z, x, 1e-6, 1e-6, "rope bwd(fwd(x))");
}

// Phi-4-mini's partial rotary (the first 10 of 16 dims here; pairs j, j + 5) with LongRoPE's
// attention factor on cos and sin: the rotated dims match the naive rotation, the others pass
// unchanged, and the backward is the forward's transpose (finite differences).
TEST(CpuOps, rope_PartialRotaryWithAttentionFactorMatchesNaiveAndFiniteDifferences) {
  auto be = cpu();
  Rng rng(16);
  const int64_t n = 6, h = 3, d = 16, rot = 10;
  const float scale = 1.19024f;
  Vec inv_freq = {1.0f, 0.4f, 0.13f, 0.05f, 0.011f};
  std::vector<int32_t> pos = {0, 3, 9, 1, 17, 40};
  Vec x = randn(rng, size_t(n * h * d)), y = x;
  be->rope_fwd({view(y, {n, h, d}), view(inv_freq, {rot / 2}), pos.data(), n, h, d, rot, scale});
  expect_close(y, rope_ref(x, inv_freq, pos, n, h, d, rot, scale), 1e-6, 1e-6, "partial rope vs naive");
  for (int64_t t = 0; t < n * h; t++)
    for (int64_t j = rot; j < d; j++) EXPECT_EQ(y[size_t(t * d + j)], x[size_t(t * d + j)]) << "dim " << j << " passes";
  EXPECT_NEAR(y[size_t(0)], scale * x[size_t(0)], 1e-6) << "position 0: cos 1 times the factor";
  Vec w = randn(rng, x.size()), grad = w;
  be->rope_bwd({view(grad, {n, h, d}), view(inv_freq, {rot / 2}), pos.data(), n, h, d, rot, scale});
  Vec z(x.size());
  auto loss = [&] {
    z = x;
    be->rope_fwd({view(z, {n, h, d}), view(inv_freq, {rot / 2}), pos.data(), n, h, d, rot, scale});
    return weighted_sum(w, z);
  };
  expect_grad_matches_fd("partial rope dx", x, grad, loss, 1e-2f, 1e-4, 1e-4);
  Vec odd = x;  // an odd rotary count has no pairs
  EXPECT_THROW(be->rope_fwd({view(odd, {n, h, d}), view(inv_freq, {2}), pos.data(), n, h, d, 5, 1.0f}), Error);
}

TEST(CpuOps, rope_fwd_RejectsOddHeadDim) {
  auto be = cpu();
  Vec x(6, 1.0f), inv(1, 1.0f);
  int32_t pos[2] = {0, 1};
  EXPECT_THROW(be->rope_fwd({view(x, {2, 1, 3}), view(inv, {1}), pos, 2, 1, 3}), Error);
}

}  // namespace
}  // namespace qlora::test
