// Every backend op on the GPU against the CPU reference, on random inputs and model-sized shapes.
//
// The CPU backend (fp32, verified against PyTorch) gets exactly the values the GPU tensors hold:
// inputs stored as BF16 on the GPU are rounded to bf16 before the CPU sees them. What remains is
// the GPU's own rounding, so each tolerance is derived from bf16 (see cuda_test_util.h and
// docs/cuda_backend.md): one output rounding for elementwise ops, operand rounding for GEMMs with an
// f32 operand, and bf16 P / dS for attention. Outputs are NaN-poisoned before each run.
// Attention cases live in test_cuda_attention.cpp; the coverage test checks every op has a case.
#include <omp.h>

#include "cuda_test_util.h"
#include "core/error.h"
#include "quant/quant_layout.h"
#include "quant/quantize.h"

namespace qlora::test {
namespace {

std::unique_ptr<Backend> cpu() { return make_cpu_backend(); }

constexpr DType BF = DType::BF16;
constexpr DType F32 = DType::F32;

// ---------------------------------------------------------------------------------------------
// matmul

struct MmCase {
  const char* name;
  int64_t m, n, k;
  bool ta, tb;
  DType c, a, b;
  float alpha, beta;
};

// Tolerances: bf16 x bf16 products are exact in f32, so a BF16 C differs from the fp32 reference by
// its final rounding (<= u |C|, u = 2^-8) and an F32 C by the accumulation only. Tensor cores may
// truncate when they align partial sums (not round to nearest), so their fp32 accumulation error
// can grow like k 2^-24 of the partial sums rather than sqrt(k) 2^-24: that is the `acc` term,
// applied per element against rms(C) and normwise. An F32 operand is rounded to bf16 first
// (relative <= u per element), which moves C by ~u/sqrt(3) of its rms for random data (4.5 sigma
// over a large C: ~2.6u): elementwise 8u of rms(C), normwise 2u.
Tol mm_tol(const MmCase& c) {
  const double acc = double(c.k) / 16777216.0;  // k 2^-24
  const bool f32_in = c.a == F32 || c.b == F32;
  if (c.a == F32 && c.b == F32 && c.c == F32) return {1e-5, 1e-5 + acc, 1e-5 + acc};  // SIMT fp32, RN
  if (f32_in) return {kBf16U, 8 * kBf16U + 2 * acc, 2 * kBf16U + acc};
  if (c.c == BF) return {kBf16U, 1e-5 + 2 * acc, kBf16U + acc};
  return {1e-5, 5e-5 + 2 * acc, 1e-5 + acc};
}

void run_mm(Backend& cu, const MmCase& c, uint64_t seed) {
  SCOPED_TRACE(c.name);
  const int64_t mn = c.m * c.n;
  Vec A = randn(seed, size_t(c.m * c.k)), B = randn(seed + 1, size_t(c.k * c.n));
  if (c.a == BF) A = round_bf16(std::move(A));
  if (c.b == BF) B = round_bf16(std::move(B));
  Vec C0 = c.beta != 0.0f ? randn(seed + 2, size_t(mn)) : Vec(size_t(mn), 0.0f);
  if (c.c == BF) C0 = round_bf16(std::move(C0));

  Vec ref = C0;
  auto cb = cpu();
  const std::initializer_list<int64_t> a_shape = {c.ta ? c.k : c.m, c.ta ? c.m : c.k};
  const std::initializer_list<int64_t> b_shape = {c.tb ? c.n : c.k, c.tb ? c.k : c.n};
  cb->matmul({f32_view(ref.data(), {c.m, c.n}), f32_view(A.data(), a_shape), f32_view(B.data(), b_shape), c.m, c.n,
              c.k, c.ta, c.tb, c.alpha, c.beta});

  DBuf da(cu, c.a, A), db(cu, c.b, B), dc(cu, c.c, mn);
  if (c.beta != 0.0f)
    dc.upload(C0);
  else
    dc.poison();  // beta == 0 must ignore C entirely, NaN included
  cu.matmul({dc.t({c.m, c.n}), da.t(a_shape), db.t(b_shape), c.m, c.n, c.k, c.ta, c.tb, c.alpha, c.beta});
  expect_close(c.name, dc.download(), ref, mm_tol(c));
}

std::vector<MmCase> mm_cases() {
  if (small_shapes())
    return {
        {"small_bf16_nt", 77, 256, 512, false, true, BF, BF, BF, 1.0f, 0.0f},
        {"small_lora_h", 77, 16, 512, false, true, BF, BF, F32, 1.0f, 0.0f},
        {"small_lora_dB", 256, 16, 77, true, false, F32, BF, BF, 2.0f, 1.0f},
        {"small_dlogits", 33, 128, 1000, false, false, BF, F32, BF, 1.0f, 0.0f},
        {"small_f32", 77, 96, 200, true, true, F32, F32, F32, 0.5f, 1.0f},
        {"small_odd", 77, 33, 19, false, false, BF, BF, BF, 1.0f, 1.0f},
    };
  const int64_t N = 77;  // an odd token count, as a packed micro-batch tail gives
  return {
      // Llama-3-8B: C=4096, F=14336, V=128256, LoRA r=16
      {"8b_q_proj_fwd", 512, 4096, 4096, false, true, BF, BF, BF, 1.0f, 0.0f},
      {"8b_gate_fwd", N, 14336, 4096, false, true, BF, BF, BF, 1.0f, 0.0f},
      {"8b_down_dgrad_acc", N, 14336, 4096, false, false, BF, BF, BF, 1.0f, 1.0f},
      {"8b_lora_h", N, 16, 4096, false, true, BF, BF, F32, 1.0f, 0.0f},
      {"8b_lora_up_acc", N, 4096, 16, false, true, BF, BF, F32, 2.0f, 1.0f},
      {"8b_lora_dB", 4096, 16, N, true, false, F32, BF, BF, 2.0f, 1.0f},
      {"8b_lora_dA", 16, 4096, N, true, false, F32, BF, BF, 1.0f, 1.0f},
      {"8b_lora_dh", N, 16, 4096, false, false, BF, BF, F32, 2.0f, 0.0f},
      {"8b_lora_dx_acc", N, 4096, 16, false, false, BF, BF, F32, 1.0f, 1.0f},
      {"8b_logits", 64, 128256, 4096, false, true, F32, BF, BF, 1.0f, 0.0f},
      {"8b_head_dgrad", 64, 4096, 128256, false, false, BF, F32, BF, 1.0f, 0.0f},
      // Llama-3-70B: C=8192, F=28672
      {"70b_gate_fwd", N, 28672, 8192, false, true, BF, BF, BF, 1.0f, 0.0f},
      {"70b_down_fwd", N, 8192, 28672, false, true, BF, BF, BF, 1.0f, 0.0f},
      {"70b_up_dgrad", N, 8192, 28672, false, false, BF, BF, BF, 1.0f, 1.0f},
      // the other dtype combinations and odd leading dimensions
      {"f32_sgemm_tt", N, 96, 200, true, true, F32, F32, F32, 0.5f, 1.0f},
      {"bf16_out_f32_in", N, 96, 200, false, true, BF, F32, F32, 1.0f, 0.0f},
      {"odd_ld", N, 33, 19, false, false, BF, BF, BF, 1.0f, 1.0f},
      {"odd_ld_tn", 33, 77, 19, true, false, F32, BF, BF, 1.0f, 0.0f},
  };
}

CUDA_OP_TEST(matmul, shapes_and_dtypes) {
  QLORA_REQUIRE_CUDA(cu);
  uint64_t seed = 100;
  for (const auto& c : mm_cases()) run_mm(*cu, c, seed += 10);
}

CUDA_OP_TEST(matmul, empty_inner_dimension) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t m = 5, n = 7;
  Vec c0 = round_bf16(randn(1, size_t(m * n)));
  DBuf a(*cu, BF, 1), b(*cu, BF, 1), c(*cu, BF, m * n);
  c.upload(c0);
  cu->matmul({c.t({m, n}), a.t({m, 0}), b.t({0, n}), m, n, 0, false, false, 1.0f, 0.5f});
  Vec want(c0.size());
  for (size_t i = 0; i < want.size(); i++) want[i] = 0.5f * c0[i];
  expect_close("beta*C", c.download(), want, {kBf16U, 0, kBf16U});
  c.poison();
  cu->matmul({c.t({m, n}), a.t({m, 0}), b.t({0, n}), m, n, 0, false, false, 1.0f, 0.0f});
  for (float v : c.download()) EXPECT_EQ(v, 0.0f);
}

CUDA_OP_TEST(matmul, output_overlapping_input_is_an_error) {
  QLORA_REQUIRE_CUDA(cu);
  DBuf buf(*cu, BF, 64);
  Tensor c(buf.data(), BF, {4, 4}), a(buf.data(), BF, {4, 4});
  EXPECT_THROW(cu->matmul({c, a, a, 4, 4, 4, false, false, 1.0f, 0.0f}), Error);
}

// ---------------------------------------------------------------------------------------------
// embedding

CUDA_OP_TEST(embedding_fwd, llama_and_smollm_dims) {
  QLORA_REQUIRE_CUDA(cu);
  struct Case { int64_t n, c, v; DType dt; };
  const std::vector<Case> cases = small_shapes() ? std::vector<Case>{{77, 576, 1000, BF}}
                                                 : std::vector<Case>{{77, 4096, 32000, BF}, {300, 576, 49152, BF},
                                                                     {33, 100, 50, F32}};
  for (const auto& cs : cases) {
    Vec table = randn(7, size_t(cs.v * cs.c));
    if (cs.dt == BF) table = round_bf16(std::move(table));
    std::vector<int32_t> tok(static_cast<size_t>(cs.n));
    Rng rng(3);
    for (auto& t : tok) t = int32_t(rng.below(uint64_t(cs.v)));
    tok[1] = tok[0];  // a repeat
    tok.back() = int32_t(cs.v - 1);
    Vec ref(static_cast<size_t>(cs.n * cs.c));
    cpu()->embedding_fwd({f32_view(ref.data(), {cs.n, cs.c}), f32_view(table.data(), {cs.v, cs.c}), tok.data(), cs.n,
                          cs.c, cs.v});
    DBuf dt(*cu, cs.dt, table), dtok(*cu, DType::I32, cs.n), out(*cu, cs.dt, cs.n * cs.c);
    dtok.upload_i32(tok);
    out.poison();
    cu->embedding_fwd({out.t({cs.n, cs.c}), dt.t({cs.v, cs.c}), dtok.i32(), cs.n, cs.c, cs.v});
    expect_equal("embedding_fwd", out.download(), ref);  // a copy: exact
  }
}

CUDA_OP_TEST(embedding_fwd, bad_token_is_a_data_error) {
  QLORA_REQUIRE_CUDA(cu);
  DBuf table(*cu, BF, randn(1, 8 * 16)), tok(*cu, DType::I32, 3), out(*cu, BF, 3 * 16);
  tok.upload_i32({1, 8, 2});  // 8 is outside a vocabulary of 8
  cu->embedding_fwd({out.t({3, 16}), table.t({8, 16}), tok.i32(), 3, 16, 8});
  try {
    cu->synchronize();
    ADD_FAILURE() << "no error raised for token id 8";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Data);
    EXPECT_NE(e.message().find("8"), std::string::npos) << e.message();
  }
  cu->synchronize();  // the error is reported once
}

