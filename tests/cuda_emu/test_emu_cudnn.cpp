// cuDNN fused attention (SDPA): the frontend graphs the CUDA backend builds, validated for every
// head dim and GQA layout the trainer produces and each target SM (graph.validate() needs no
// device), and the backend's cuDNN path under the host harness (the real wrapper: ragged offsets
// from the seg kernel, variant pack, strides, stats; emu/emu_cudnn.cpp executes the graph by its
// documented semantics) against the CPU reference op.
#if QLORA_HAVE_CUDNN
#include <cudnn_frontend.h>
#endif

#include <cstdlib>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/cudnn_sdpa_graph.h"
#include "cuda_test_util.h"
#include "emu_arch_scope.h"
#include "io/safetensors.h"
#include "model/decoder_model.h"
#include "model/peft_io.h"
#include "train/model_source.h"
#include "train/step.h"
#include "model_test_util.h"

namespace qlora::test {
namespace {

#if QLORA_HAVE_CUDNN
using cuda::sdpa::Shape;
#endif

struct EnvScope {
  explicit EnvScope(const char* v) { v ? (void)setenv("QLORA_ATTENTION_KERNEL", v, 1) : (void)unsetenv("QLORA_ATTENTION_KERNEL"); }
  ~EnvScope() { unsetenv("QLORA_ATTENTION_KERNEL"); }
};

#if QLORA_HAVE_CUDNN  // the frontend graphs and the cuDNN path exist only in a build with cuDNN
// Every head dim the own kernel takes (multiples of 8 up to 128: Llama 128, SmolLM2 64, the fixture
// model 32), with the GQA ratios of Llama-3-8B (32/8), SmolLM2-135M (9/3), MHA and MQA, for packed
// batches of one and of many entries: forward and backward validate on sm_90 and sm_100.
TEST(CudnnGraphs, ValidateOnSm90AndSm100ForTrainerShapes) {
  int checked = 0;
  for (int sm : {90, 100})
    for (bool bwd : {false, true})
      for (int64_t d = 8; d <= 128; d += 8)
        for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{32, 8}, {9, 3}, {4, 4}, {8, 1}})
          for (int64_t entries : {1, 16}) {
            const Shape sh{entries, 512, 2048, hq, hkv, d, 1.0f / std::sqrt(float(d)), bwd};
            auto g = cuda::sdpa::describe(sh, sm);
            EXPECT_EQ(cuda::sdpa::validate(*g), "") << "sm_" << sm << " " << cuda::sdpa::describe_shape(sh);
            checked++;
          }
  EXPECT_EQ(checked, 2 * 2 * 16 * 4 * 2);
  // Mistral v0.1's window of 4096 over 32k-token rows, and Phi-3-mini's 2047 over 4k.
  for (int sm : {90, 100})
    for (bool bwd : {false, true})
      for (auto [s, w] : {std::pair<int64_t, int64_t>{32768, 4096}, {4096, 2047}}) {
        const Shape sh{4, s, 4 * s, 32, 8, 128, 0.088f, bwd, w};
        EXPECT_EQ(cuda::sdpa::validate(*cuda::sdpa::describe(sh, sm)), "") << "sm_" << sm << " " << cuda::sdpa::describe_shape(sh);
      }
}

// What the frontend refuses, and so why the backend does not take cuDNN there: sm_80's ragged
// backward (packed stats), and on sm_100 a backward at head dim 256 (sm_90's validates; the
// backend takes cuDNN up to head dim 128 and runs wider heads on its own kernels).
TEST(CudnnGraphs, RefusalsThatKeepTheOwnKernel) {
  const Shape bwd{8, 512, 4096, 32, 8, 128, 0.088f, true};
  EXPECT_NE(cuda::sdpa::validate(*cuda::sdpa::describe(bwd, 80)).find("Packed/ragged LSE is not supported"),
            std::string::npos);
  Shape wide = bwd;
  wide.d = 256;
  EXPECT_NE(cuda::sdpa::validate(*cuda::sdpa::describe(wide, 100)).find("hidden_dim"), std::string::npos);
}

#endif

struct Case {
  const char* name;
  int64_t b, t, hq, hkv, d;
  std::vector<std::vector<int>> docs;  // per row: document lengths (the rest of the row is padding, its own segment)
  int64_t window = 0;                  // a sliding window (cuDNN's diagonal band), 0: none
};

