// The mixture-of-experts ops on the GPU against the CPU reference: routing (choices, weights and the
// expert-sorted layout exactly; the backward to f32 ulps), and the row movers in bf16 and f32.
#include <numeric>

#include "cuda_test_util.h"

namespace qlora::test {
namespace {

std::unique_ptr<Backend> cpu() { return make_cpu_backend(); }
constexpr DType BF = DType::BF16;
constexpr DType F32 = DType::F32;

int64_t tokens() { return small_shapes() ? 40 : 4096; }

// Router logits with a clear gap between any two experts of a token (a permutation of steps of
// 0.37 plus a little noise), so rounding cannot reorder the choices; expert e_idle gets none.
Vec router_logits(int64_t n, int64_t e, int64_t idle) {
  Rng rng(31);
  Vec l(size_t(n * e));
  std::vector<int> perm(static_cast<size_t>(e));
  for (int64_t t = 0; t < n; t++) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = e - 1; i > 0; i--) std::swap(perm[size_t(i)], perm[size_t(rng.below(uint64_t(i + 1)))]);
    for (int64_t i = 0; i < e; i++) l[size_t(t * e + i)] = 0.37f * float(perm[size_t(i)]) + 0.02f * rng.uniform(-1, 1) - 2.0f;
    l[size_t(t * e + idle)] = -12.0f;
  }
  return round_bf16(std::move(l));
}

// An I32 device buffer's values as floats (exact below 2^24), for expect_equal.
Vec ints_as_floats(Backend& be, const DBuf& b, int64_t n) {
  std::vector<int32_t> h(static_cast<size_t>(n));
  be.copy_to_host(h.data(), b.data(), h.size() * 4);
  return Vec(h.begin(), h.end());
}

CUDA_OP_TEST(moe_route_fwd, choices_weights_and_layout) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = tokens();
  for (auto [e, k] : {std::pair<int64_t, int64_t>{8, 2}, {128, 8}, {32, 4}})
    for (bool norm : {true, false})
      for (DType dt : {BF, F32}) {
        SCOPED_TRACE("experts " + std::to_string(e) + " top " + std::to_string(k) + (norm ? " norm " : " ") + dtype_name(dt));
        Vec logits = router_logits(n, e, e / 2);
        Vec ref_w(size_t(n * k)), ref_rw(size_t(n * k));
        std::vector<int32_t> ref_ex(size_t(n * k)), ref_row(size_t(n * k)), ref_tok(size_t(n * k)), ref_off(size_t(e + 1));
        cpu()->moe_route_fwd({f32_view(logits.data(), {n, e}), Tensor(ref_ex.data(), DType::I32, {n * k}),
                              f32_view(ref_w.data(), {n * k}), Tensor(ref_row.data(), DType::I32, {n * k}),
                              Tensor(ref_tok.data(), DType::I32, {n * k}), f32_view(ref_rw.data(), {n * k}),
                              Tensor(ref_off.data(), DType::I32, {e + 1}), n, e, k, norm});
        ASSERT_EQ(ref_off[size_t(e / 2) + 1] - ref_off[size_t(e / 2)], 0) << "the idle expert got a token";
        DBuf dl(*cu, dt, logits), ex(*cu, DType::I32, n * k), w(*cu, F32, n * k), row(*cu, DType::I32, n * k),
            tok(*cu, DType::I32, n * k), rw(*cu, F32, n * k), off(*cu, DType::I32, e + 1);
        for (DBuf* b : {&w, &rw}) b->poison();
        ex.upload_i32(std::vector<int32_t>(size_t(n * k), -7));  // values the op must overwrite
        row.upload_i32(std::vector<int32_t>(size_t(n * k), -7));
        tok.upload_i32(std::vector<int32_t>(size_t(n * k), -7));
        off.upload_i32(std::vector<int32_t>(size_t(e + 1), -7));
        cu->moe_route_fwd({dl.t(), ex.t(), w.t(), row.t(), tok.t(), rw.t(), off.t(), n, e, k, norm});
        auto as_floats = [](const std::vector<int32_t>& v) { return Vec(v.begin(), v.end()); };
        expect_equal("expert", ints_as_floats(*cu, ex, n * k), as_floats(ref_ex));
        expect_equal("row", ints_as_floats(*cu, row, n * k), as_floats(ref_row));
        expect_equal("token", ints_as_floats(*cu, tok, n * k), as_floats(ref_tok));
        expect_equal("offsets", ints_as_floats(*cu, off, e + 1), as_floats(ref_off));
        const Tol t{2e-6, 0, 2e-6};
        expect_close("weight", w.download(), ref_w, t);
        expect_close("row_weight", rw.download(), ref_rw, t);
      }
}