CUDA_OP_TEST(embedding_bwd, f32_and_bf16_tables) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = small_shapes() ? 40 : 77, c = small_shapes() ? 64 : 4096, v = 1000;
  std::vector<int32_t> tok(static_cast<size_t>(n));
  Rng rng(5);
  for (auto& t : tok) t = int32_t(rng.below(uint64_t(v)));
  tok[1] = tok[2] = tok[0];  // three tokens share a row
  for (DType table_t : {F32, BF}) {
    Vec dout = round_bf16(randn(9, size_t(n * c)));
    Vec d0 = randn(11, size_t(v * c));
    if (table_t == BF) d0 = round_bf16(std::move(d0));
    Vec ref = d0;
    cpu()->embedding_bwd({f32_view(ref.data(), {v, c}), f32_view(dout.data(), {n, c}), tok.data(), n, c, v});
    DBuf dd(*cu, BF, dout), dtab(*cu, table_t, d0), dtok(*cu, DType::I32, n);
    dtok.upload_i32(tok);
    cu->embedding_bwd({dtab.t({v, c}), dd.t({n, c}), dtok.i32(), n, c, v});
    // f32: summation order only. bf16: each of up to 4 atomic adds rounds (2^-9 of the partial sum).
    const Tol tol = table_t == F32 ? Tol{1e-6, 1e-6, 1e-6} : Tol{4 * kBf16U, 4 * kBf16U, kBf16U};
    expect_close(table_t == F32 ? "dtable f32" : "dtable bf16", dtab.download(), ref, tol);
  }
}