struct Data {
  Case c;
  std::vector<int32_t> seg;
  int64_t n_docs = 0;
  Vec q, k, v, dout;
  int64_t nq() const { return c.b * c.t * c.hq * c.d; }
  int64_t nkv() const { return c.b * c.t * c.hkv * c.d; }
  float scale() const { return 1.0f / std::sqrt(float(c.d)); }
};

Data make(const Case& c, uint64_t seed) {
  Data a{c, {}, 0, {}, {}, {}, {}};
  a.q = round_bf16(randn(seed, size_t(a.nq())));
  a.k = round_bf16(randn(seed + 1, size_t(a.nkv())));
  a.v = round_bf16(randn(seed + 2, size_t(a.nkv())));
  a.dout = round_bf16(randn(seed + 3, size_t(a.nq())));
  a.seg.assign(size_t(c.b * c.t), 0);
  for (int64_t r = 0; r < c.b; r++) {
    int64_t j = 0;
    int32_t id = 0;
    for (int len : c.docs[size_t(r)]) {
      for (int i = 0; i < len; i++) a.seg[size_t(r * c.t + j++)] = id;
      id++;
      a.n_docs++;
    }
    if (j < c.t) a.n_docs++;  // padding: one more segment, as train/data.cpp packs it
    while (j < c.t) a.seg[size_t(r * c.t + j++)] = id;
  }
  return a;
}

std::vector<Case> cases() {
  return {{"d64_gqa3_docs_pad", 2, 48, 6, 2, 64, {{20, 13}, {30}}},
          {"d128_gqa4_docs", 1, 40, 4, 1, 128, {{7, 1, 32}}},
          {"d32_mha_pad", 2, 24, 2, 2, 32, {{24}, {5, 5, 5}}},
          // Windows shorter than the documents: 7 keys over documents of 13 to 30 tokens.
          {"d64_gqa3_window7_docs_pad", 2, 48, 6, 2, 64, {{20, 13}, {30}}, 7}};
}

