// Flash-attention forward and backward on the GPU against the CPU reference: causal, GQA, packed
// documents, head dims 64, 128 and 256, sequence lengths that do and do not fill the tiles.
//
// Tolerances (bf16-derived, u = 2^-8): the kernels round P (fwd) and P, dS (bwd) to bf16 before
// their tensor-core products, a relative error of up to u per term, plus one rounding of each
// output: each contributes ~u/sqrt(3) of the output's rms for random inputs. The forward allows
// 2u normwise and 4u per element (|ref| and rms(ref) terms); the backward, with one more rounded
// factor, 4u normwise and 8u of rms per element. lse is f32 throughout: 1e-4 absolute.
#include "cuda_test_util.h"

namespace qlora::test {
namespace {

struct AttnCase {
  const char* name;
  int64_t b, t, hq, hkv, d;
  int docs;  // 0: no segment ids; else documents per sequence (uneven lengths)
  int64_t window = 0;  // sliding window (0: none)
  bool sinks = false;  // gpt-oss's attention sinks (one logit per head)
  float softcap = 0;   // Gemma 2's attention soft-capping (0: none)
};

struct AttnData {
  AttnCase c;
  std::vector<int32_t> seg;
  Vec q, k, v, dout;  // bf16-representable
  Vec sinks;          // (Hq) f32, or empty
  int64_t nq() const { return c.b * c.t * c.hq * c.d; }
  int64_t nkv() const { return c.b * c.t * c.hkv * c.d; }
  float scale() const { return 1.0f / std::sqrt(float(c.d)); }
  const int32_t* seg_host() const { return seg.empty() ? nullptr : seg.data(); }
};

AttnData make_data(const AttnCase& c, uint64_t seed) {
  AttnData a{c, {}, {}, {}, {}, {}, {}};
  if (c.sinks) {  // around the scores' own range, so they take a visible share
    a.sinks = randn(seed + 5, size_t(c.hq));
    for (float& x : a.sinks) x *= 1.5f;
  }
  a.q = round_bf16(randn(seed, size_t(a.nq())));
  a.k = round_bf16(randn(seed + 1, size_t(a.nkv())));
  a.v = round_bf16(randn(seed + 2, size_t(a.nkv())));
  a.dout = round_bf16(randn(seed + 3, size_t(a.nq())));
  if (c.docs > 0) {
    a.seg.resize(size_t(c.b * c.t));
    Rng rng(seed + 4);
    for (int64_t bi = 0; bi < c.b; bi++) {
      // docs-1 random cut points; ids increase along the sequence like packed documents
      std::vector<int64_t> cuts;
      for (int i = 0; i < c.docs - 1; i++) cuts.push_back(1 + int64_t(rng.below(uint64_t(std::max<int64_t>(c.t - 1, 1)))));
      std::sort(cuts.begin(), cuts.end());
      int32_t id = 0;
      size_t ci = 0;
      for (int64_t t = 0; t < c.t; t++) {
        while (ci < cuts.size() && cuts[ci] == t) id++, ci++;
        a.seg[size_t(bi * c.t + t)] = id;
      }
    }
  }
  return a;
}

void cpu_fwd(const AttnData& a, Vec& out, Vec& lse) {
  const auto& c = a.c;
  out.assign(size_t(a.nq()), 0.0f);
  lse.assign(size_t(c.b * c.hq * c.t), 0.0f);
  Vec q = a.q, k = a.k, v = a.v;
  make_cpu_backend()->attention_fwd({f32_view(out.data(), {c.b, c.t, c.hq, c.d}), f32_view(lse.data(), {c.b, c.hq, c.t}),
                                     f32_view(q.data(), {c.b, c.t, c.hq, c.d}), f32_view(k.data(), {c.b, c.t, c.hkv, c.d}),
                                     f32_view(v.data(), {c.b, c.t, c.hkv, c.d}), a.seg_host(), c.b, c.t, c.hq, c.hkv, c.d,
                                     a.scale(), 0, 0, c.window, c.softcap,
                                     a.sinks.empty() ? Tensor() : f32_view(const_cast<float*>(a.sinks.data()), {c.hq})});
}

std::vector<AttnCase> cases() {
  if (small_shapes())
    // t 200: the forward's second query block walks 4 key tiles, so both K/V stages are refilled.
    return {{"small_d128", 1, 77, 4, 2, 128, 0}, {"small_d64_docs", 2, 65, 3, 1, 64, 3}, {"small_d32_docs", 1, 70, 2, 1, 32, 2},
            {"small_d80", 1, 40, 2, 2, 80, 0},   {"small_d64_t200_docs", 1, 200, 2, 1, 64, 2},
            // Sliding windows: across key tiles (70 of 200 keys, packed), and shorter than a tile.
            {"small_d64_t200_docs_w70", 1, 200, 2, 1, 64, 2, 70}, {"small_d128_t77_w5", 1, 77, 4, 2, 128, 0, 5},
            {"small_d16_t12_w4", 2, 12, 4, 2, 16, 0, 4},
            // gpt-oss's attention sinks, with and without its windows
            {"small_d64_t130_docs_w40_sinks", 1, 130, 2, 1, 64, 2, 40, true}, {"small_d16_t12_sinks", 2, 12, 4, 2, 16, 0, 0, true},
            // Gemma 2's soft-capping (caps the scores of N(0,1) q, k cross), with its windows
            {"small_d128_t70_docs_w30_cap", 1, 70, 2, 1, 128, 2, 30, false, 2.0f}, {"small_d32_t70_cap", 1, 70, 2, 1, 32, 0, 0, false, 0.5f},
            // Tile width 256 (Gemma's head dim) with a window and documents (192 zero-padded into
            // it, and the cap, run in the full list).
            {"small_d256_t45_docs_w30", 1, 45, 2, 1, 256, 2, 30}};
  return {
      {"llama8b_t77", 1, 77, 32, 8, 128, 0},          // Llama-3-8B heads, odd length
      // Packed documents over 1024 positions (16 query tiles) with Llama-3-8B's GQA ratio of 4; its
      // 32 heads are the case above (under the host harness the heads multiply the time only).
      {"d128_t1024_gqa4_docs", 1, 1024, 8, 2, 128, 4},
      {"d128_t1", 2, 1, 4, 4, 128, 0},                // one token
      {"d128_t129_mha", 2, 129, 4, 4, 128, 2},         // no GQA, one past a tile
      {"smollm_d64_docs", 2, 200, 9, 3, 64, 3},        // SmolLM2-135M heads
      {"d64_t256_gqa8", 1, 256, 16, 2, 64, 0},         // tiles exactly full
      // Head dims below a tile width run zero-padded: the fixture model's 32, Phi-style 80, 96.
      {"tiny_d32_docs", 2, 70, 4, 2, 32, 2},
      {"d80_t130", 1, 130, 4, 4, 80, 0},
      {"d96_t100_gqa_docs", 1, 100, 6, 2, 96, 3},
      // Sliding windows (Mistral v0.1, Qwen's sliding layers): within a tile, across tiles, with
      // documents longer and shorter than the window.
      {"d128_t300_gqa_w100_docs", 1, 300, 4, 2, 128, 3, 100},
      {"d64_t256_w17", 2, 256, 4, 2, 64, 0, 17},
      {"d32_t130_w64_docs", 1, 130, 4, 1, 32, 2, 64},
      {"d16_t12_w4", 2, 12, 4, 2, 16, 0, 4},  // the qwen3_sw fixture's windowed layer
      // gpt-oss (head_dim 64, 64 query heads of 8 kv heads, windows of 128 on alternate layers) with sinks
      {"gptoss_d64_t300_w128_sinks_docs", 1, 300, 16, 2, 64, 3, 128, true},
      {"gptoss_d64_t200_sinks", 2, 200, 8, 1, 64, 0, 0, true},
      // Gemma 2 27B (head_dim 128, 32 query heads of 16 kv heads, windows of 4096 on alternate layers)
      {"gemma2_27b_d128_t300_w100_cap_docs", 1, 300, 8, 4, 128, 3, 100, false, 2.0f},
      {"d64_t256_cap", 2, 256, 4, 2, 64, 0, 0, false, 1.0f},
      // Head dim 256: Gemma 3 1B-12B (windows of 512-1024 on 5 of 6 layers), Gemma 2 2B/9B (caps
      // and windows); 192 zero-padded into the 256 tile.
      {"gemma3_d256_t200_gqa_w64_docs", 1, 200, 4, 2, 256, 3, 64},
      {"gemma2_9b_d256_t130_w50_cap", 1, 130, 2, 1, 256, 0, 50, false, 2.0f},
      {"d192_t100_docs", 1, 100, 2, 2, 192, 2},
  };
}

CUDA_OP_TEST(attention_fwd, causal_gqa_docs) {
  QLORA_REQUIRE_CUDA(cu);
  uint64_t seed = 500;
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const AttnData a = make_data(c, seed += 10);
    Vec ref_out, ref_lse;
    cpu_fwd(a, ref_out, ref_lse);
    DBuf q(*cu, DType::BF16, a.q), k(*cu, DType::BF16, a.k), v(*cu, DType::BF16, a.v);
    DBuf out(*cu, DType::BF16, a.nq()), lse(*cu, DType::F32, c.b * c.hq * c.t), seg(*cu, DType::I32, c.b * c.t);
    DBuf sinks(*cu, DType::F32, c.sinks ? a.sinks : Vec{0.0f});
    if (c.docs) seg.upload_i32(a.seg);
    out.poison();
    lse.poison();
    cu->attention_fwd({out.t({c.b, c.t, c.hq, c.d}), lse.t({c.b, c.hq, c.t}), q.t({c.b, c.t, c.hq, c.d}),
                       k.t({c.b, c.t, c.hkv, c.d}), v.t({c.b, c.t, c.hkv, c.d}), c.docs ? seg.i32() : nullptr, c.b, c.t,
                       c.hq, c.hkv, c.d, a.scale(), 0, 0, c.window, c.softcap, c.sinks ? sinks.t({c.hq}) : Tensor()});
    expect_close(std::string(c.name) + " out", out.download(), ref_out, {4 * kBf16U, 4 * kBf16U, 2 * kBf16U});
    expect_close(std::string(c.name) + " lse", lse.download(), ref_lse, {1e-5, 1e-4, 1e-5});
  }
}

// KV-cache decoding: t queries at the end of t_kv cached keys, against the CPU op with the same
// t_kv (itself checked against the last rows of a full causal attention in test_cpu_attention).
CUDA_OP_TEST(attention_fwd, kv_cache_offset) {
  QLORA_REQUIRE_CUDA(cu);
  struct KvCase {
    const char* name;
    int64_t b, t, t_kv, hq, hkv, d;
    int64_t window = 0;
    bool sinks = false;  // gpt-oss's decoding: its sinks and its windows of 128
  };
  // One decoded token over a cache that ends inside a key tile; a prompt chunk whose 70 queries
  // cross the cache's tile edges; a cache several key tiles long (both K/V stages refilled).
  const KvCase kv_cases[] = {{"decode_d128", 1, 1, 77, 4, 2, 128}, {"chunk_d64", 2, 70, 150, 3, 1, 64},
                             {"decode_d64_t200", 2, 1, 200, 2, 1, 64}, {"chunk_d32", 1, 9, 130, 4, 2, 32},
                             // Sliding windows counted from each query's cache position.
                             {"chunk_d64_w20", 2, 70, 150, 3, 1, 64, 20}, {"decode_d64_t200_w5", 2, 1, 200, 2, 1, 64, 5},
                             {"chunk_d32_w100", 1, 9, 130, 4, 2, 32, 100},
                             {"decode_d64_t200_w128_sinks", 1, 1, 200, 2, 1, 64, 128, true}, {"chunk_d64_sinks", 1, 9, 70, 2, 1, 64, 0, true},
                             // Gemma's head dim 256 (key tiles of 32), with its local layers' window
                             {"decode_d256_t100_w50", 1, 1, 100, 2, 1, 256, 50}, {"chunk_d256", 1, 9, 70, 2, 1, 256}};
  uint64_t seed = 900;
  for (const auto& c : kv_cases) {
    SCOPED_TRACE(c.name);
    const Vec hq_ = round_bf16(randn(seed += 10, size_t(c.b * c.t * c.hq * c.d)));
    const Vec hk = round_bf16(randn(seed + 1, size_t(c.b * c.t_kv * c.hkv * c.d)));
    const Vec hv = round_bf16(randn(seed + 2, size_t(c.b * c.t_kv * c.hkv * c.d)));
    const float scale = 1.0f / std::sqrt(float(c.d));
    Vec sinks = randn(seed + 3, size_t(c.hq));
    Vec ref_out(hq_.size()), ref_lse(size_t(c.b * c.hq * c.t));
    {
      Vec q = hq_, k = hk, v = hv;
      AttentionFwdArgs f{f32_view(ref_out.data(), {c.b, c.t, c.hq, c.d}), f32_view(ref_lse.data(), {c.b, c.hq, c.t}),
                         f32_view(q.data(), {c.b, c.t, c.hq, c.d}), f32_view(k.data(), {c.b, c.t_kv, c.hkv, c.d}),
                         f32_view(v.data(), {c.b, c.t_kv, c.hkv, c.d}), nullptr, c.b, c.t, c.hq, c.hkv, c.d, scale, c.t_kv,
                         0, c.window};
      if (c.sinks) f.sinks = f32_view(sinks.data(), {c.hq});
      make_cpu_backend()->attention_fwd(f);
    }
    DBuf q(*cu, DType::BF16, hq_), k(*cu, DType::BF16, hk), v(*cu, DType::BF16, hv);
    DBuf out(*cu, DType::BF16, int64_t(hq_.size())), lse(*cu, DType::F32, c.b * c.hq * c.t), ds(*cu, DType::F32, sinks);
    out.poison();
    lse.poison();
    cu->attention_fwd({out.t({c.b, c.t, c.hq, c.d}), lse.t({c.b, c.hq, c.t}), q.t({c.b, c.t, c.hq, c.d}),
                       k.t({c.b, c.t_kv, c.hkv, c.d}), v.t({c.b, c.t_kv, c.hkv, c.d}), nullptr, c.b, c.t, c.hq, c.hkv,
                       c.d, scale, c.t_kv, 0, c.window, 0.0f, c.sinks ? ds.t({c.hq}) : Tensor()});
    expect_close(std::string(c.name) + " out", out.download(), ref_out, {4 * kBf16U, 4 * kBf16U, 2 * kBf16U});
    expect_close(std::string(c.name) + " lse", lse.download(), ref_lse, {1e-5, 1e-4, 1e-5});
  }
}

// The bitwise repeat of a backward run: the plain harness build and the device check it; under
// ThreadSanitizer or AddressSanitizer a second identical run touches nothing the first did not.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kRepeatBitwise = false;
#else
constexpr bool kRepeatBitwise = true;
#endif

CUDA_OP_TEST(attention_bwd, causal_gqa_docs) {
  QLORA_REQUIRE_CUDA(cu);
  uint64_t seed = 700;
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const AttnData a = make_data(c, seed += 10);
    Vec out, lse;
    cpu_fwd(a, out, lse);
    out = round_bf16(std::move(out));  // both backends differentiate at the same (bf16) output
    Vec rdq(size_t(a.nq())), rdk(size_t(a.nkv())), rdv(size_t(a.nkv()));
    {
      Vec q = a.q, k = a.k, v = a.v, d = a.dout;
      make_cpu_backend()->attention_bwd(
          {f32_view(rdq.data(), {c.b, c.t, c.hq, c.d}), f32_view(rdk.data(), {c.b, c.t, c.hkv, c.d}),
           f32_view(rdv.data(), {c.b, c.t, c.hkv, c.d}), f32_view(d.data(), {c.b, c.t, c.hq, c.d}),
           f32_view(q.data(), {c.b, c.t, c.hq, c.d}), f32_view(k.data(), {c.b, c.t, c.hkv, c.d}),
           f32_view(v.data(), {c.b, c.t, c.hkv, c.d}), f32_view(out.data(), {c.b, c.t, c.hq, c.d}),
           f32_view(lse.data(), {c.b, c.hq, c.t}), a.seg_host(), c.b, c.t, c.hq, c.hkv, c.d, a.scale(), 0, c.window,
           c.softcap});
    }
    DBuf q(*cu, DType::BF16, a.q), k(*cu, DType::BF16, a.k), v(*cu, DType::BF16, a.v), d(*cu, DType::BF16, a.dout);
    DBuf o(*cu, DType::BF16, out), l(*cu, DType::F32, lse), seg(*cu, DType::I32, c.b * c.t);
    if (c.docs) seg.upload_i32(a.seg);
    // Both ways of forming dq: the f32 accumulator, and dq's own query-major pass (which leaves the
    // key-major kernel dk and dv only: the same products, so the same bits).
    std::vector<Vec> dk_of, dv_of;
    for (const AttnDq mode : {AttnDq::Accumulate, AttnDq::Recompute}) {
      const std::string name = std::string(c.name) + (mode == AttnDq::Recompute ? " (dq recomputed)" : "");
      DBuf dq(*cu, DType::BF16, a.nq()), dk(*cu, DType::BF16, a.nkv()), dv(*cu, DType::BF16, a.nkv());
      dq.poison();
      dk.poison();
      dv.poison();
      AttentionBwdArgs args{dq.t({c.b, c.t, c.hq, c.d}), dk.t({c.b, c.t, c.hkv, c.d}), dv.t({c.b, c.t, c.hkv, c.d}),
                            d.t({c.b, c.t, c.hq, c.d}), q.t({c.b, c.t, c.hq, c.d}), k.t({c.b, c.t, c.hkv, c.d}),
                            v.t({c.b, c.t, c.hkv, c.d}), o.t({c.b, c.t, c.hq, c.d}), l.t({c.b, c.hq, c.t}),
                            c.docs ? seg.i32() : nullptr, c.b, c.t, c.hq, c.hkv, c.d, a.scale(), 0, c.window, c.softcap};
      args.dq_mode = mode;
      args.sinks = c.sinks;  // lse carries them (from the CPU's forward above)
      cu->attention_bwd(args);
      // With one visible key dS = P (dP - delta) is exactly 0; f32 dP and delta then differ by
      // ~1e-6 of sqrt(D) |dout| |v| (inputs are N(0,1)): the 1e-4 floor covers that cancellation.
      const Tol tol{4 * kBf16U, 8 * kBf16U, 4 * kBf16U, 1e-4};
      // dq alone sums over every visible key after two bf16 roundings (P, then dS) and, accumulated,
      // f32 atomics in no fixed order; its largest elementwise error over ~4M elements reaches
      // ~8.5u x rms (seen under the host harness), so its rms term is 12u. The normwise bound stays 4u.
      const Vec got_dq = dq.download();
      expect_close(name + " dq", got_dq, rdq, {4 * kBf16U, 12 * kBf16U, 4 * kBf16U, 1e-4});
      dk_of.push_back(dk.download());
      dv_of.push_back(dv.download());
      expect_close(name + " dk", dk_of.back(), rdk, tol);
      expect_close(name + " dv", dv_of.back(), rdv, tol);
      // dq recomputed is written once per element, no atomics: the same bits again.
      if (mode == AttnDq::Recompute && kRepeatBitwise) {
        dq.poison();
        cu->attention_bwd(args);
        EXPECT_EQ(dq.download(), got_dq) << name;
      }
    }
    EXPECT_EQ(dk_of[0], dk_of[1]) << c.name;
    EXPECT_EQ(dv_of[0], dv_of[1]) << c.name;
  }
}

CUDA_OP_TEST(attention_fwd, unsupported_head_dim_is_an_error) {
  QLORA_REQUIRE_CUDA(cu);
  for (int64_t d : {100, 264}) {  // not a multiple of 8; wider than the widest tile
    DBuf buf(*cu, DType::BF16, 4 * d), lse(*cu, DType::F32, 4);
    const Tensor x = buf.t({1, 4, 1, d});
    try {
      cu->attention_fwd({x, lse.t({1, 1, 4}), x, x, x, nullptr, 1, 4, 1, 1, d, 0.1f});
      ADD_FAILURE() << "head_dim " << d << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE((std::string(e.what()) + e.hint()).find("device=cpu"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace qlora::test