// ---------------------------------------------------------------------------------------------
// rmsnorm

CUDA_OP_TEST(rmsnorm_fwd, bf16_and_f32) {
  QLORA_REQUIRE_CUDA(cu);
  struct Case { int64_t n, c; DType dt; };
  const std::vector<Case> cases = small_shapes() ? std::vector<Case>{{77, 256, BF}, {5, 33, F32}}
                                                 : std::vector<Case>{{77, 4096, BF}, {64, 8192, BF}, {77, 577, BF},
                                                                     {33, 4096, F32}};
  for (const auto& cs : cases)
    for (float off : {0.0f, 1.0f}) {  // 1: Gemma's (1 + w), the weight stored as its offset from one
    SCOPED_TRACE("w_offset " + std::to_string(off));
    Vec x = randn(21, size_t(cs.n * cs.c), 2.0f), w = randn(22, size_t(cs.c));
    if (cs.dt == BF) x = round_bf16(std::move(x)), w = round_bf16(std::move(w));
    Vec ref(x.size()), ref_rstd(static_cast<size_t>(cs.n));
    cpu()->rmsnorm_fwd({f32_view(ref.data(), {cs.n, cs.c}), f32_view(ref_rstd.data(), {cs.n}),
                        f32_view(x.data(), {cs.n, cs.c}), f32_view(w.data(), {cs.c}), cs.n, cs.c, 1e-5f, off});
    DBuf dx(*cu, cs.dt, x), dw(*cu, cs.dt, w), out(*cu, cs.dt, cs.n * cs.c), rstd(*cu, F32, cs.n);
    out.poison();
    rstd.poison();
    cu->rmsnorm_fwd({out.t({cs.n, cs.c}), rstd.t({cs.n}), dx.t({cs.n, cs.c}), dw.t({cs.c}), cs.n, cs.c, 1e-5f, off});
    // rstd: f32 sum of squares in another order (~1e-6). out: that, plus one bf16 rounding.
    expect_close("rstd", rstd.download(), ref_rstd, {2e-5, 0, 2e-5});
    expect_close("out", out.download(), ref,
                 cs.dt == BF ? Tol{kBf16U + 2e-5, 0, kBf16U} : Tol{3e-5, 1e-6, 3e-5});
  }
}

// Gemma's offset: the CPU's (1 + w) output is not its plain-w output, so the check above sees it.
TEST(CpuOps, RmsnormWeightOffsetMultipliesByOnePlusW) {
  const int64_t n = 3, c = 40;
  Vec x = randn(23, size_t(n * c)), w = randn(24, size_t(c)), a(x.size()), b(x.size()), rs(3);
  Vec w1 = w;
  for (float& v : w1) v += 1.0f;
  cpu()->rmsnorm_fwd({f32_view(a.data(), {n, c}), f32_view(rs.data(), {n}), f32_view(x.data(), {n, c}),
                      f32_view(w.data(), {c}), n, c, 1e-5f, 1.0f});
  cpu()->rmsnorm_fwd({f32_view(b.data(), {n, c}), f32_view(rs.data(), {n}), f32_view(x.data(), {n, c}),
                      f32_view(w1.data(), {c}), n, c, 1e-5f});
  EXPECT_EQ(a, b);
}

