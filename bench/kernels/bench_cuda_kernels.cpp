// CUDA kernel benchmarks: dequantize, attention fwd/bwd, fused cross-entropy, GEMMs, RMSNorm and
// SwiGLU on model-sized shapes. Prints one JSON object per case on stdout
// ({"name", "kind", "config", "ours", ["peer"]}); tools/peers/*.py time the PyTorch side of the
// same cases and bench/device_run.sh merges both. A table for people goes to stderr.
// Usage: bench_cuda_kernels [--quick]   (--quick: small shapes, for a smoke run)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/dequant.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "quant/bnb4.h"
#include "quant/quantize.h"

namespace qlora {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench: %s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Median over `iters` of the device time of f(), after `warmup` calls; events on the backend stream.
double time_ms(Backend& be, const std::function<void()>& f, int warmup = 3, int iters = 20) {
  auto s = static_cast<cudaStream_t>(cuda_stream_of(be));
  for (int i = 0; i < warmup; i++) f();
  be.synchronize();
  std::vector<cudaEvent_t> ev(size_t(iters) + 1);
  for (auto& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");
  check(cudaEventRecord(ev[0], s), "cudaEventRecord");
  for (int i = 0; i < iters; i++) {
    f();
    check(cudaEventRecord(ev[size_t(i) + 1], s), "cudaEventRecord");
  }
  be.synchronize();
  std::vector<double> t(static_cast<size_t>(iters));
  for (int i = 0; i < iters; i++) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev[size_t(i)], ev[size_t(i) + 1]), "cudaEventElapsedTime");
    t[size_t(i)] = ms;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A device buffer filled with normal(0, sd) values (never zeros: they run faster than real data).
struct Buf {
  Backend& be;
  void* p;
  DType dt;
  int64_t n;
  Buf(Backend& b, DType t, int64_t count, uint64_t seed, float sd = 1.0f) : be(b), dt(t), n(count) {
    p = be.alloc(size_t(n) * size_t(dtype_size(dt)));
    std::vector<float> h(static_cast<size_t>(n));
    Rng rng(seed);
    for (auto& x : h) {
      do x = rng.normal() * sd;
      while (x == 0.0f);
    }
    if (dt == DType::F32) {
      be.copy_to_device(p, h.data(), h.size() * 4);
    } else {
      std::vector<uint16_t> b16(h.size());
      for (size_t i = 0; i < h.size(); i++) b16[i] = f32_to_bf16(h[i]);
      be.copy_to_device(p, b16.data(), b16.size() * 2);
    }
  }
  ~Buf() { be.free(p); }
  Tensor t(std::initializer_list<int64_t> dims) const { return Tensor(p, dt, dims); }
};

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.6g", v);
  return b;
}

void emit(const std::string& name, const std::string& kind, const std::string& config, const std::string& ours,
          const std::string& peer = "") {
  std::printf("{\"name\": \"%s\", \"kind\": \"%s\", \"config\": {%s}, \"ours\": {%s}%s}\n", name.c_str(), kind.c_str(),
              config.c_str(), ours.c_str(), peer.empty() ? "" : (", \"peer\": {" + peer + "}").c_str());
  std::fflush(stdout);
}

// Bytes moved by a D2D copy of `bytes` count both the read and the write.
double memcpy_gbps(Backend& be, int64_t bytes) {
  void* a = be.alloc(size_t(bytes));
  void* b = be.alloc(size_t(bytes));
  auto s = static_cast<cudaStream_t>(cuda_stream_of(be));
  const double ms =
      time_ms(be, [&] { check(cudaMemcpyAsync(b, a, size_t(bytes), cudaMemcpyDeviceToDevice, s), "memcpy"); });
  be.free(a);
  be.free(b);
  return 2.0 * double(bytes) / (ms * 1e6);
}