// Forward and backward through the cuDNN path equal the CPU op within the bf16 tolerances of the
// own kernel's tests; the path is taken (runs counted) and one graph per (shape, direction) built.
[[maybe_unused]] void check_matches_cpu(const char* arch) {
  emu_test::ArchScope scope(arch);
  EnvScope env(nullptr);
  std::string why;
  auto cu = make_cuda_backend(&why);
  ASSERT_TRUE(cu) << why;
  auto cpu = make_cpu_backend();
  uint64_t seed = 900;
  int64_t runs = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(std::string(c.name) + " sm_" + arch);
    const Data a = make(c, seed += 10);
    const int64_t nq = a.nq(), nkv = a.nkv(), nl = c.b * c.hq * c.t;
    Vec out(static_cast<size_t>(nq)), lse(static_cast<size_t>(nl));
    {
      Vec q = a.q, k = a.k, v = a.v;
      AttentionFwdArgs ra{f32_view(out.data(), {c.b, c.t, c.hq, c.d}), f32_view(lse.data(), {c.b, c.hq, c.t}),
                          f32_view(q.data(), {c.b, c.t, c.hq, c.d}), f32_view(k.data(), {c.b, c.t, c.hkv, c.d}),
                          f32_view(v.data(), {c.b, c.t, c.hkv, c.d}), a.seg.data(), c.b, c.t, c.hq, c.hkv, c.d, a.scale()};
      ra.window = c.window;
      cpu->attention_fwd(ra);
    }
    DBuf q(*cu, DType::BF16, a.q), k(*cu, DType::BF16, a.k), v(*cu, DType::BF16, a.v), d(*cu, DType::BF16, a.dout);
    DBuf o(*cu, DType::BF16, nq), l(*cu, DType::F32, nl), seg(*cu, DType::I32, c.b * c.t);
    seg.upload_i32(a.seg);
    o.poison();
    l.poison();
    AttentionFwdArgs fa{o.t({c.b, c.t, c.hq, c.d}), l.t({c.b, c.hq, c.t}), q.t({c.b, c.t, c.hq, c.d}),
                        k.t({c.b, c.t, c.hkv, c.d}), v.t({c.b, c.t, c.hkv, c.d}), seg.i32(), c.b, c.t, c.hq, c.hkv, c.d,
                        a.scale(), 0, a.n_docs};
    fa.window = c.window;
    cu->attention_fwd(fa);
    cu->synchronize();
    EXPECT_EQ(cuda::cudnn_attention_runs(*cu), ++runs);
    expect_close("out", o.download(), out, {4 * kBf16U, 4 * kBf16U, 2 * kBf16U});
    expect_close("lse", l.download(), lse, {1e-5, 1e-4, 1e-5});

    out = round_bf16(std::move(out));
    Vec rdq(static_cast<size_t>(nq)), rdk(static_cast<size_t>(nkv)), rdv(static_cast<size_t>(nkv));
    {
      Vec qq = a.q, kk = a.k, vv = a.v, dd = a.dout;
      AttentionBwdArgs rb{f32_view(rdq.data(), {c.b, c.t, c.hq, c.d}), f32_view(rdk.data(), {c.b, c.t, c.hkv, c.d}),
                          f32_view(rdv.data(), {c.b, c.t, c.hkv, c.d}), f32_view(dd.data(), {c.b, c.t, c.hq, c.d}),
                          f32_view(qq.data(), {c.b, c.t, c.hq, c.d}), f32_view(kk.data(), {c.b, c.t, c.hkv, c.d}),
                          f32_view(vv.data(), {c.b, c.t, c.hkv, c.d}), f32_view(out.data(), {c.b, c.t, c.hq, c.d}),
                          f32_view(lse.data(), {c.b, c.hq, c.t}), a.seg.data(), c.b, c.t, c.hq, c.hkv, c.d, a.scale()};
      rb.window = c.window;
      cpu->attention_bwd(rb);
    }
    DBuf ob(*cu, DType::BF16, out), lb(*cu, DType::F32, lse);
    DBuf dq(*cu, DType::BF16, nq), dk(*cu, DType::BF16, nkv), dv(*cu, DType::BF16, nkv);
    dq.poison();
    dk.poison();
    dv.poison();
    AttentionBwdArgs gb{dq.t({c.b, c.t, c.hq, c.d}), dk.t({c.b, c.t, c.hkv, c.d}), dv.t({c.b, c.t, c.hkv, c.d}),
                        d.t({c.b, c.t, c.hq, c.d}), q.t({c.b, c.t, c.hq, c.d}), k.t({c.b, c.t, c.hkv, c.d}),
                        v.t({c.b, c.t, c.hkv, c.d}), ob.t({c.b, c.t, c.hq, c.d}), lb.t({c.b, c.hq, c.t}), seg.i32(), c.b,
                        c.t, c.hq, c.hkv, c.d, a.scale(), a.n_docs};
    gb.window = c.window;
    cu->attention_bwd(gb);
    cu->synchronize();
    EXPECT_EQ(cuda::cudnn_attention_runs(*cu), ++runs);
    const Tol tol{4 * kBf16U, 8 * kBf16U, 4 * kBf16U, 1e-4};
    expect_close("dq", dq.download(), rdq, tol);
    expect_close("dk", dk.download(), rdk, tol);
    expect_close("dv", dv.download(), rdv, tol);
  }
  EXPECT_EQ(cuda::cudnn_attention_graphs(*cu), 2 * int64_t(cases().size()));
}

#if QLORA_HAVE_CUDNN
TEST(CudaEmuCudnn, PackedForwardBackwardMatchCpuOnSm90) { check_matches_cpu("90"); }
TEST(CudaEmuCudnn, PackedForwardBackwardMatchCpuOnSm100) { check_matches_cpu("100"); }
#endif

// Where cuDNN does not apply the own kernel runs (no cuDNN call): sm_80, a KV cache, an unknown
// document count, and QLORA_ATTENTION_KERNEL=own on sm_90.
TEST(CudaEmuCudnn, OwnKernelWhereCudnnDoesNotApply) {
  const Case c{"c", 1, 16, 2, 1, 64, {{6, 10}}};
  const Data a = make(c, 5);
  for (auto [arch, env, n_docs] : {std::tuple<const char*, const char*, int64_t>{"80", nullptr, 2}, {"90", nullptr, 0},
                                   {"90", "own", 2}, {"100", "own", 2}}) {
    SCOPED_TRACE(std::string(arch) + " " + (env ? env : "auto") + " n_docs " + std::to_string(n_docs));
    emu_test::ArchScope scope(arch);
    EnvScope e(env);
    std::string why;
    auto cu = make_cuda_backend(&why);
    ASSERT_TRUE(cu) << why;
    DBuf q(*cu, DType::BF16, a.q), k(*cu, DType::BF16, a.k), v(*cu, DType::BF16, a.v);
    DBuf o(*cu, DType::BF16, a.nq()), l(*cu, DType::F32, c.hq * c.t), seg(*cu, DType::I32, c.t);
    seg.upload_i32(a.seg);
    cu->attention_fwd({o.t({1, c.t, c.hq, c.d}), l.t({1, c.hq, c.t}), q.t({1, c.t, c.hq, c.d}), k.t({1, c.t, c.hkv, c.d}),
                       v.t({1, c.t, c.hkv, c.d}), seg.i32(), 1, c.t, c.hq, c.hkv, c.d, a.scale(), 0, n_docs});
    cu->synchronize();
    EXPECT_EQ(cuda::cudnn_attention_runs(*cu), 0);
  }
}