CUDA_OP_TEST(rmsnorm_bwd, with_and_without_dw_and_in_place) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = small_shapes() ? 33 : 77, c = small_shapes() ? 256 : 4096;
  Vec x = round_bf16(randn(31, size_t(n * c), 2.0f)), w = round_bf16(randn(32, size_t(c)));
  Vec dout = round_bf16(randn(33, size_t(n * c)));
  Vec y(x.size()), rstd(static_cast<size_t>(n));
  auto cb = cpu();
  cb->rmsnorm_fwd({f32_view(y.data(), {n, c}), f32_view(rstd.data(), {n}), f32_view(x.data(), {n, c}),
                   f32_view(w.data(), {c}), n, c, 1e-5f});
  Vec dw0 = randn(34, size_t(c));
  // dx = r w dout - coef x cancels: the f32 dot over C adds ~1e-6 of rms on top of one rounding.
  const Tol dx_tol{kBf16U + 1e-5, 1e-4, kBf16U};
  for (float off : {0.0f, 1.0f}) {  // 1: Gemma's (1 + w)
  Vec ref_dx(x.size()), ref_dw = dw0;
  cb->rmsnorm_bwd({f32_view(ref_dx.data(), {n, c}), f32_view(ref_dw.data(), {c}), f32_view(dout.data(), {n, c}),
                   f32_view(x.data(), {n, c}), f32_view(w.data(), {c}), f32_view(rstd.data(), {n}), n, c, off});
  for (int variant = 0; variant < 3; variant++) {  // 0: dw f32 "+=", 1: frozen (no dw), 2: dx aliases dout
    SCOPED_TRACE("w_offset " + std::to_string(off));
    DBuf dx(*cu, BF, n * c), dd(*cu, BF, dout), xx(*cu, BF, x), ww(*cu, BF, w), rs(*cu, F32, rstd), dw(*cu, F32, dw0);
    dx.poison();
    const Tensor dx_t = variant == 2 ? dd.t({n, c}) : dx.t({n, c});
    cu->rmsnorm_bwd({dx_t, variant == 0 ? dw.t({c}) : Tensor(), dd.t({n, c}), xx.t({n, c}), ww.t({c}), rs.t({n}), n, c,
                     off});
    expect_close("dx variant " + std::to_string(variant), variant == 2 ? dd.download() : dx.download(), ref_dx, dx_tol);
    if (variant == 0) expect_close("dw", dw.download(), ref_dw, {1e-5, 1e-5, 1e-5});
    if (variant == 1) expect_equal("dw untouched", dw.download(), dw0);
  }
  }
}

// ---------------------------------------------------------------------------------------------
// rope

void run_rope(Backend& cu, bool bwd) {
  const int64_t n = small_shapes() ? 20 : 77, d = 128;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  Rng rng(41);
  for (auto& p : pos) p = int32_t(rng.below(131072));  // long-context positions: large angles
  pos[0] = 0;
  Vec inv(static_cast<size_t>(d / 2));
  for (int64_t j = 0; j < d / 2; j++) inv[size_t(j)] = float(1.0 / std::pow(500000.0, double(2 * j) / double(d)));
  // Every dim rotated; then Phi-4-mini's partial rotary (96 of 128) with a LongRoPE attention factor.
  for (int64_t h : {small_shapes() ? int64_t(4) : int64_t(32), int64_t(8)}) {
    for (DType dt : {BF, F32}) {
      const int64_t rot = h == 8 ? 96 : d;
      const float scale = h == 8 ? 1.19024f : 1.0f;
      Vec x = randn(42 + uint64_t(h), size_t(n * h * d));
      if (dt == BF) x = round_bf16(std::move(x));
      Vec ref = x;
      RopeArgs ra{f32_view(ref.data(), {n, h, d}), f32_view(inv.data(), {rot / 2}), pos.data(), n, h, d, rot, scale};
      bwd ? cpu()->rope_bwd(ra) : cpu()->rope_fwd(ra);
      DBuf dx(cu, dt, x), di(cu, F32, inv), dp(cu, DType::I32, n);
      dp.upload_i32(pos);
      RopeArgs ga{dx.t({n, h, d}), di.t({rot / 2}), dp.i32(), n, h, d, rot, scale};
      bwd ? cu.rope_bwd(ga) : cu.rope_fwd(ga);
      // cos/sin of the same f32 angle agree to ~1e-7; then one bf16 rounding of each output.
      expect_close(std::string(bwd ? "rope_bwd " : "rope_fwd ") + dtype_name(dt), dx.download(), ref,
                   dt == BF ? Tol{kBf16U + 1e-5, 1e-5, kBf16U} : Tol{1e-5, 1e-5, 1e-5});
    }
  }
}

CUDA_OP_TEST(rope_fwd, q_and_k_heads) {
  QLORA_REQUIRE_CUDA(cu);
  run_rope(*cu, false);
}
CUDA_OP_TEST(rope_bwd, q_and_k_heads) {
  QLORA_REQUIRE_CUDA(cu);
  run_rope(*cu, true);
}