void bench_dequant(Backend& be, bool quick) {
  const int64_t rows = quick ? 1024 : 4096, cols = quick ? 4096 : 14336;  // Llama-3-8B MLP weight
  const double peer = memcpy_gbps(be, rows * cols * 2);
  struct Fmt {
    const char* name;
    QuantParams p;
  };
  const Fmt fmts[] = {{"nf4_dq_bs64", {QuantFormat::NF4, 64, true}},
                      {"fp4_bs64", {QuantFormat::FP4, 64, false}},
                      {"nvfp4", {QuantFormat::NVFP4}},
                      {"mxfp4", {QuantFormat::MXFP4}},
                      {"fp8_e4m3_1x128", {QuantFormat::FP8_E4M3, 0, false, Fp8Scaling::Block1x128}}};
  std::vector<float> w(static_cast<size_t>(rows * cols));
  Rng rng(5);
  for (auto& x : w) x = rng.normal() * 0.02f;
  void* out = be.alloc(size_t(rows * cols) * 2);
  for (const auto& f : fmts) {
    const QuantizedTensor q = quantize_ref(w.data(), rows, cols, f.p);
    const float* code = f.p.format == QuantFormat::NF4 ? nf4_code() : f.p.format == QuantFormat::FP4 ? fp4_code() : nullptr;
    cuda::QuantDeviceBuffers dev(be, q, code);
    const double ms = time_ms(be, [&] { cuda::dequantize_bf16(be, dev.view(), out); });
    const double bytes = double(dev.device_bytes()) + double(rows * cols) * 2;  // read packed + write bf16
    const double gbps = bytes / (ms * 1e6);
    emit(std::string("dequant_") + f.name, "dequant",
         "\"rows\": " + std::to_string(rows) + ", \"cols\": " + std::to_string(cols) + ", \"format\": \"" + f.name +
             "\", \"bytes_moved\": " + num(bytes) + ", \"peer_is\": \"cudaMemcpy D2D of the bf16 output size\"",
         "\"ms\": " + num(ms) + ", \"gbps\": " + num(gbps), "\"gbps\": " + num(peer));
    std::fprintf(stderr, "%-28s %8.3f ms %8.0f GB/s   (memcpy D2D %6.0f GB/s)\n", f.name, ms, gbps, peer);
  }
  be.free(out);
}

void bench_attention(Backend& be, bool quick) {
  const int64_t B = 2, T = quick ? 1024 : 4096, Hq = 32, Hkv = 8, D = 128;
  const float scale = 1.0f / std::sqrt(float(D));
  Buf q(be, DType::BF16, B * T * Hq * D, 1), k(be, DType::BF16, B * T * Hkv * D, 2), v(be, DType::BF16, B * T * Hkv * D, 3);
  Buf dout(be, DType::BF16, B * T * Hq * D, 4);
  Buf out(be, DType::BF16, B * T * Hq * D, 5), lse(be, DType::F32, B * Hq * T, 6);
  Buf dq(be, DType::BF16, B * T * Hq * D, 7), dk(be, DType::BF16, B * T * Hkv * D, 8), dv(be, DType::BF16, B * T * Hkv * D, 9);
  const AttentionFwdArgs fa{out.t({B, T, Hq, D}), lse.t({B, Hq, T}), q.t({B, T, Hq, D}), k.t({B, T, Hkv, D}),
                            v.t({B, T, Hkv, D}), nullptr, B, T, Hq, Hkv, D, scale};
  const AttentionBwdArgs ba{dq.t({B, T, Hq, D}), dk.t({B, T, Hkv, D}), dv.t({B, T, Hkv, D}), dout.t({B, T, Hq, D}),
                            q.t({B, T, Hq, D}), k.t({B, T, Hkv, D}), v.t({B, T, Hkv, D}), out.t({B, T, Hq, D}),
                            lse.t({B, Hq, T}), nullptr, B, T, Hq, Hkv, D, scale};
  // perf_anchors.md accounting: causal forward = 4 B Hq D T^2 / 2 (QK^T and PV, half the square);
  // backward = 2.5x forward.
  const double fwd_flops = 4.0 * double(B) * double(Hq) * double(D) * double(T) * double(T) / 2.0;
  const std::string cfg = "\"b\": " + std::to_string(B) + ", \"t\": " + std::to_string(T) + ", \"hq\": " +
                          std::to_string(Hq) + ", \"hkv\": " + std::to_string(Hkv) + ", \"d\": " + std::to_string(D) +
                          ", \"causal\": true, \"dtype\": \"bf16\"";
  const int64_t cudnn0 = cuda::cudnn_attention_runs(be);
  const double ms_f = time_ms(be, [&] { be.attention_fwd(fa); });
  be.attention_fwd(fa);
  const double ms_b = time_ms(be, [&] { be.attention_bwd(ba); });
  // The backend's default path on this device (cuDNN's fused attention on sm_90/sm_100).
  const std::string path = std::string(", \"path\": \"") + (cuda::cudnn_attention_runs(be) > cudnn0 ? "cudnn" : "own") + "\"";
  emit("attention_fwd_d128_t" + std::to_string(T), "attention_fwd", cfg + path + ", \"flops\": " + num(fwd_flops),
       "\"ms\": " + num(ms_f) + ", \"tflops\": " + num(fwd_flops / (ms_f * 1e9)));
  emit("attention_bwd_d128_t" + std::to_string(T), "attention_bwd", cfg + path + ", \"flops\": " + num(2.5 * fwd_flops),
       "\"ms\": " + num(ms_b) + ", \"tflops\": " + num(2.5 * fwd_flops / (ms_b * 1e9)));
  std::fprintf(stderr, "%-28s %8.3f ms %8.1f TFLOP/s\n", "attention fwd", ms_f, fwd_flops / (ms_f * 1e9));
  std::fprintf(stderr, "%-28s %8.3f ms %8.1f TFLOP/s\n", "attention bwd", ms_b, 2.5 * fwd_flops / (ms_b * 1e9));
}