#if QLORA_HAVE_CUDNN
// QLORA_ATTENTION_KERNEL=cudnn where cuDNN does not apply is an Unsupported error saying why; an
// unknown value is a Config error; a call with more documents than it declared fails at the next
// synchronize (docs/errors.md).
TEST(CudaEmuCudnn, ErrorsOfTheCudnnPath) {
  const Case c{"c", 1, 16, 2, 1, 64, {{6, 10}}};
  const Data a = make(c, 7);
  auto run = [&](const char* arch, const char* env, int64_t n_docs) {
    emu_test::ArchScope scope(arch);
    EnvScope e(env);
    std::string why;
    auto cu = make_cuda_backend(&why);
    if (!cu) throw std::runtime_error(why);
    DBuf q(*cu, DType::BF16, a.q), k(*cu, DType::BF16, a.k), v(*cu, DType::BF16, a.v);
    DBuf o(*cu, DType::BF16, a.nq()), l(*cu, DType::F32, c.hq * c.t), seg(*cu, DType::I32, c.t);
    seg.upload_i32(a.seg);
    cu->attention_fwd({o.t({1, c.t, c.hq, c.d}), l.t({1, c.hq, c.t}), q.t({1, c.t, c.hq, c.d}), k.t({1, c.t, c.hkv, c.d}),
                       v.t({1, c.t, c.hkv, c.d}), seg.i32(), 1, c.t, c.hq, c.hkv, c.d, a.scale(), 0, n_docs});
    cu->synchronize();
  };
  auto message = [&](const char* arch, const char* env, int64_t n_docs) -> std::string {
    try {
      run(arch, env, n_docs);
    } catch (const Error& e) {
      return std::string(error_kind_name(e.kind())) + ": " + e.what() + " | " + e.hint();
    }
    return "no error";
  };
  const std::string sm80 = message("80", "cudnn", 2);
  EXPECT_NE(sm80.find("QLORA_ATTENTION_KERNEL=cudnn"), std::string::npos) << sm80;
  EXPECT_NE(sm80.find("compute capability 8.0"), std::string::npos) << sm80;
  const std::string bad = message("90", "fast", 2);
  EXPECT_NE(bad.find("QLORA_ATTENTION_KERNEL"), std::string::npos) << bad;
  EXPECT_NE(bad.find("'fast'"), std::string::npos) << bad;
  // 3 segments (two documents and padding) declared as 1: the seg kernel finds 3 > 1 entry.
  Case c3{"c3", 1, 16, 2, 1, 64, {{6, 8}}};
  const std::string few = [&] {
    const Data a3 = make(c3, 9);
    EXPECT_EQ(a3.n_docs, 3);
    emu_test::ArchScope scope("90");
    EnvScope e(nullptr);
    std::string why;
    auto cu = make_cuda_backend(&why);
    DBuf q(*cu, DType::BF16, a3.q), k(*cu, DType::BF16, a3.k), v(*cu, DType::BF16, a3.v);
    DBuf o(*cu, DType::BF16, a3.nq()), l(*cu, DType::F32, c3.hq * c3.t), seg(*cu, DType::I32, c3.t);
    seg.upload_i32(a3.seg);
    try {
      cu->attention_fwd({o.t({1, c3.t, c3.hq, c3.d}), l.t({1, c3.hq, c3.t}), q.t({1, c3.t, c3.hq, c3.d}),
                         k.t({1, c3.t, c3.hkv, c3.d}), v.t({1, c3.t, c3.hkv, c3.d}), seg.i32(), 1, c3.t, c3.hq, c3.hkv,
                         c3.d, a3.scale(), 0, 1});
      cu->synchronize();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  }();
  EXPECT_NE(few.find("has 3 documents but the call said at most 1"), std::string::npos) << few;
}
#endif

// Whole LoRA training steps on a packed batch (documents and padding as train/data.cpp packs
// them) through the cuDNN path on sm_90 and sm_100 against the CPU backend: the losses and
// gradient norms agree at bf16 precision, and every attention call took cuDNN.
using Run = testing_util::TestModel;

Run make_run(std::unique_ptr<Backend> be) {
  ModelPlanOptions po;
  po.method = Method::Lora;
  po.micro_batch = 2;
  po.seq_len = 12;
  po.checkpointing = Checkpointing::None;
  return testing_util::make_model_on(std::move(be), "llama_gqa", po, testing_util::fixture_lora(),
                                     "parity/llama_gqa_adapter");
}

[[maybe_unused]] void packed_training_matches_cpu(const char* arch) {
  emu_test::ArchScope scope(arch);
  EnvScope env(nullptr);
  std::string why;
  auto cu = make_cuda_backend(&why);
  ASSERT_TRUE(cu) << why;
  Run gpu = make_run(std::move(cu));
  Run cpu = make_run(make_cpu_backend());
  // Row 0: documents of 5 and 7 tokens; row 1: 9 tokens and 3 of padding (its own segment).
  Batch x;
  x.b = 2;
  x.t = 12;
  const int vocab = int(gpu.src.config.vocab_size);
  const std::vector<std::vector<int>> docs{{5, 7}, {9, 3}};
  for (int64_t r = 0; r < x.b; r++) {
    int32_t id = 0;
    for (int len : docs[size_t(r)]) {
      const bool pad = r == 1 && id == 1;
      for (int p = 0; p < len; p++) {
        x.tokens.push_back(pad ? 0 : int32_t((r * 131 + id * 17 + p * 29 + 3) % vocab));
        x.positions.push_back(p);
        x.seg.push_back(id);
        x.targets.push_back(!pad && p + 1 < len ? int32_t((r * 131 + id * 17 + (p + 1) * 29 + 3) % vocab) : -100);
      }
      id++;
    }
  }
  OptimHyper h;
  for (int s = 0; s < 3; s++) {
    const StepResult rg = train_step(*gpu.model, {x}, h, 5e-3, s, 0);
    const StepResult rc = train_step(*cpu.model, {x}, h, 5e-3, s, 0);
    ASSERT_TRUE(std::isfinite(rg.loss)) << "step " << s;
    EXPECT_NEAR(rg.loss, rc.loss, 8.0 / 256 * std::fabs(rc.loss)) << "step " << s;
    EXPECT_NEAR(rg.grad_norm, rc.grad_norm, 0.1 * rc.grad_norm) << "step " << s;
  }
  // Forward and backward of every layer, each step (no checkpointing): 2 calls per layer per step.
  EXPECT_EQ(cuda::cudnn_attention_runs(gpu.model->backend()), 3 * 2 * gpu.src.config.n_layer);
}

#if QLORA_HAVE_CUDNN
TEST(CudaEmuCudnn, PackedTrainingStepsMatchCpuOnSm90) { packed_training_matches_cpu("90"); }
#endif

// A head dim no GPU attention path takes is refused when the model is made on the CUDA backend
// (docs/errors.md), before any allocation or step; the CPU backend takes it.
TEST(CudaEmuCudnn, UnsupportedHeadDimIsRefusedWhenTheModelIsMade) {
  const ModelSource src = open_model_source(std::string(QLORA_FIXTURES) + "/models/llama_gqa");
  ModelPlanOptions po;
  po.method = Method::Lora;
  po.micro_batch = 1;
  po.seq_len = 8;
  LoraSpec lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.targets = LoraSpec::resolve_targets({"q_proj"});
  std::string why;
  auto cu = make_cuda_backend(&why);
  ASSERT_TRUE(cu) << why;
  for (int64_t d : {100, 264}) {
    LlamaConfig c = src.config;
    c.head_dim = d;
    try {
      DecoderModel m(c, *cu, po, lora);
      ADD_FAILURE() << "head_dim " << d << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("multiples of 8 up to 256"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("head_dim " + std::to_string(d)), std::string::npos) << e.what();
    }
    auto cpu = make_cpu_backend();
    EXPECT_NO_THROW(DecoderModel(c, *cpu, po, lora)) << d;
  }
}
#if QLORA_HAVE_CUDNN
TEST(CudaEmuCudnn, PackedTrainingStepsMatchCpuOnSm100) { packed_training_matches_cpu("100"); }
#endif

}  // namespace
}  // namespace qlora::test