// ---------------------------------------------------------------------------------------------
// elementwise

int64_t ew_n() { return small_shapes() ? 77 * 96 + 3 : 77 * 14336 + 3; }  // +3: the scalar tail

// Elementwise f32 math that differs from the CPU only in exp/div ulps; then the output rounding.
Tol ew_tol(DType out) { return out == BF ? Tol{kBf16U + 1e-6, 1e-7, kBf16U} : Tol{4e-6, 1e-7, 4e-6}; }

constexpr ClampedSwigluParams kClamp{1.702f, 1.5f};  // gpt-oss's alpha; a limit inside the inputs' range

CUDA_OP_TEST(swiglu_fwd, bf16_and_f32) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = ew_n();
  // SwiGLU, Gemma's GeGLU and gpt-oss's clamped SwiGLU (a limit the inputs cross on both sides)
  for (Activation act : {Activation::Silu, Activation::GeluTanh, Activation::ClampedSwiglu})
  for (DType dt : {BF, F32}) {
    SCOPED_TRACE(activation_name(act));
    Vec g = randn(51, size_t(n), 3.0f), u = randn(52, size_t(n));
    if (dt == BF) g = round_bf16(std::move(g)), u = round_bf16(std::move(u));
    Vec ref(static_cast<size_t>(n));
    cpu()->swiglu_fwd({f32_view(ref.data(), {n}), f32_view(g.data(), {n}), f32_view(u.data(), {n}), n, act, kClamp});
    DBuf dg(*cu, dt, g), du(*cu, dt, u), out(*cu, dt, n);
    out.poison();
    cu->swiglu_fwd({out.t(), dg.t(), du.t(), n, act, kClamp});
    expect_close(std::string("swiglu_fwd ") + dtype_name(dt), out.download(), ref, ew_tol(dt));
  }
}

// The CPU's GeGLU against torch's formula evaluated in double, and its backward against finite
// differences of that (so the CUDA check above compares with a correct reference).
TEST(CpuOps, GegluMatchesTheTanhGeluFormula) {
  const int64_t n = 2001;
  Vec g = randn(56, size_t(n), 3.0f), u = randn(57, size_t(n)), d = randn(58, size_t(n)), out(g.size());
  auto gelu = [](double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); };
  cpu()->swiglu_fwd({f32_view(out.data(), {n}), f32_view(g.data(), {n}), f32_view(u.data(), {n}), n, Activation::GeluTanh});
  Vec dg(g.size()), du(g.size());
  cpu()->swiglu_bwd({f32_view(dg.data(), {n}), f32_view(du.data(), {n}), f32_view(d.data(), {n}),
                     f32_view(g.data(), {n}), f32_view(u.data(), {n}), n, Activation::GeluTanh});
  for (int64_t i = 0; i < n; i++) {
    const double x = g[size_t(i)], h = 1e-4;
    EXPECT_NEAR(out[size_t(i)], gelu(x) * u[size_t(i)], 2e-6 * (1 + std::fabs(gelu(x) * u[size_t(i)]))) << i;
    const double fd = (gelu(x + h) - gelu(x - h)) / (2 * h) * u[size_t(i)] * d[size_t(i)];
    EXPECT_NEAR(dg[size_t(i)], fd, 1e-5 * (1 + std::fabs(fd))) << i;
    EXPECT_NEAR(du[size_t(i)], gelu(x) * d[size_t(i)], 2e-6 * (1 + std::fabs(gelu(x) * d[size_t(i)]))) << i;
  }
}

// The CPU's clamped SwiGLU against gpt-oss's formula in double, and its backward against finite
// differences of that away from the clamps' kinks (where the gradient is 0 past each limit).
TEST(CpuOps, ClampedSwigluMatchesGptOssFormula) {
  const int64_t n = 2001;
  Vec g = randn(59, size_t(n), 3.0f), u = randn(60, size_t(n), 3.0f), d = randn(61, size_t(n)), out(g.size());
  const double a = kClamp.alpha, lim = kClamp.limit;
  auto f = [&](double x, double y) {
    const double gc = std::min(x, lim), uc = std::clamp(y, -lim, lim);
    return (uc + 1) * gc / (1 + std::exp(-a * gc));
  };
  auto v = [](Vec& x) { return f32_view(x.data(), {int64_t(x.size())}); };
  cpu()->swiglu_fwd({v(out), v(g), v(u), n, Activation::ClampedSwiglu, kClamp});
  Vec dg(g.size()), du(g.size());
  cpu()->swiglu_bwd({v(dg), v(du), v(d), v(g), v(u), n, Activation::ClampedSwiglu, kClamp});
  int clamped_g = 0, clamped_u = 0;
  for (int64_t i = 0; i < n; i++) {
    const size_t k = size_t(i);
    const double x = g[k], y = u[k], h = 1e-4;
    EXPECT_NEAR(out[k], f(x, y), 2e-6 * (1 + std::fabs(f(x, y)))) << i;
    if (std::fabs(x - lim) < 2 * h || std::fabs(std::fabs(y) - lim) < 2 * h) continue;  // a kink
    clamped_g += x > lim, clamped_u += std::fabs(y) > lim;
    const double fg = (f(x + h, y) - f(x - h, y)) / (2 * h) * d[k], fu = (f(x, y + h) - f(x, y - h)) / (2 * h) * d[k];
    EXPECT_NEAR(dg[k], fg, 1e-5 * (1 + std::fabs(fg))) << i;
    EXPECT_NEAR(du[k], fu, 1e-5 * (1 + std::fabs(fu))) << i;
  }
  EXPECT_GT(clamped_g, n / 10);  // both clamps are exercised
  EXPECT_GT(clamped_u, n / 10);
}

