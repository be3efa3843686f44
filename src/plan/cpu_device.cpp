// CPU calibration: each rate is measured on the CPU backend's own ops, at the shapes a decoder
// step uses, for long enough (~0.25 s each) that OpenMP and BLAS start-up costs are amortized.
#include "plan/cpu_device.h"

#include "core/host_memory.h"
#include "io/cache_dir.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <sstream>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/atomic_file.h"
#include "model/quant_bytes.h"
#include "quant/quant_layout.h"
#include "nlohmann/json.hpp"

namespace qlora {

namespace {

// Bump when what is measured changes, so older cache entries are not reused.
constexpr int kCalibrationVersion = 2;
constexpr double kMinSeconds = 0.1;
constexpr int kRounds = 3;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Calls f() (one unit of `work`) for kRounds rounds of at least kMinSeconds each, after one
// untimed call; returns the best round's work/s (a round slowed by another process is dropped).
double rate(double work, const std::function<void()>& f) {
  f();
  double best = 0;
  for (int r = 0; r < kRounds; r++) {
    const double t0 = now_s();
    int64_t n = 0;
    double t = 0;
    do {
      f();
      n++;
      t = now_s() - t0;
    } while (t < kMinSeconds);
    best = std::max(best, work * double(n) / t);
  }
  return best;
}

std::vector<float> randn(int64_t n, uint64_t seed, float sd = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.normal() * sd;
  return v;
}

Tensor f32(std::vector<float>& v, std::initializer_list<int64_t> shape) { return f32_view(v.data(), shape); }

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0 || line.rfind("Model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(line.find_first_not_of(' ', c + 1));
    }
  return "unknown CPU";
}

// The measured rates, as stored in the cache file.
const std::pair<double CpuCalibration::*, const char*> kRates[] = {
    {&CpuCalibration::gemm_flops, "gemm_flops"},         {&CpuCalibration::lora_flops, "lora_flops"},
    {&CpuCalibration::attn_flops, "attn_flops"},         {&CpuCalibration::ce_elems_per_s, "ce_elems_per_s"},
    {&CpuCalibration::dequant_elems_per_s, "dequant_elems_per_s"}, {&CpuCalibration::mem_bw, "mem_bw"},
    {&CpuCalibration::seconds, "seconds"}};

nlohmann::json to_json(const CpuCalibration& c) {
  nlohmann::json j = {{"version", kCalibrationVersion}, {"cpu_model", c.cpu_model}, {"blas", c.blas},
                      {"simd", c.simd}, {"threads", c.threads}};
  for (const auto& [member, name] : kRates) j[name] = c.*member;
  return j;
}

CpuCalibration measure(const CpuCalibration& id, Backend* be) {
  CpuCalibration c = id;
  const double t_start = now_s();

  // Decoder GEMMs: 1024 tokens through an MLP-shaped weight, forward (x W^T) and dgrad (dy W),
  // the weight cycling through 16 copies (56 MB, more than a server L3) as a layer's do.
  const int64_t M = 1024, C = 576, F = 1536, R = 16, kCopies = 16;
  std::vector<float> x = randn(M * F, 1), y(size_t(M * F)), w = randn(kCopies * F * C, 2, 0.02f);
  int64_t copy = 0;
  const double gemm_fwd = rate(2.0 * M * F * C, [&] {
    Tensor wt = f32_view(w.data() + (copy++ % kCopies) * F * C, {F, C});
    be->matmul({f32(y, {M, F}), f32_view(x.data(), {M, C}), wt, M, F, C, false, true, 1.0f, 0.0f});
  });
  const double gemm_bwd = rate(2.0 * M * F * C, [&] {
    Tensor wt = f32_view(w.data() + (copy++ % kCopies) * F * C, {F, C});
    be->matmul({f32_view(y.data(), {M, C}), f32(x, {M, F}), wt, M, C, F, false, false, 1.0f, 0.0f});
  });
  c.gemm_flops = 2.0 / (1.0 / gemm_fwd + 1.0 / gemm_bwd);

  // LoRA GEMMs at rank 16: h = x A^T, y += s h B^T, dB += dy^T h, dA += dh^T x (equal FLOPs each).
  std::vector<float> a = randn(R * F, 3, 0.02f), h = randn(M * R, 4), g(size_t(F * R));
  const double lora_flops = 2.0 * M * R * F;
  const double l1 = rate(lora_flops, [&] { be->matmul({f32(h, {M, R}), f32(x, {M, F}), f32(a, {R, F}), M, R, F, false, true, 1.0f, 0.0f}); });
  const double l2 = rate(lora_flops, [&] { be->matmul({f32(y, {M, F}), f32(h, {M, R}), f32(a, {R, F}), M, F, R, false, false, 1.0f, 1.0f}); });
  const double l3 = rate(lora_flops, [&] { be->matmul({f32(g, {F, R}), f32(y, {M, F}), f32(h, {M, R}), F, R, M, true, false, 1.0f, 1.0f}); });
  const double l4 = rate(lora_flops, [&] { be->matmul({f32(a, {R, F}), f32(h, {M, R}), f32(x, {M, F}), R, F, M, true, false, 1.0f, 1.0f}); });
  c.lora_flops = 4.0 / (1.0 / l1 + 1.0 / l2 + 1.0 / l3 + 1.0 / l4);

  // Attention: one row of 1024 tokens, 8 query heads over 2 kv heads of 64, forward + backward,
  // counted as flops.cpp does (4 q_dim (T+1)/2 per token forward, 2.5x that backward).
  {
    const int64_t T = 1024, Hq = 8, Hkv = 2, D = 64;
    std::vector<float> q = randn(T * Hq * D, 5), k = randn(T * Hkv * D, 6), v = randn(T * Hkv * D, 7);
    std::vector<float> o(q.size()), lse(size_t(Hq * T)), dout = randn(T * Hq * D, 8);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    const float scale = 1.0f / std::sqrt(float(D));
    const double fwd = 4.0 * double(Hq * D) * double(T + 1) / 2.0 * double(T);
    c.attn_flops = rate(3.5 * fwd, [&] {
      be->attention_fwd({f32(o, {1, T, Hq, D}), f32(lse, {1, Hq, T}), f32(q, {1, T, Hq, D}), f32(k, {1, T, Hkv, D}),
                         f32(v, {1, T, Hkv, D}), nullptr, 1, T, Hq, Hkv, D, scale});
      be->attention_bwd({f32(dq, {1, T, Hq, D}), f32(dk, {1, T, Hkv, D}), f32(dv, {1, T, Hkv, D}),
                         f32(dout, {1, T, Hq, D}), f32(q, {1, T, Hq, D}), f32(k, {1, T, Hkv, D}),
                         f32(v, {1, T, Hkv, D}), f32(o, {1, T, Hq, D}), f32(lse, {1, Hq, T}), nullptr, 1, T, Hq,
                         Hkv, D, scale});
    });
  }

  // Cross-entropy over 256 rows of a 32768-token vocabulary.
  {
    const int64_t N = 256, V = 32768;
    std::vector<float> logits = randn(N * V, 9, 2.0f), losses(static_cast<size_t>(N));
    std::vector<int32_t> labels(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; i++) labels[size_t(i)] = int32_t((i * 7919) % V);
    std::vector<float> work(logits.size());
    c.ce_elems_per_s = rate(double(N * V), [&] {
      be->cross_entropy_fwd_bwd({f32(logits, {N, V}), f32(work, {N, V}), f32(losses, {N}), labels.data(), N, V, 1.0f});
    });
  }

  // NF4 with double-quantized scales (the QLoRA default) -> f32, one MLP-sized projection.
  {
    const QuantParams p = base_quant_params(BasePrecision::Nf4, 64, true);
    const QuantizedTensor qt = quantize_ref(w.data(), F, C, p);
    std::vector<uint8_t> blob(size_t(quant_layout(qt.params, F, C).total));
    pack_quantized(qt, blob.data());
    c.dequant_elems_per_s =
        rate(double(F * C), [&] { be->dequantize({f32_view(y.data(), {F, C}), blob.data(), qt.params, F, C}); });
  }

  // Memory bandwidth: y += x over 2 x 64 MB (read x, read and write y).
  {
    const int64_t n = int64_t(16) << 20;
    std::vector<float> bx = randn(n, 10), by(static_cast<size_t>(n));
    c.mem_bw = rate(12.0 * double(n), [&] { be->add({f32(by, {n}), f32(bx, {n}), n}); });
  }
  c.seconds = now_s() - t_start;
  return c;
}

}  // namespace