CUDA_OP_TEST(moe_route_bwd, bf16_and_f32) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = tokens(), e = 32, k = 4;
  for (bool norm : {true, false})
    for (DType dt : {BF, F32}) {
      SCOPED_TRACE(std::string(norm ? "norm " : "") + dtype_name(dt));
      Vec logits = router_logits(n, e, 3), g = randn(41, size_t(n * k));
      std::vector<int32_t> ex(size_t(n * k)), row(size_t(n * k)), tok(size_t(n * k)), off(size_t(e + 1));
      Vec w(size_t(n * k)), rw(size_t(n * k)), ref(size_t(n * e));
      auto be = cpu();
      be->moe_route_fwd({f32_view(logits.data(), {n, e}), Tensor(ex.data(), DType::I32, {n * k}), f32_view(w.data(), {n * k}),
                         Tensor(row.data(), DType::I32, {n * k}), Tensor(tok.data(), DType::I32, {n * k}),
                         f32_view(rw.data(), {n * k}), Tensor(off.data(), DType::I32, {e + 1}), n, e, k, norm});
      be->moe_route_bwd({f32_view(ref.data(), {n, e}), f32_view(g.data(), {n * k}), f32_view(logits.data(), {n, e}),
                         Tensor(ex.data(), DType::I32, {n * k}), n, e, k, norm});
      DBuf dl(*cu, dt, logits), dg(*cu, F32, g), dex(*cu, DType::I32, n * k), out(*cu, dt, n * e);
      dex.upload_i32(ex);
      out.poison();
      cu->moe_route_bwd({out.t(), dg.t(), dl.t(), dex.t(), n, e, k, norm});
      expect_close("dlogits", out.download(), ref, dt == BF ? Tol{kBf16U, 1e-6, kBf16U} : Tol{1e-5, 1e-6, 1e-5});
    }
}

// The load-balancing loss on the device: the statistics (probability sums and choice counts over
// the unmasked tokens, added to what the buffers hold) and the backward with aux_grad and a mask.
CUDA_OP_TEST(moe_router_stats, and_the_aux_gradient) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = tokens(), e = 32, k = 4;
  for (DType dt : {BF, F32}) {
    SCOPED_TRACE(dtype_name(dt));
    Vec logits = router_logits(n, e, 3), g = randn(41, size_t(n * k)), aux = randn(43, size_t(e));
    if (dt == BF) logits = round_bf16(std::move(logits));
    Vec mask(size_t(n), 1.0f);
    for (int64_t t = 0; t < n; t += 5) mask[size_t(t)] = 0.0f;
    std::vector<int32_t> ex(size_t(n * k)), row(size_t(n * k)), tok(size_t(n * k)), off(size_t(e + 1));
    Vec w(size_t(n * k)), rw(size_t(n * k)), ref(size_t(n * e)), ps(size_t(e), 0.25f), cs(size_t(e), 1.0f);
    auto be = cpu();
    be->moe_route_fwd({f32_view(logits.data(), {n, e}), Tensor(ex.data(), DType::I32, {n * k}), f32_view(w.data(), {n * k}),
                       Tensor(row.data(), DType::I32, {n * k}), Tensor(tok.data(), DType::I32, {n * k}),
                       f32_view(rw.data(), {n * k}), Tensor(off.data(), DType::I32, {e + 1}), n, e, k, true});
    be->moe_router_stats({f32_view(ps.data(), {e}), f32_view(cs.data(), {e}), f32_view(logits.data(), {n, e}),
                          Tensor(ex.data(), DType::I32, {n * k}), f32_view(mask.data(), {n}), n, e, k});
    MoeRouteBwdArgs rb{f32_view(ref.data(), {n, e}), f32_view(g.data(), {n * k}), f32_view(logits.data(), {n, e}),
                       Tensor(ex.data(), DType::I32, {n * k}), n, e, k, true};
    rb.aux_grad = f32_view(aux.data(), {e});
    rb.mask = f32_view(mask.data(), {n});
    be->moe_route_bwd(rb);
    DBuf dl(*cu, dt, logits), dg(*cu, F32, g), dex(*cu, DType::I32, n * k), out(*cu, dt, n * e), da(*cu, F32, aux),
        dm(*cu, F32, mask), dps(*cu, F32, Vec(size_t(e), 0.25f)), dcs(*cu, F32, Vec(size_t(e), 1.0f));
    dex.upload_i32(ex);
    cu->moe_router_stats({dps.t(), dcs.t(), dl.t(), dex.t(), dm.t(), n, e, k});
    expect_close("prob_sum", dps.download(), ps, Tol{1e-5, 1e-6, 1e-5});
    expect_equal("count", dcs.download(), cs);
    out.poison();
    MoeRouteBwdArgs gb{out.t(), dg.t(), dl.t(), dex.t(), n, e, k, true};
    gb.aux_grad = da.t();
    gb.mask = dm.t();
    cu->moe_route_bwd(gb);
    expect_close("dlogits", out.download(), ref, dt == BF ? Tol{kBf16U, 1e-6, kBf16U} : Tol{1e-5, 1e-6, 1e-5});
  }
}