CUDA_OP_TEST(swiglu_bwd, bf16_f32_and_in_place) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = ew_n();
  for (Activation act : {Activation::Silu, Activation::GeluTanh, Activation::ClampedSwiglu})
  for (int variant = 0; variant < 3; variant++) {  // bf16, f32, bf16 with dgate/dup aliasing gate/up
    SCOPED_TRACE(activation_name(act));
    const DType dt = variant == 1 ? F32 : BF;
    Vec g = randn(53, size_t(n), 3.0f), u = randn(54, size_t(n)), d = randn(55, size_t(n));
    if (dt == BF) g = round_bf16(std::move(g)), u = round_bf16(std::move(u)), d = round_bf16(std::move(d));
    Vec rg(static_cast<size_t>(n)), ru(static_cast<size_t>(n));
    cpu()->swiglu_bwd({f32_view(rg.data(), {n}), f32_view(ru.data(), {n}), f32_view(d.data(), {n}),
                       f32_view(g.data(), {n}), f32_view(u.data(), {n}), n, act, kClamp});
    DBuf dg(*cu, dt, g), du(*cu, dt, u), dd(*cu, dt, d), og(*cu, dt, n), ou(*cu, dt, n);
    og.poison();
    ou.poison();
    const bool alias = variant == 2;
    cu->swiglu_bwd({alias ? dg.t() : og.t(), alias ? du.t() : ou.t(), dd.t(), dg.t(), du.t(), n, act, kClamp});
    expect_close("dgate v" + std::to_string(variant), alias ? dg.download() : og.download(), rg, ew_tol(dt));
    expect_close("dup v" + std::to_string(variant), alias ? du.download() : ou.download(), ru, ew_tol(dt));
  }
}

CUDA_OP_TEST(add, dtype_combinations_and_unaligned) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = ew_n();
  for (auto [yt, xt] : {std::pair{BF, BF}, {F32, BF}, {F32, F32}, {BF, F32}}) {
    Vec y = randn(61, size_t(n)), x = randn(62, size_t(n));
    if (yt == BF) y = round_bf16(std::move(y));
    if (xt == BF) x = round_bf16(std::move(x));
    Vec ref = y;
    cpu()->add({f32_view(ref.data(), {n}), f32_view(x.data(), {n}), n});
    DBuf dy(*cu, yt, y), dx(*cu, xt, x);
    cu->add({dy.t(), dx.t(), n});
    expect_close(std::string("add ") + dtype_name(yt) + "+=" + dtype_name(xt), dy.download(), ref,
                 yt == BF ? Tol{kBf16U, 0, kBf16U} : Tol{0, 0, 0});
  }
  // One element in: pointers no longer 16-byte aligned, so the scalar path runs.
  Vec y = round_bf16(randn(63, size_t(n))), x = round_bf16(randn(64, size_t(n)));
  Vec ref = y;
  cpu()->add({f32_view(ref.data() + 1, {n - 1}), f32_view(x.data() + 1, {n - 1}), n - 1});
  DBuf dy(*cu, BF, y), dx(*cu, BF, x);
  cu->add({Tensor(static_cast<uint16_t*>(dy.data()) + 1, BF, {n - 1}),
           Tensor(static_cast<uint16_t*>(dx.data()) + 1, BF, {n - 1}), n - 1});
  expect_close("add unaligned", dy.download(), ref, {kBf16U, 0, kBf16U});
}

CUDA_OP_TEST(bias_add, bf16_f32_and_odd_width) {
  QLORA_REQUIRE_CUDA(cu);
  struct Case { int64_t n, m; DType dt; };
  for (const auto& cs : {Case{77, small_shapes() ? 256 : 4096, BF}, Case{77, 1024, F32}, Case{33, 77, BF}}) {
    Vec y = randn(71, size_t(cs.n * cs.m)), b = randn(72, size_t(cs.m));
    if (cs.dt == BF) y = round_bf16(std::move(y)), b = round_bf16(std::move(b));
    Vec ref = y;
    cpu()->bias_add({f32_view(ref.data(), {cs.n, cs.m}), f32_view(b.data(), {cs.m}), cs.n, cs.m});
    DBuf dy(*cu, cs.dt, y), db(*cu, cs.dt, b);
    cu->bias_add({dy.t({cs.n, cs.m}), db.t({cs.m}), cs.n, cs.m});
    expect_close("bias_add m=" + std::to_string(cs.m), dy.download(), ref,
                 cs.dt == BF ? Tol{kBf16U, 0, kBf16U} : Tol{0, 0, 0});
  }
}

CUDA_OP_TEST(scale, bf16_and_f32) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = ew_n();
  for (DType dt : {BF, F32}) {
    Vec x = randn(81, size_t(n));
    if (dt == BF) x = round_bf16(std::move(x));
    Vec ref = x;
    cpu()->scale({f32_view(ref.data(), {n}), n, 0.37f});
    DBuf dx(*cu, dt, x);
    cu->scale({dx.t(), n, 0.37f});
    expect_close(std::string("scale ") + dtype_name(dt), dx.download(), ref,
                 dt == BF ? Tol{kBf16U, 0, kBf16U} : Tol{0, 0, 0});
  }
}