CpuCalibration cpu_calibration(bool refresh) {
  CpuCalibration id;
  id.cpu_model = cpu_model_name();
  // Through the backend interface, as every op below: the planner times the CPU backend's own kernels.
  const std::unique_ptr<Backend> be = make_cpu_backend();
  id.blas = be->blas_kernels();
  id.simd = be->simd_kernels();
  id.threads = omp_get_max_threads();
  // The binary's modification time: a rebuilt qlora (whose kernels may have changed) measures again.
  std::string build = "unknown";
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time("/proc/self/exe", ec);
  if (!ec) build = std::to_string(mtime.time_since_epoch().count());
  const nlohmann::json key = {{"version", kCalibrationVersion}, {"cpu_model", id.cpu_model}, {"blas", id.blas},
                              {"simd", id.simd}, {"threads", id.threads}, {"build", build}};
  const std::filesystem::path dir = user_cache_dir();
  const std::filesystem::path file =
      dir.empty() ? std::filesystem::path() : dir / ("cpu-calibration-" + std::to_string(std::hash<std::string>{}(key.dump())) + ".json");
  if (!refresh && !file.empty()) {
    std::ifstream f(file);
    if (f) {
      try {
        const nlohmann::json j = nlohmann::json::parse(f);
        bool same = true;
        for (const auto& [k, v] : key.items()) same = same && j.contains(k) && j[k] == v;
        if (same) {
          CpuCalibration c = id;
          for (const auto& [member, name] : kRates) c.*member = j.at(name).get<double>();
          c.from_cache = true;
          if (c.gemm_flops > 0 && c.lora_flops > 0 && c.attn_flops > 0 && c.mem_bw > 0) return c;
        }
      } catch (const std::exception&) {
        // A damaged cache file is measured again and overwritten.
      }
    }
  }
  CpuCalibration c = measure(id, be.get());
  if (!file.empty()) {
    try {
      std::filesystem::create_directories(dir);
      nlohmann::json j = to_json(c);
      j["build"] = key["build"];
      write_file_atomic(file.string(), j.dump(2) + "\n");
    } catch (const std::exception&) {
      // An unwritable cache only costs the next run another calibration.
    }
  }
  return c;
}