CUDA_OP_TEST(gather_rows, scaled_bf16_and_f32) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t rows = tokens(), c = small_shapes() ? 40 : 2048, m = 3 * rows;
  Rng rng(3);
  std::vector<int32_t> index(static_cast<size_t>(m));
  for (auto& i : index) i = int32_t(rng.below(uint64_t(rows)));
  const Vec scale = randn(44, size_t(m));
  for (bool scaled : {true, false})
    for (DType dt : {BF, F32}) {
      const Vec src = dt == BF ? round_bf16(randn(43, size_t(rows * c))) : randn(43, size_t(rows * c));
      Vec ref(size_t(m * c)), src_h = src, scale_h = scale;
      cpu()->gather_rows({f32_view(ref.data(), {m, c}), f32_view(src_h.data(), {rows, c}),
                          scaled ? f32_view(scale_h.data(), {m}) : Tensor(), index.data(), m, c});
      DBuf ds(*cu, dt, src), dsc(*cu, F32, scale), di(*cu, DType::I32, m), out(*cu, dt, m * c);
      di.upload_i32(index);
      out.poison();
      cu->gather_rows({out.t(), ds.t(), scaled ? dsc.t() : Tensor(), di.i32(), m, c});
      expect_close(std::string("gather_rows ") + dtype_name(dt), out.download(), ref,
                   dt == BF ? Tol{kBf16U, 0, kBf16U} : Tol{1e-7, 0, 1e-7});
    }
}

CUDA_OP_TEST(combine_rows, weighted_unweighted_accumulate) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = tokens(), k = 4, c = small_shapes() ? 40 : 2048, m = n * k;
  std::vector<int32_t> row(static_cast<size_t>(m));
  std::iota(row.begin(), row.end(), 0);
  Rng rng(4);
  for (int64_t i = m - 1; i > 0; i--) std::swap(row[size_t(i)], row[size_t(rng.below(uint64_t(i + 1)))]);
  const Vec w = randn(46, size_t(n * k));
  for (int mode = 0; mode < 3; mode++)
    for (DType dt : {BF, F32}) {
      SCOPED_TRACE("mode " + std::to_string(mode) + " " + dtype_name(dt));
      const Vec src = dt == BF ? round_bf16(randn(45, size_t(m * c))) : randn(45, size_t(m * c));
      const Vec base = dt == BF ? round_bf16(randn(47, size_t(n * c))) : randn(47, size_t(n * c));
      Vec ref = base, src_h = src, w_h = w;
      cpu()->combine_rows({f32_view(ref.data(), {n, c}), f32_view(src_h.data(), {m, c}),
                           mode == 1 ? Tensor() : f32_view(w_h.data(), {n * k}), row.data(), n, k, c, mode == 2});
      DBuf ds(*cu, dt, src), dw(*cu, F32, w), dr(*cu, DType::I32, m), out(*cu, dt, base);
      dr.upload_i32(row);
      if (mode != 2) out.poison();
      cu->combine_rows({out.t(), ds.t(), mode == 1 ? Tensor() : dw.t(), dr.i32(), n, k, c, mode == 2});
      expect_close("combine_rows", out.download(), ref, dt == BF ? Tol{kBf16U, 1e-6, kBf16U} : Tol{1e-6, 1e-7, 1e-6});
    }
}

CUDA_OP_TEST(row_dots, bf16_and_f32) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = tokens(), k = 2, c = small_shapes() ? 40 : 4096, m = n * k;
  std::vector<int32_t> row(static_cast<size_t>(n * k));
  Rng rng(5);
  for (auto& r : row) r = int32_t(rng.below(uint64_t(m)));
  for (DType dt : {BF, F32}) {
    const Vec a = dt == BF ? round_bf16(randn(48, size_t(n * c))) : randn(48, size_t(n * c));
    const Vec b = dt == BF ? round_bf16(randn(49, size_t(m * c))) : randn(49, size_t(m * c));
    Vec ref(size_t(n * k)), a_h = a, b_h = b;
    cpu()->row_dots({f32_view(ref.data(), {n, k}), f32_view(a_h.data(), {n, c}), f32_view(b_h.data(), {m, c}), row.data(), n,
                     k, c});
    DBuf da(*cu, dt, a), db(*cu, dt, b), dr(*cu, DType::I32, n * k), out(*cu, F32, n * k);
    dr.upload_i32(row);
    out.poison();
    cu->row_dots({out.t(), da.t(), db.t(), dr.i32(), n, k, c});
    // Two f32 sums of c products in different orders (the CPU's sequential, the warp's strided):
    // each off by ~sqrt(c) ulps of partial sums as large as the output's rms (sqrt(c) here), so
    // ~c 2^-24 ~ 4e-6 of the rms for c = 4096; 2e-5 leaves a factor of five.
    expect_close(std::string("row_dots ") + dtype_name(dt), out.download(), ref, Tol{1e-5, 2e-5, 1e-5});
  }
}

}  // namespace
}  // namespace qlora::test