// The mask must be the CPU's exactly (same stateless hash): zeros must coincide, and f32 values
// are the same single multiply, hence bit-identical.
void run_dropout(Backend& cu, bool bwd) {
  const int64_t n = ew_n();
  for (float p : {0.1f, 0.0f, 1.0f, 0.5f}) {
    for (DType dt : {BF, F32}) {
      Vec x = randn(91, size_t(n));
      if (dt == BF) x = round_bf16(std::move(x));
      Vec ref(static_cast<size_t>(n));
      const uint64_t seed = 1234, stream = 3 * 7 + 2;
      DropoutArgs ca{f32_view(ref.data(), {n}), f32_view(x.data(), {n}), n, p, seed, stream};
      bwd ? cpu()->dropout_bwd(ca) : cpu()->dropout_fwd(ca);
      DBuf dx(cu, dt, x), out(cu, dt, n);
      out.poison();
      const bool in_place = bwd;  // the model runs dropout_bwd in place
      DropoutArgs ga{in_place ? dx.t() : out.t(), dx.t(), n, p, seed, stream};
      bwd ? cu.dropout_bwd(ga) : cu.dropout_fwd(ga);
      const Vec got = in_place ? dx.download() : out.download();
      const std::string what = std::string(bwd ? "dropout_bwd" : "dropout_fwd") + " p=" + std::to_string(p) + " " +
                               dtype_name(dt);
      int64_t mask_diff = 0;
      for (size_t i = 0; i < got.size(); i++) mask_diff += (got[i] == 0.0f) != (ref[i] == 0.0f);
      EXPECT_EQ(mask_diff, 0) << what << ": dropout masks differ";
      if (dt == F32)
        expect_equal(what, got, ref);
      else
        expect_close(what, got, ref, {kBf16U, 0, kBf16U});
    }
  }
}

CUDA_OP_TEST(dropout_fwd, same_mask_as_cpu) {
  QLORA_REQUIRE_CUDA(cu);
  run_dropout(*cu, false);
}
CUDA_OP_TEST(dropout_bwd, same_mask_as_cpu_in_place) {
  QLORA_REQUIRE_CUDA(cu);
  run_dropout(*cu, true);
}

// ---------------------------------------------------------------------------------------------
// loss and optimizer

CUDA_OP_TEST(cross_entropy_fwd_bwd, f32_in_place_and_bf16) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = small_shapes() ? 9 : 37, v = small_shapes() ? 1000 : 128256;
  std::vector<int32_t> labels(static_cast<size_t>(n));
  Rng rng(101);
  for (auto& y : labels) y = int32_t(rng.below(uint64_t(v)));
  labels[2] = labels[5] = -100;  // ignored rows
  labels[3] = int32_t(v - 1);
  const float gs = 1.0f / float(n - 2);
  // Also with Gemma 2's final soft-capping (a cap of 3 bends logits of sd 2).
  for (float cap : {0.0f, 3.0f})
  for (DType dt : {F32, BF}) {
    SCOPED_TRACE("softcap " + std::to_string(cap));
    Vec logits = randn(102, size_t(n * v), 2.0f);
    if (dt == BF) logits = round_bf16(std::move(logits));
    Vec ref_d(static_cast<size_t>(n * v)), ref_loss(static_cast<size_t>(n));
    Vec lcopy = logits;
    cpu()->cross_entropy_fwd_bwd({f32_view(lcopy.data(), {n, v}), f32_view(ref_d.data(), {n, v}),
                                  f32_view(ref_loss.data(), {n}), labels.data(), n, v, gs, cap});
    DBuf dl(*cu, dt, logits), dd(*cu, dt, n * v), loss(*cu, F32, n), dy(*cu, DType::I32, n);
    dy.upload_i32(labels);
    loss.poison();
    dd.poison();
    const bool in_place = dt == F32;  // the model passes dlogits == logits
    cu->cross_entropy_fwd_bwd({dl.t({n, v}), in_place ? dl.t({n, v}) : dd.t({n, v}), loss.t({n}), dy.i32(), n, v, gs, cap});
    // Losses: f32 log-sum-exp over V terms against the CPU's double (~1e-6 relative).
    expect_close(std::string("losses ") + dtype_name(dt), loss.download(), ref_loss, {2e-5, 1e-5, 1e-5});
    expect_close(std::string("dlogits ") + dtype_name(dt), in_place ? dl.download() : dd.download(), ref_d,
                 dt == F32 ? Tol{2e-5, 1e-5, 2e-5} : Tol{kBf16U + 2e-5, 1e-5, kBf16U});
  }
}

CUDA_OP_TEST(cross_entropy_fwd_bwd, bad_label_is_a_data_error) {
  QLORA_REQUIRE_CUDA(cu);
  DBuf l(*cu, F32, randn(1, 2 * 10)), loss(*cu, F32, 2), y(*cu, DType::I32, 2);
  y.upload_i32({3, 10});
  cu->cross_entropy_fwd_bwd({l.t({2, 10}), l.t({2, 10}), loss.t({2}), y.i32(), 2, 10, 1.0f});
  EXPECT_THROW(cu->synchronize(), Error);
}

