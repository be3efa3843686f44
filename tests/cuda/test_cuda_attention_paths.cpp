// Packed attention as the model calls it, with the document count (AttentionFwdArgs::n_docs):
// cuDNN's fused attention where the backend takes it (sm_90/sm_100 in a build with cuDNN), the own
// kernel elsewhere and under QLORA_ATTENTION_KERNEL=own; forward and backward against the CPU op.
// On a GPU this is the check of cuDNN's numerics on the backend's ragged graphs; under the host
// harness the cuDNN side is emu/emu_cudnn.cpp. Same tolerances as test_cuda_attention.cpp.
#include <cstdlib>

#include "backend/cuda/cudnn_attention.h"
#include "cuda_test_util.h"

namespace qlora::test {
namespace {

struct PathCase {
  const char* name;
  int64_t b, t, hq, hkv, d;
  std::vector<std::vector<int>> docs;  // per row: document lengths; the rest of the row is padding (its own segment)
};

std::vector<PathCase> path_cases() {
  if (small_shapes()) return {{"small_d64_docs_pad", 2, 40, 4, 2, 64, {{10, 20}, {33}}}};
  return {{"llama8b_heads_t256_docs", 1, 256, 32, 8, 128, {{100, 60, 96}}},
          {"smollm_heads_docs_pad", 2, 130, 9, 3, 64, {{64, 1, 40}, {129}}},
          {"d32_mha_docs", 2, 48, 4, 4, 32, {{48}, {7, 7, 34}}}};
}

struct EnvKernel {
  explicit EnvKernel(const char* v) { setenv("QLORA_ATTENTION_KERNEL", v, 1); }
  ~EnvKernel() { unsetenv("QLORA_ATTENTION_KERNEL"); }
};

TEST(CudaOps, attention_packed_doc_count_paths) {
  QLORA_REQUIRE_CUDA(cu);
  auto cpu = make_cpu_backend();
  uint64_t seed = 1300;
  for (const PathCase& c : path_cases()) {
    const int64_t nq = c.b * c.t * c.hq * c.d, nkv = c.b * c.t * c.hkv * c.d, nl = c.b * c.hq * c.t;
    const float scale = 1.0f / std::sqrt(float(c.d));
    std::vector<int32_t> seg(size_t(c.b * c.t));
    int64_t n_docs = 0;
    for (int64_t r = 0; r < c.b; r++) {
      int64_t j = 0;
      int32_t id = 0;
      for (int len : c.docs[size_t(r)]) {
        for (int i = 0; i < len; i++) seg[size_t(r * c.t + j++)] = id;
        id++, n_docs++;
      }
      if (j < c.t) n_docs++;
      while (j < c.t) seg[size_t(r * c.t + j++)] = id;
    }
    const Vec hq_ = round_bf16(randn(seed += 10, size_t(nq))), hk = round_bf16(randn(seed + 1, size_t(nkv)));
    const Vec hv = round_bf16(randn(seed + 2, size_t(nkv))), hd = round_bf16(randn(seed + 3, size_t(nq)));
    Vec out(static_cast<size_t>(nq)), lse(static_cast<size_t>(nl));
    {
      Vec q = hq_, k = hk, v = hv;
      cpu->attention_fwd({f32_view(out.data(), {c.b, c.t, c.hq, c.d}), f32_view(lse.data(), {c.b, c.hq, c.t}),
                          f32_view(q.data(), {c.b, c.t, c.hq, c.d}), f32_view(k.data(), {c.b, c.t, c.hkv, c.d}),
                          f32_view(v.data(), {c.b, c.t, c.hkv, c.d}), seg.data(), c.b, c.t, c.hq, c.hkv, c.d, scale});
    }
    const Vec out_b = round_bf16(out);
    Vec rdq(static_cast<size_t>(nq)), rdk(static_cast<size_t>(nkv)), rdv(static_cast<size_t>(nkv));
    {
      Vec q = hq_, k = hk, v = hv, d = hd, o = out_b;
      cpu->attention_bwd({f32_view(rdq.data(), {c.b, c.t, c.hq, c.d}), f32_view(rdk.data(), {c.b, c.t, c.hkv, c.d}),
                          f32_view(rdv.data(), {c.b, c.t, c.hkv, c.d}), f32_view(d.data(), {c.b, c.t, c.hq, c.d}),
                          f32_view(q.data(), {c.b, c.t, c.hq, c.d}), f32_view(k.data(), {c.b, c.t, c.hkv, c.d}),
                          f32_view(v.data(), {c.b, c.t, c.hkv, c.d}), f32_view(o.data(), {c.b, c.t, c.hq, c.d}),
                          f32_view(lse.data(), {c.b, c.hq, c.t}), seg.data(), c.b, c.t, c.hq, c.hkv, c.d, scale});
    }
    const bool cudnn_here = cuda::cudnn_attention_refusal(*cu, c.b, c.t, 0, c.hq, c.d, true, n_docs).empty();
    for (const char* kernel : {"auto", "own"}) {
      SCOPED_TRACE(std::string(c.name) + " QLORA_ATTENTION_KERNEL=" + kernel);
      EnvKernel env(kernel);
      DBuf q(*cu, DType::BF16, hq_), k(*cu, DType::BF16, hk), v(*cu, DType::BF16, hv), d(*cu, DType::BF16, hd);
      DBuf o(*cu, DType::BF16, nq), l(*cu, DType::F32, nl), sg(*cu, DType::I32, c.b * c.t);
      DBuf ob(*cu, DType::BF16, out_b), lb(*cu, DType::F32, lse);
      DBuf dq(*cu, DType::BF16, nq), dk(*cu, DType::BF16, nkv), dv(*cu, DType::BF16, nkv);
      sg.upload_i32(seg);
      for (DBuf* b : {&o, &l, &dq, &dk, &dv}) b->poison();
      const int64_t runs0 = cuda::cudnn_attention_runs(*cu);
      cu->attention_fwd({o.t({c.b, c.t, c.hq, c.d}), l.t({c.b, c.hq, c.t}), q.t({c.b, c.t, c.hq, c.d}),
                         k.t({c.b, c.t, c.hkv, c.d}), v.t({c.b, c.t, c.hkv, c.d}), sg.i32(), c.b, c.t, c.hq, c.hkv, c.d,
                         scale, 0, n_docs});
      cu->attention_bwd({dq.t({c.b, c.t, c.hq, c.d}), dk.t({c.b, c.t, c.hkv, c.d}), dv.t({c.b, c.t, c.hkv, c.d}),
                         d.t({c.b, c.t, c.hq, c.d}), q.t({c.b, c.t, c.hq, c.d}), k.t({c.b, c.t, c.hkv, c.d}),
                         v.t({c.b, c.t, c.hkv, c.d}), ob.t({c.b, c.t, c.hq, c.d}), lb.t({c.b, c.hq, c.t}), sg.i32(), c.b,
                         c.t, c.hq, c.hkv, c.d, scale, n_docs});
      cu->synchronize();
      const bool want_cudnn = cudnn_here && std::string(kernel) == "auto";
      EXPECT_EQ(cuda::cudnn_attention_runs(*cu) - runs0, want_cudnn ? 2 : 0);
      expect_close("out", o.download(), out, {4 * kBf16U, 4 * kBf16U, 2 * kBf16U});
      expect_close("lse", l.download(), lse, {1e-5, 1e-4, 1e-5});
      expect_close("dq", dq.download(), rdq, {4 * kBf16U, 12 * kBf16U, 4 * kBf16U, 1e-4});
      expect_close("dk", dk.download(), rdk, {4 * kBf16U, 8 * kBf16U, 4 * kBf16U, 1e-4});
      expect_close("dv", dv.download(), rdv, {4 * kBf16U, 8 * kBf16U, 4 * kBf16U, 1e-4});
    }
  }
}

}  // namespace
}  // namespace qlora::test