// cuDNN's fused attention against the own kernel on the same packed batch (QLORA_ATTENTION_KERNEL
// set per timing): Llama-3-8B heads (32 q, 8 kv, head dim 128), one row of 8192 tokens (quick:
// 2048) packed with four documents of 1/2, 1/4, 1/8 and 1/8 of the row, forward + backward.
// FLOPs are counted per document (causal: 4 Hq D L^2 / 2 forward, 2.5x that backward), so
// TFLOP/s are comparable with the unpacked cases. `cudnn_calls` shows the cuDNN path really ran.
void bench_attention_paths(Backend& be, bool quick) {
  const int64_t B = 1, T = quick ? 2048 : 8192, Hq = 32, Hkv = 8, D = 128;
  const float scale = 1.0f / std::sqrt(float(D));
  const std::vector<int64_t> docs{T / 2, T / 4, T / 8, T / 8};
  std::vector<int32_t> seg;
  double fwd_flops = 0;
  for (size_t i = 0; i < docs.size(); i++) {
    seg.insert(seg.end(), size_t(docs[i]), int32_t(i));
    fwd_flops += 4.0 * double(Hq) * double(D) * double(docs[i]) * double(docs[i]) / 2.0;
  }
  Buf q(be, DType::BF16, B * T * Hq * D, 11), k(be, DType::BF16, B * T * Hkv * D, 12), v(be, DType::BF16, B * T * Hkv * D, 13);
  Buf dout(be, DType::BF16, B * T * Hq * D, 14);
  Buf out(be, DType::BF16, B * T * Hq * D, 15), lse(be, DType::F32, B * Hq * T, 16);
  Buf dq(be, DType::BF16, B * T * Hq * D, 17), dk(be, DType::BF16, B * T * Hkv * D, 18), dv(be, DType::BF16, B * T * Hkv * D, 19);
  void* d_seg = be.alloc(seg.size() * 4);
  be.copy_to_device(d_seg, seg.data(), seg.size() * 4);
  const auto* sp = static_cast<const int32_t*>(d_seg);
  const int64_t n_docs = int64_t(docs.size());
  const AttentionFwdArgs fa{out.t({B, T, Hq, D}), lse.t({B, Hq, T}), q.t({B, T, Hq, D}), k.t({B, T, Hkv, D}),
                            v.t({B, T, Hkv, D}), sp, B, T, Hq, Hkv, D, scale, 0, n_docs};
  const AttentionBwdArgs ba{dq.t({B, T, Hq, D}), dk.t({B, T, Hkv, D}), dv.t({B, T, Hkv, D}), dout.t({B, T, Hq, D}),
                            q.t({B, T, Hq, D}), k.t({B, T, Hkv, D}), v.t({B, T, Hkv, D}), out.t({B, T, Hq, D}),
                            lse.t({B, Hq, T}), sp, B, T, Hq, Hkv, D, scale, n_docs};
  struct Timing {
    double fwd = 0, bwd = 0;
    int64_t cudnn_calls = 0;
  };
  auto timed = [&](const char* kernel) -> Timing {
    setenv("QLORA_ATTENTION_KERNEL", kernel, 1);
    Timing t;
    const int64_t c0 = cuda::cudnn_attention_runs(be);
    try {
      t.fwd = time_ms(be, [&] { be.attention_fwd(fa); });
      be.attention_fwd(fa);
      t.bwd = time_ms(be, [&] { be.attention_bwd(ba); });
    } catch (const Error& e) {
      std::fprintf(stderr, "attention (%s): %s: %s\n", kernel, e.where().c_str(), e.message().c_str());
      t.fwd = t.bwd = -1;
    }
    t.cudnn_calls = cuda::cudnn_attention_runs(be) - c0;
    unsetenv("QLORA_ATTENTION_KERNEL");
    return t;
  };
  const Timing own = timed("own"), cudnn = timed("cudnn");
  be.free(d_seg);
  auto side = [&](const Timing& t) {
    if (t.fwd < 0) return std::string("\"error\": \"not available on this device or build (see bench.log)\"");
    return "\"fwd_ms\": " + num(t.fwd) + ", \"bwd_ms\": " + num(t.bwd) + ", \"fwd_tflops\": " + num(fwd_flops / (t.fwd * 1e9)) +
           ", \"bwd_tflops\": " + num(2.5 * fwd_flops / (t.bwd * 1e9)) + ", \"fwd_bwd_tflops\": " +
           num(3.5 * fwd_flops / ((t.fwd + t.bwd) * 1e9)) + ", \"cudnn_calls\": " + std::to_string(t.cudnn_calls);
  };
  const std::string cfg = "\"b\": 1, \"t\": " + std::to_string(T) + ", \"hq\": 32, \"hkv\": 8, \"d\": 128, \"docs\": [" +
                          std::to_string(docs[0]) + ", " + std::to_string(docs[1]) + ", " + std::to_string(docs[2]) + ", " +
                          std::to_string(docs[3]) + "], \"causal\": true, \"dtype\": \"bf16\", \"fwd_flops\": " +
                          num(fwd_flops) + ", \"peer_is\": \"the own flash-attention kernel (QLORA_ATTENTION_KERNEL=own)\"";
  emit("attention_cudnn_vs_own_llama8b_packed_t" + std::to_string(T), "attention_fwd_bwd", cfg, side(cudnn), side(own));
  std::fprintf(stderr, "%-28s cuDNN fwd %8.3f bwd %8.3f ms | own fwd %8.3f bwd %8.3f ms\n", "attention packed",
               cudnn.fwd, cudnn.bwd, own.fwd, own.bwd);
}