// The GPU step uses the CPU's operation order with explicit rounding, so three steps in a row
// must give bit-identical parameters and moments (the CPU one is checked against torch).
CUDA_OP_TEST(adamw, bit_identical_to_cpu_over_three_steps) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = 41943;
  for (float wd : {0.0f, 0.01f}) {
    Vec p = randn(111, size_t(n), 0.02f), m(size_t(n), 0.0f), v(size_t(n), 0.0f);
    DBuf dp(*cu, F32, p), dm(*cu, F32, m), dv(*cu, F32, v), dg(*cu, F32, n);
    auto cb = cpu();
    for (int64_t step = 1; step <= 3; step++) {
      Vec g = randn(112 + uint64_t(step), size_t(n), 1e-3f);
      dg.upload(g);
      AdamwArgs ca{f32_view(p.data(), {n}), f32_view(g.data(), {n}), f32_view(m.data(), {n}),
                   f32_view(v.data(), {n}), n, 2e-4f, 0.9f, 0.999f, 1e-8f, wd, step};
      cb->adamw(ca);
      cu->adamw({dp.t(), dg.t(), dm.t(), dv.t(), n, 2e-4f, 0.9f, 0.999f, 1e-8f, wd, step});
    }
    expect_equal("param", dp.download(), p);
    expect_equal("m", dm.download(), m);
    expect_equal("v", dv.download(), v);
  }
}

// Every quantized format, packed as the arena stores it: the bf16 result is dequantize_ref's f32
// value rounded to nearest even, the same bits as the CPU op's output rounded to bf16.
CUDA_OP_TEST(dequantize, every_format_equals_reference) {
  QLORA_REQUIRE_CUDA(cu);
  uint64_t seed = 131;
  struct Shape { int64_t rows, cols; bool dq; };
  // 37 x 576: the 16-byte vector path; 5 x 100: an element-wise tail, bnb without double quant.
  for (const Shape sh : {Shape{37, 576, true}, Shape{5, 100, false}})
  for (const auto& t : quant_formats()) {
    const int64_t rows = sh.rows, cols = sh.cols;
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    QuantParams p;
    p.format = t.format;
    p.double_quant = sh.dq && (t.format == QuantFormat::NF4 || t.format == QuantFormat::FP4);
    Vec w = randn(seed++, size_t(rows * cols), 0.05f);
    const QuantizedTensor q = quantize_ref(w.data(), rows, cols, p);
    std::vector<uint8_t> blob(size_t(quant_layout(q.params, rows, cols).total));
    pack_quantized(q, blob.data());
    Vec want(w.size());
    cpu()->dequantize({f32_view(want.data(), {rows, cols}), blob.data(), p, rows, cols});
    void* dblob = cu->alloc(blob.size());
    cu->copy_to_device(dblob, blob.data(), blob.size());
    DBuf out(*cu, BF, rows * cols);
    cu->dequantize({out.t(), dblob, p, rows, cols});
    expect_equal(quant_format_name(p.format), out.download(), round_bf16(want));
    cu->free(dblob);
  }
}

CUDA_OP_TEST(sumsq, f32_and_bf16_accumulate) {
  QLORA_REQUIRE_CUDA(cu);
  const int64_t n = small_shapes() ? 100003 : 10000003;
  for (DType dt : {F32, BF}) {
    Vec x = randn(121, size_t(n));
    if (dt == BF) x = round_bf16(std::move(x));
    double ref = 5.0, got = 5.0;  // "+=" into the host double
    cpu()->sumsq({{f32_view(x.data(), {n})}, &ref});
    DBuf dx(*cu, dt, x);
    cu->sumsq({{dx.t()}, &got});
    // Each square is exact in double; only the summation order differs (<= n 2^-53 relative).
    EXPECT_NEAR(got, ref, 1e-10 * ref) << dtype_name(dt);
    EXPECT_GT(got, 5.0 + 0.5 * double(n));
  }
}

// Many tensors of both dtypes and odd sizes (an empty one too) in one call: one sum, as the
// global gradient norm takes it.
CUDA_OP_TEST(sumsq, many_tensors_one_reduction) {
  QLORA_REQUIRE_CUDA(cu);
  std::vector<int64_t> sizes = {1, 0, 4097, 33, 700001, 16};
  std::vector<std::unique_ptr<DBuf>> bufs;
  std::vector<Vec> host;
  SumsqArgs ca{{}, nullptr}, ga{{}, nullptr};
  for (size_t i = 0; i < sizes.size(); i++) {
    Vec x = round_bf16(randn(300 + i, size_t(sizes[i])));
    host.push_back(x);
    bufs.push_back(std::make_unique<DBuf>(*cu, i % 2 ? BF : F32, x));
  }
  for (size_t i = 0; i < sizes.size(); i++) {
    ca.xs.push_back(f32_view(host[i].data(), {sizes[i]}));
    ga.xs.push_back(bufs[i]->t());
  }
  double ref = 0, got = 0;
  ca.out = &ref;
  ga.out = &got;
  cpu()->sumsq(ca);
  cu->sumsq(ga);
  EXPECT_NEAR(got, ref, 1e-12 * ref);
  EXPECT_GT(ref, 0.5 * 705000);
}

}  // namespace
}  // namespace qlora::test
