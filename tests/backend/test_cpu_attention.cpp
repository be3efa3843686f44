// CPU attention: explicit-mask softmax(QK^T)V reference, GQA, packed documents, finite differences.
#include "backend_test_util.h"
#include "core/error.h"

namespace qlora::test {
namespace {

struct Attn {
  int64_t b, t, hq, hkv, d;
  std::vector<int32_t> seg;  // (B,T) or empty
  Vec q, k, v;
  int64_t window = 0;  // sliding window (0: none)
  Vec sinks{};         // (Hq) attention sinks, or empty
  float scale() const { return 1.0f / std::sqrt(float(d)); }
  int64_t nq() const { return b * t * hq * d; }
  int64_t nkv() const { return b * t * hkv * d; }
  const int32_t* seg_ptr() const { return seg.empty() ? nullptr : seg.data(); }
};

Attn make_attn(int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t d, std::vector<int32_t> seg, uint64_t seed) {
  Rng rng(seed);
  Attn a{b, t, hq, hkv, d, std::move(seg), {}, {}, {}};
  a.q = randn(rng, size_t(a.nq()));
  a.k = randn(rng, size_t(a.nkv()));
  a.v = randn(rng, size_t(a.nkv()));
  return a;
}

void run_fwd(Backend& be, Attn& a, Vec& out, Vec& lse) {
  out.assign(size_t(a.nq()), 0.0f);
  lse.assign(size_t(a.b * a.hq * a.t), 0.0f);
  AttentionFwdArgs f;
  f.out = view(out, {a.b, a.t, a.hq, a.d});
  f.lse = view(lse, {a.b, a.hq, a.t});
  f.q = view(a.q, {a.b, a.t, a.hq, a.d});
  f.k = view(a.k, {a.b, a.t, a.hkv, a.d});
  f.v = view(a.v, {a.b, a.t, a.hkv, a.d});
  f.seg = a.seg_ptr();
  f.b = a.b, f.t = a.t, f.n_head = a.hq, f.n_head_kv = a.hkv, f.head_dim = a.d, f.scale = a.scale();
  f.window = a.window;
  if (!a.sinks.empty()) f.sinks = view(a.sinks, {a.hq});
  be.attention_fwd(f);
}

void run_bwd(Backend& be, Attn& a, Vec& dout, Vec& out, Vec& lse, Vec& dq, Vec& dk, Vec& dv) {
  // Outputs start as garbage: bwd's dq/dk/dv are "=".
  dq.assign(size_t(a.nq()), 7.0f);
  dk.assign(size_t(a.nkv()), 7.0f);
  dv.assign(size_t(a.nkv()), 7.0f);
  AttentionBwdArgs g;
  g.dq = view(dq, {a.b, a.t, a.hq, a.d});
  g.dk = view(dk, {a.b, a.t, a.hkv, a.d});
  g.dv = view(dv, {a.b, a.t, a.hkv, a.d});
  g.dout = view(dout, {a.b, a.t, a.hq, a.d});
  g.q = view(a.q, {a.b, a.t, a.hq, a.d});
  g.k = view(a.k, {a.b, a.t, a.hkv, a.d});
  g.v = view(a.v, {a.b, a.t, a.hkv, a.d});
  g.out = view(out, {a.b, a.t, a.hq, a.d});
  g.lse = view(lse, {a.b, a.hq, a.t});
  g.seg = a.seg_ptr();
  g.b = a.b, g.t = a.t, g.n_head = a.hq, g.n_head_kv = a.hkv, g.head_dim = a.d, g.scale = a.scale();
  g.window = a.window;
  g.sinks = !a.sinks.empty();
  be.attention_bwd(g);
}

// Textbook attention: K/V heads repeated to Hq, a full (T,T) score matrix, an explicit boolean
// mask (causal and same document) turned into -inf, softmax in double, then P V.
void naive_attention(const Attn& a, std::vector<double>& out, std::vector<double>& lse) {
  out.assign(size_t(a.nq()), 0.0);
  lse.assign(size_t(a.b * a.hq * a.t), 0.0);
  const int64_t rep = a.hq / a.hkv;
  for (int64_t b = 0; b < a.b; b++)
    for (int64_t h = 0; h < a.hq; h++) {
      std::vector<double> s(size_t(a.t * a.t));
      for (int64_t i = 0; i < a.t; i++)
        for (int64_t j = 0; j < a.t; j++) {
          bool mask = j <= i && (a.window == 0 || i - j < a.window);
          if (!a.seg.empty()) mask = mask && a.seg[size_t(b * a.t + i)] == a.seg[size_t(b * a.t + j)];
          double dot = 0;
          for (int64_t d = 0; d < a.d; d++)
            dot += double(a.q[size_t(((b * a.t + i) * a.hq + h) * a.d + d)]) *
                   a.k[size_t(((b * a.t + j) * a.hkv + h / rep) * a.d + d)];
          s[size_t(i * a.t + j)] = mask ? dot * a.scale() : -INFINITY;
        }
      for (int64_t i = 0; i < a.t; i++) {
        double mx = a.sinks.empty() ? -INFINITY : double(a.sinks[size_t(h)]), z = 0;
        for (int64_t j = 0; j < a.t; j++) mx = std::max(mx, s[size_t(i * a.t + j)]);
        for (int64_t j = 0; j < a.t; j++) z += std::exp(s[size_t(i * a.t + j)] - mx);
        if (!a.sinks.empty()) z += std::exp(double(a.sinks[size_t(h)]) - mx);  // a logit that attends to nothing
        lse[size_t((b * a.hq + h) * a.t + i)] = mx + std::log(z);
        for (int64_t j = 0; j < a.t; j++) {
          const double p = std::exp(s[size_t(i * a.t + j)] - mx) / z;
          for (int64_t d = 0; d < a.d; d++)
            out[size_t(((b * a.t + i) * a.hq + h) * a.d + d)] +=
                p * a.v[size_t(((b * a.t + j) * a.hkv + h / rep) * a.d + d)];
        }
      }
    }
}

void check_against_naive(Attn a) {
  auto be = cpu();
  Vec out, lse;
  run_fwd(*be, a, out, lse);
  std::vector<double> want_out, want_lse;
  naive_attention(a, want_out, want_lse);
  const std::string tag = "Hq=" + std::to_string(a.hq) + " Hkv=" + std::to_string(a.hkv) +
                          (a.seg.empty() ? "" : " with segments");
  expect_close(out, want_out, 2e-6, 2e-6, "attention out " + tag);
  expect_close(lse, want_lse, 2e-6, 2e-6, "attention lse " + tag);
}

TEST(CpuOps, attention_fwd_MatchesExplicitMaskSoftmax) {
  check_against_naive(make_attn(2, 9, 4, 2, 8, {}, 1));   // GQA
  check_against_naive(make_attn(1, 12, 3, 3, 16, {}, 2));  // MHA
  check_against_naive(make_attn(2, 5, 4, 1, 4, {}, 3));   // MQA
  check_against_naive(make_attn(2, 9, 4, 2, 8, {0, 0, 0, 1, 1, 2, 2, 2, 2, 5, 5, 5, 5, 5, 9, 9, 9, 9}, 4));
  check_against_naive(make_attn(2, 48, 8, 2, 16, {}, 5));  // large enough for the OpenMP path
}

// KV-cache decoding: t queries at the end of t_kv cached positions give exactly the last t rows of
// causal attention over all t_kv queries (b = 2, so sequence strides over t_kv are exercised too).
TEST(CpuOps, attention_fwd_KvCacheQueriesAreTheLastRowsOfFullAttention) {
  auto be = cpu();
  for (auto [tk, t] : {std::pair<int64_t, int64_t>{9, 1}, {9, 4}, {300, 1}, {300, 70}, {130, 130}}) {
    Attn full = make_attn(2, tk, 4, 2, 8, {}, uint64_t(tk * 7 + t));
    std::vector<double> want_out, want_lse;
    naive_attention(full, want_out, want_lse);
    const int64_t hq = full.hq, d = full.d, off = tk - t;
    Vec q(size_t(2 * t * hq * d)), out(q.size(), 0.0f), lse(size_t(2 * hq * t), 0.0f);
    std::vector<double> w_out(q.size()), w_lse(lse.size());
    for (int64_t b = 0; b < 2; b++) {
      for (int64_t i = 0; i < t * hq * d; i++) {
        q[size_t(b * t * hq * d + i)] = full.q[size_t((b * tk + off) * hq * d + i)];
        w_out[size_t(b * t * hq * d + i)] = want_out[size_t((b * tk + off) * hq * d + i)];
      }
      for (int64_t h = 0; h < hq; h++)
        for (int64_t i = 0; i < t; i++) w_lse[size_t((b * hq + h) * t + i)] = want_lse[size_t((b * hq + h) * tk + off + i)];
    }
    AttentionFwdArgs f;
    f.out = view(out, {2, t, hq, d});
    f.lse = view(lse, {2, hq, t});
    f.q = view(q, {2, t, hq, d});
    f.k = view(full.k, {2, tk, full.hkv, d});
    f.v = view(full.v, {2, tk, full.hkv, d});
    f.b = 2, f.t = t, f.n_head = hq, f.n_head_kv = full.hkv, f.head_dim = d, f.scale = full.scale(), f.t_kv = tk;
    be->attention_fwd(f);
    const std::string tag = "t_kv " + std::to_string(tk) + ", t " + std::to_string(t);
    expect_close(out, w_out, 2e-6, 2e-6, "cached attention out " + tag);
    expect_close(lse, w_lse, 2e-6, 2e-6, "cached attention lse " + tag);
  }
  // A cache shorter than the queries, or segments with a cache, are caller errors.
  Attn a = make_attn(1, 4, 2, 2, 8, {0, 0, 1, 1}, 9);
  Vec out(size_t(a.nq())), lse(size_t(a.hq * a.t));
  AttentionFwdArgs f{view(out, {1, 4, 2, 8}), view(lse, {1, 2, 4}), view(a.q, {1, 4, 2, 8}), view(a.k, {1, 4, 2, 8}),
                     view(a.v, {1, 4, 2, 8}), nullptr, 1, 4, 2, 2, 8, a.scale(), 3};
  auto message = [&] {
    try {
      be->attention_fwd(f);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message().find("t_kv 3 must be 0 or at least t 4"), std::string::npos) << message();
  f.t_kv = 6;
  f.seg = a.seg.data();
  EXPECT_NE(message().find("a KV cache takes no segments"), std::string::npos) << message();
}

// A packed row [doc0 | doc1 | doc2] must equal running each document alone, forward and backward.
TEST(CpuOps, attention_fwd_PackedSegmentsEqualSeparateDocuments) {
  auto be = cpu();
  const std::vector<int32_t> seg = {0, 0, 0, 1, 1, 2, 2, 2, 2, 2};
  const int64_t t = int64_t(seg.size()), hq = 4, hkv = 2, d = 8;
  Attn packed = make_attn(1, t, hq, hkv, d, seg, 5);
  Vec out, lse, dq, dk, dv;
  run_fwd(*be, packed, out, lse);
  Rng rng(6);
  Vec dout = randn(rng, size_t(packed.nq()));
  run_bwd(*be, packed, dout, out, lse, dq, dk, dv);

  for (int64_t start = 0; start < t;) {
    int64_t len = 0;
    while (start + len < t && seg[size_t(start + len)] == seg[size_t(start)]) len++;
    auto slice = [&](const Vec& v, int64_t heads) {
      return Vec(v.begin() + start * heads * d, v.begin() + (start + len) * heads * d);
    };
    Attn doc{1, len, hq, hkv, d, {}, slice(packed.q, hq), slice(packed.k, hkv), slice(packed.v, hkv)};
    Vec o1, l1, dq1, dk1, dv1, dout1 = slice(dout, hq);
    run_fwd(*be, doc, o1, l1);
    run_bwd(*be, doc, dout1, o1, l1, dq1, dk1, dv1);
    const std::string tag = " of document at " + std::to_string(start);
    // The same visible keys: equal up to f32 summation order (tiles and SIMD lanes fall
    // differently in the packed row); a key leaking across documents would be an O(1) error.
    const double atol = 1e-6, rtol = 1e-5;
    expect_close(slice(out, hq), o1, atol, rtol, "out" + tag);
    for (int64_t h = 0; h < hq; h++)
      expect_close(Vec(lse.begin() + h * t + start, lse.begin() + h * t + start + len),
                   Vec(l1.begin() + h * len, l1.begin() + (h + 1) * len), atol, rtol, "lse" + tag);
    expect_close(slice(dq, hq), dq1, atol, rtol, "dq" + tag);
    expect_close(slice(dk, hkv), dk1, atol, rtol, "dk" + tag);
    expect_close(slice(dv, hkv), dv1, atol, rtol, "dv" + tag);
    start += len;
  }
}

void check_bwd_fd(Attn a, uint64_t seed, size_t max_checks = 1u << 30) {
  auto be = cpu();
  Rng rng(seed);
  Vec w = randn(rng, size_t(a.nq())), out, lse, dq, dk, dv;
  run_fwd(*be, a, out, lse);
  run_bwd(*be, a, w, out, lse, dq, dk, dv);
  Vec o2, l2;
  auto loss = [&] { run_fwd(*be, a, o2, l2); return weighted_sum(w, o2); };
  // Smooth in q,k,v: h=1e-2 gives truncation ~1e-5 and f32 noise ~1e-5.
  const std::string tag = a.seg.empty() ? " (causal)" : " (segments)";
  expect_grad_matches_fd("attention dq" + tag, a.q, dq, loss, 1e-2f, 3e-4, 3e-3, max_checks);
  expect_grad_matches_fd("attention dk" + tag, a.k, dk, loss, 1e-2f, 3e-4, 3e-3, max_checks);
  expect_grad_matches_fd("attention dv" + tag, a.v, dv, loss, 1e-2f, 3e-4, 3e-3, max_checks);
}

TEST(CpuOps, attention_bwd_GqaMatchesFiniteDifferences) {
  check_bwd_fd(make_attn(2, 7, 4, 2, 8, {}, 21), 22);
  check_bwd_fd(make_attn(2, 7, 4, 2, 8, {0, 0, 0, 1, 1, 2, 2, 4, 4, 4, 4, 7, 7, 7}, 23), 24);
  Attn s = make_attn(2, 7, 4, 2, 8, {0, 0, 0, 1, 1, 2, 2, 4, 4, 4, 4, 7, 7, 7}, 25);  // attention sinks
  s.sinks = {0.5f, -1.0f, 2.0f, 1.0f};
  s.window = 3;
  check_bwd_fd(s, 26);
}

// Textbook backward in double from the same explicit mask: P, dV = P^T dO, dP = dO V^T,
// dS = P o (dP - rowsum(P o dP)), dQ = scale dS K, dK = scale dS^T Q (K/V heads summed over groups).
void naive_attention_bwd(const Attn& a, const Vec& dout, std::vector<double>& dq, std::vector<double>& dk,
                         std::vector<double>& dv) {
  dq.assign(size_t(a.nq()), 0.0);
  dk.assign(size_t(a.nkv()), 0.0);
  dv.assign(size_t(a.nkv()), 0.0);
  const int64_t rep = a.hq / a.hkv, T = a.t, D = a.d;
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return size_t(((b * T + t) * a.hq + h) * D); };
  auto ki = [&](int64_t b, int64_t t, int64_t h) { return size_t(((b * T + t) * a.hkv + h / rep) * D); };
  for (int64_t b = 0; b < a.b; b++)
    for (int64_t h = 0; h < a.hq; h++) {
      std::vector<double> p(size_t(T * T), 0.0), dp(size_t(T * T), 0.0);
      for (int64_t i = 0; i < T; i++) {
        double mx = a.sinks.empty() ? -INFINITY : double(a.sinks[size_t(h)]);
        std::vector<double> s(size_t(T), -INFINITY);
        for (int64_t j = 0; j <= i; j++) {
          if (!a.seg.empty() && a.seg[size_t(b * T + i)] != a.seg[size_t(b * T + j)]) continue;
          if (a.window > 0 && i - j >= a.window) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; d++) dot += double(a.q[qi(b, i, h) + size_t(d)]) * a.k[ki(b, j, h) + size_t(d)];
          s[size_t(j)] = dot * a.scale();
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = a.sinks.empty() ? 0.0 : std::exp(double(a.sinks[size_t(h)]) - mx);
        for (int64_t j = 0; j < T; j++) z += std::exp(s[size_t(j)] - mx);
        double rowdot = 0;
        for (int64_t j = 0; j < T; j++) {
          const double pj = std::exp(s[size_t(j)] - mx) / z;
          double dpj = 0;
          for (int64_t d = 0; d < D; d++) dpj += double(dout[qi(b, i, h) + size_t(d)]) * a.v[ki(b, j, h) + size_t(d)];
          p[size_t(i * T + j)] = pj;
          dp[size_t(i * T + j)] = dpj;
          rowdot += pj * dpj;
        }
        for (int64_t j = 0; j < T; j++) {
          const double pj = p[size_t(i * T + j)];
          if (pj == 0.0) continue;
          const double ds = pj * (dp[size_t(i * T + j)] - rowdot) * a.scale();
          for (int64_t d = 0; d < D; d++) {
            dq[qi(b, i, h) + size_t(d)] += ds * a.k[ki(b, j, h) + size_t(d)];
            dk[ki(b, j, h) + size_t(d)] += ds * a.q[qi(b, i, h) + size_t(d)];
            dv[ki(b, j, h) + size_t(d)] += pj * dout[qi(b, i, h) + size_t(d)];
          }
        }
      }
    }
}

// Two rows of 300 tokens: documents of 70, 5, 125, 63 and 37 tokens, then three of 97 and one of 9.
std::vector<int32_t> packed_rows_300() {
  std::vector<int32_t> seg;
  for (int64_t i = 0; i < 300; i++) seg.push_back(i < 70 ? 0 : i < 75 ? 1 : i < 200 ? 2 : i < 263 ? 3 : 4);
  for (int64_t i = 0; i < 300; i++) seg.push_back(int32_t(i / 97));
  return seg;
}

// Forward and backward of `a` against the explicit-mask reference; leaves the forward output in out.
void check_fwd_bwd_against_naive(const Attn& a, const std::string& tag, Vec& out) {
  auto be = cpu();
  Attn in = a;
  Vec lse, dq, dk, dv;
  run_fwd(*be, in, out, lse);
  std::vector<double> want_out, want_lse, want_dq, want_dk, want_dv;
  naive_attention(a, want_out, want_lse);
  expect_close(out, want_out, 1e-5, 1e-5, "attention out" + tag);
  expect_close(lse, want_lse, 1e-5, 1e-5, "attention lse" + tag);
  Rng rng(43);
  Vec w = randn(rng, size_t(a.nq()));
  run_bwd(*be, in, w, out, lse, dq, dk, dv);
  naive_attention_bwd(a, w, want_dq, want_dk, want_dv);
  expect_close(dq, want_dq, 2e-5, 1e-4, "attention dq" + tag);
  expect_close(dk, want_dk, 2e-5, 1e-4, "attention dk" + tag);
  expect_close(dv, want_dv, 2e-5, 1e-4, "attention dv" + tag);
}

// Rows longer than one tile in both directions (forward tiles 64x256, backward 64x64), partial
// last tiles, and documents whose boundaries fall inside tiles and across them.
TEST(CpuOps, attention_MultiTileMatchesExplicitMask) {
  for (bool packed : {false, true}) {
    const Attn a = make_attn(2, 300, 4, 2, 16, packed ? packed_rows_300() : std::vector<int32_t>{}, packed ? 41 : 42);
    Vec out;
    check_fwd_bwd_against_naive(a, packed ? " (packed, T=300)" : " (causal, T=300)", out);
  }
}

// Sliding windows (query i sees keys j with i - j < window) over several tiles, alone and with
// packed documents longer than the window (window 100 inside a 125-token document), a window of one
// key (each query sees itself only) and one as long as the row (= no window). A key outside the
// window that leaked in would move the output by O(1): the no-window run differs by that much.
TEST(CpuOps, attention_SlidingWindowMatchesExplicitMask) {
  for (bool packed : {false, true})
    for (int64_t window : {int64_t(1), int64_t(5), int64_t(64), int64_t(100), int64_t(300)}) {
      Attn a = make_attn(2, 300, 4, 2, 16, packed ? packed_rows_300() : std::vector<int32_t>{}, 60 + uint64_t(window));
      a.window = window;
      const std::string tag = std::string(packed ? " (packed" : " (causal") + ", window " + std::to_string(window) + ")";
      Vec out, full_out, full_lse;
      check_fwd_bwd_against_naive(a, tag, out);
      Attn full = a;
      full.window = 0;
      auto be = cpu();
      run_fwd(*be, full, full_out, full_lse);
      double gap = 0;
      for (size_t i = 0; i < out.size(); i++) gap = std::max(gap, double(std::fabs(out[i] - full_out[i])));
      if (window < 300) {
        EXPECT_GT(gap, 0.1) << "the window hides nothing" << tag;
      } else {
        EXPECT_EQ(out, full_out) << tag;
      }
    }
}

// gpt-oss's attention sinks: per head, one more logit in each row's softmax that attends to
// nothing, with sliding windows and packed documents over several tiles, against the explicit
// reference; the sinks take a visible share (the output moves by O(1) against no sinks).
TEST(CpuOps, attention_SinksMatchExplicitMask) {
  for (int64_t window : {int64_t(0), int64_t(100)}) {
    Attn a = make_attn(2, 300, 4, 2, 16, packed_rows_300(), 80 + uint64_t(window));
    a.window = window;
    a.sinks = {1.5f, -0.5f, 3.0f, 0.0f};
    Vec out, plain_out, plain_lse;
    check_fwd_bwd_against_naive(a, " (sinks, window " + std::to_string(window) + ")", out);
    Attn plain = a;
    plain.sinks.clear();
    run_fwd(*cpu(), plain, plain_out, plain_lse);
    double gap = 0;
    for (size_t i = 0; i < out.size(); i++) gap = std::max(gap, double(std::fabs(out[i] - plain_out[i])));
    EXPECT_GT(gap, 0.1) << "the sinks change nothing";
  }
}

// Above the OpenMP threshold and over many key tiles. The forward is the same bits for any thread
// count (each query tile is one thread's); the backward adds per-thread dQ partial sums in thread
// order, so it is the same bits run after run for a given count (a race would not be) and equal
// up to f32 rounding across counts. A few finite differences tie the parallel path to the math.
TEST(CpuOps, attention_bwd_ParallelPathIsRaceFree) {
  std::vector<int32_t> seg(2 * 200);
  for (size_t i = 0; i < seg.size(); i++) seg[i] = int32_t(i / 83);
  Attn a = make_attn(2, 200, 4, 2, 16, seg, 25);
  auto be = cpu();
  Rng rng(27);
  Vec w = randn(rng, size_t(a.nq()));
  Vec out1, lse1, dq1, dk1, dv1, out3, lse3, dq3, dk3, dv3, dq3b, dk3b, dv3b;
  with_omp_threads(1, [&] { run_fwd(*be, a, out1, lse1); run_bwd(*be, a, w, out1, lse1, dq1, dk1, dv1); });
  with_omp_threads(3, [&] {
    run_fwd(*be, a, out3, lse3);
    run_bwd(*be, a, w, out3, lse3, dq3, dk3, dv3);
    run_bwd(*be, a, w, out3, lse3, dq3b, dk3b, dv3b);
  });
  EXPECT_EQ(out1, out3);
  EXPECT_EQ(lse1, lse3);
  EXPECT_EQ(dq3, dq3b);
  EXPECT_EQ(dk3, dk3b);
  EXPECT_EQ(dv3, dv3b);
  EXPECT_EQ(dk1, dk3);  // dK/dV rows belong to one thread whatever the count
  EXPECT_EQ(dv1, dv3);
  expect_close(dq3, dq1, 1e-6, 1e-5, "dq 3 threads vs 1");
  check_bwd_fd(make_attn(1, 70, 2, 1, 8, std::vector<int32_t>(70, 0), 28), 26, 8);
}

TEST(CpuOps, attention_fwd_RejectsBadHeadCounts) {
  auto be = cpu();
  Attn a = make_attn(1, 2, 3, 2, 4, {}, 9);  // 3 query heads cannot share 2 kv heads
  Vec out, lse;
  EXPECT_THROW(run_fwd(*be, a, out, lse), Error);
}

}  // namespace
}  // namespace qlora::test