GpuSpec cpu_device_spec(const CpuCalibration& c) {
  GpuSpec s;
  s.name = "cpu";
  s.display = "CPU: " + c.cpu_model + ", " + std::to_string(c.threads) + " threads";
  s.aliases = {"host"};
  s.is_cpu = true;
  s.mem_bytes = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  s.mem_bw = c.mem_bw;
  s.host_bw = c.mem_bw;
  s.bf16_tflops = c.gemm_flops / 1e12;
  s.lora_tflops = c.lora_flops / 1e12;
  s.attn_tflops = c.attn_flops / 1e12;
  s.ce_elems_per_s = c.ce_elems_per_s;
  s.dequant_elems_per_s = c.dequant_elems_per_s;
  s.program_bytes = resident_host_bytes();
  s.max_gpus_per_node = 1;
  std::ostringstream src;
  src.precision(3);
  src << "calibrated on this machine" << (c.from_cache ? " (cached)" : "") << ": f32 GEMM " << c.gemm_flops / 1e9
      << " GFLOP/s, LoRA GEMM " << c.lora_flops / 1e9 << ", attention " << c.attn_flops / 1e9 << ", memory "
      << c.mem_bw / 1e9 << " GB/s; " << c.blas << ", " << c.simd;
  s.source = src.str();
  return s;
}

}  // namespace qlora