void bench_cross_entropy(Backend& be, bool quick) {
  const int64_t n = quick ? 256 : 4096, V = 128256;
  Buf logits(be, DType::F32, n * V, 11, 2.0f), losses(be, DType::F32, n, 12);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  Rng rng(13);
  for (auto& y : labels) y = int32_t(rng.below(uint64_t(V)));
  void* dy = be.alloc(size_t(n) * 4);
  be.copy_to_device(dy, labels.data(), size_t(n) * 4);
  // In place, as the model runs it; the values change every call, but stay finite (dlogits are
  // bounded by grad_scale), so the timing sees real data.
  const CrossEntropyArgs a{logits.t({n, V}), logits.t({n, V}), losses.t({n}), static_cast<const int32_t*>(dy), n, V, 1.0f};
  const double ms = time_ms(be, [&] { be.cross_entropy_fwd_bwd(a); });
  const double bytes = 2.0 * double(n * V) * 4;  // the fewest: read logits once, write dlogits once
  emit("cross_entropy_v128256_n" + std::to_string(n), "cross_entropy",
       "\"n\": " + std::to_string(n) + ", \"vocab\": " + std::to_string(V) + ", \"dtype\": \"f32\", \"min_bytes\": " +
           num(bytes),
       "\"ms\": " + num(ms) + ", \"gbps\": " + num(bytes / (ms * 1e6)));
  std::fprintf(stderr, "%-28s %8.3f ms %8.0f GB/s (min bytes)\n", "cross-entropy fwd+bwd", ms, bytes / (ms * 1e6));
  be.free(dy);
}

void bench_gemm(Backend& be, bool quick) {
  struct G {
    const char* name;
    int64_t m, n, k;
    bool tb;
  };
  const std::vector<G> gs = quick ? std::vector<G>{{"gemm_small_nt", 2048, 4096, 4096, true}}
                                  : std::vector<G>{{"gemm_8b_gate_fwd", 8192, 14336, 4096, true},
                                                   {"gemm_8b_down_fwd", 8192, 4096, 14336, true},
                                                   {"gemm_8b_gate_dgrad", 8192, 4096, 14336, false},
                                                   {"gemm_70b_up_fwd", 4096, 28672, 8192, true}};
  for (const auto& g : gs) {
    Buf a(be, DType::BF16, g.m * g.k, 21), b(be, DType::BF16, g.k * g.n, 22), c(be, DType::BF16, g.m * g.n, 23);
    const MatmulArgs args{c.t({g.m, g.n}), a.t({g.m, g.k}), g.tb ? b.t({g.n, g.k}) : b.t({g.k, g.n}), g.m, g.n, g.k,
                          false, g.tb, 1.0f, 0.0f};
    const double ms = time_ms(be, [&] { be.matmul(args); });
    const double flops = 2.0 * double(g.m) * double(g.n) * double(g.k);
    emit(g.name, "gemm",
         "\"m\": " + std::to_string(g.m) + ", \"n\": " + std::to_string(g.n) + ", \"k\": " + std::to_string(g.k) +
             ", \"trans_b\": " + (g.tb ? "true" : "false") + ", \"dtype\": \"bf16\", \"flops\": " + num(flops),
         "\"ms\": " + num(ms) + ", \"tflops\": " + num(flops / (ms * 1e9)));
    std::fprintf(stderr, "%-28s %8.3f ms %8.1f TFLOP/s\n", g.name, ms, flops / (ms * 1e9));
  }
}

void bench_pointwise(Backend& be, bool quick) {
  const int64_t N = quick ? 1024 : 8192, C = 4096, F = 14336;
  {
    Buf x(be, DType::BF16, N * C, 31), w(be, DType::BF16, C, 32), out(be, DType::BF16, N * C, 33), rs(be, DType::F32, N, 34);
    const RmsnormFwdArgs a{out.t({N, C}), rs.t({N}), x.t({N, C}), w.t({C}), N, C, 1e-5f};
    const double ms = time_ms(be, [&] { be.rmsnorm_fwd(a); });
    const double bytes = double(N * C) * 2 * 2;  // read x, write out
    emit("rmsnorm_fwd_n" + std::to_string(N) + "_c4096", "rmsnorm_fwd",
         "\"n\": " + std::to_string(N) + ", \"c\": " + std::to_string(C) + ", \"dtype\": \"bf16\", \"min_bytes\": " + num(bytes),
         "\"ms\": " + num(ms) + ", \"gbps\": " + num(bytes / (ms * 1e6)));
    std::fprintf(stderr, "%-28s %8.3f ms %8.0f GB/s\n", "rmsnorm fwd", ms, bytes / (ms * 1e6));
  }
  {
    Buf g(be, DType::BF16, N * F, 41), u(be, DType::BF16, N * F, 42), h(be, DType::BF16, N * F, 43);
    const SwigluFwdArgs a{h.t({N * F}), g.t({N * F}), u.t({N * F}), N * F};
    const double ms = time_ms(be, [&] { be.swiglu_fwd(a); });
    const double bytes = double(N * F) * 2 * 3;  // read gate and up, write h
    emit("swiglu_fwd_n" + std::to_string(N) + "_f14336", "swiglu_fwd",
         "\"n\": " + std::to_string(N) + ", \"f\": " + std::to_string(F) + ", \"dtype\": \"bf16\", \"min_bytes\": " + num(bytes),
         "\"ms\": " + num(ms) + ", \"gbps\": " + num(bytes / (ms * 1e6)));
    std::fprintf(stderr, "%-28s %8.3f ms %8.0f GB/s\n", "swiglu fwd", ms, bytes / (ms * 1e6));
  }
}

}  // namespace
}  // namespace qlora

int main(int argc, char** argv) {
  using namespace qlora;
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  std::string why;
  auto be = make_cuda_backend(&why);
  if (!be) {
    std::fprintf(stderr, "bench_cuda_kernels: no CUDA backend: %s\n", why.c_str());
    return 2;
  }
  std::fprintf(stderr, "bench_cuda_kernels on %s%s\n", why.c_str(), quick ? " (quick shapes)" : "");
  try {
    bench_dequant(*be, quick);
    bench_attention(*be, quick);
    bench_attention_paths(*be, quick);
    bench_cross_entropy(*be, quick);
    bench_gemm(*be, quick);
    bench_pointwise(*be, quick);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s: %s\n", e.where().c_str(), e.message().c_str());
    return 1;
  }
  return 0;
}
