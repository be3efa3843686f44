// qlora bench's pieces: random weights (statistics, thread-count independence), option defaults
// and errors, FLOPs from the planner, and the CUDA device-name to GPU-catalog mapping.
#include <gtest/gtest.h>

#include <functional>

#include <omp.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/model_plan.h"
#include "plan/gpu_catalog.h"
#include "tasks/bench_run.h"

using namespace qlora;

TEST(BenchRun, RandomWeightsHaveTheRequestedStatistics) {
  TensorSource s = random_tensor_source(7);
  std::vector<float> w(1 << 20);
  s.read_f32("model.layers.0.self_attn.q_proj.weight", {1024, 1024}, w.data());
  double sum = 0, sq = 0, mx = 0;
  for (float v : w) {
    sum += v;
    sq += double(v) * v;
    mx = std::max(mx, double(std::fabs(v)));
  }
  const double mean = sum / double(w.size()), std = std::sqrt(sq / double(w.size()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(std, 0.02, 0.0002);
  EXPECT_LE(mx, 0.02 * std::sqrt(12.0));  // Irwin-Hall of 4 is bounded at 2 sqrt(3) std

  std::vector<float> n(576);
  s.read_f32("model.layers.3.input_layernorm.weight", {576}, n.data());
  for (float v : n) ASSERT_EQ(v, 1.0f);
  s.read_f32("model.layers.3.self_attn.q_proj.bias", {576}, n.data());
  for (float v : n) ASSERT_EQ(v, 0.0f);
}

TEST(BenchRun, RandomWeightsDependOnSeedAndNameNotOnThreads) {
  TensorSource s = random_tensor_source(1);
  const int64_t n = 100000;
  std::vector<float> a(n), b(n), c(n), d(n);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  s.read_f32("model.embed_tokens.weight", {n}, a.data());
  omp_set_num_threads(std::max(2, threads));
  s.read_f32("model.embed_tokens.weight", {n}, b.data());
  omp_set_num_threads(threads);
  EXPECT_EQ(a, b);
  s.read_f32("lm_head.weight", {n}, c.data());
  EXPECT_NE(a, c);
  random_tensor_source(2).read_f32("model.embed_tokens.weight", {n}, d.data());
  EXPECT_NE(a, d);
}

TEST(BenchRun, OptionDefaultsFollowThePrecision) {
  BenchOptions o;
  o.model = "smollm2-135m";
  BenchOptions n = normalize_bench_options(o, DType::F32);
  EXPECT_EQ(n.method, Method::Lora);
  EXPECT_EQ(n.base_precision, BasePrecision::Fp32);
  EXPECT_FALSE(n.double_quant.value());
  o.method = Method::Qlora;
  n = normalize_bench_options(o, DType::BF16);
  EXPECT_EQ(n.base_precision, BasePrecision::Nf4);
  EXPECT_TRUE(n.double_quant.value());
  // Without --method, the base decides (qlora bench: default_method).
  o.base_precision = BasePrecision::Mxfp4;
  o.method = default_method(o.base_precision);
  n = normalize_bench_options(o, DType::BF16);
  EXPECT_EQ(n.method, Method::Qlora);
  EXPECT_FALSE(n.double_quant.value());
}

TEST(BenchRun, BadOptionsAreConfigErrors) {
  auto kind_of = [](BenchOptions o) {
    o.model = o.model.empty() ? "smollm2-135m" : o.model;
    try {
      normalize_bench_options(o, DType::BF16);
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::Internal;  // no error
  };
  auto error_kind = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::Internal;  // no error
  };
  BenchOptions o;
  o.seq_len = 0;
  EXPECT_EQ(kind_of(o), ErrorKind::Config);
  o = {};
  o.micro_batch = -1;
  EXPECT_EQ(kind_of(o), ErrorKind::Config);
  EXPECT_EQ(error_kind([] { parse_base_precision("int3", "--base-precision"); }), ErrorKind::Config);
  o = {};
  o.method = Method::Qlora;
  o.base_precision = BasePrecision::Bf16;
  EXPECT_EQ(kind_of(o), ErrorKind::Config);
  o = {};
  o.method = Method::Qlora;
  o.base_precision = BasePrecision::Mxfp4;
  o.double_quant = true;
  EXPECT_EQ(kind_of(o), ErrorKind::Config);
  o = {};
  o.lora.targets = {"q_proj", "qk_proj"};  // no projection of any family (qkv_proj is Phi-3's)
  EXPECT_EQ(kind_of(o), ErrorKind::Config);
  EXPECT_EQ(error_kind([] { parse_checkpointing("selective", "--gradient-checkpointing"); }), ErrorKind::Config);
  o = {};
  o.base_precision = BasePrecision::Fp16;  // planned, not run: no backend keeps an fp16 base
  EXPECT_EQ(kind_of(o), ErrorKind::Unsupported);
  o = {};
  o.model = "smollm2-135m";
  o.base_precision = BasePrecision::Bf16;  // the CPU backend's matmul takes f32 weights only
  EXPECT_THROW(normalize_bench_options(o, DType::F32), Error);
  EXPECT_NO_THROW(normalize_bench_options(o, DType::BF16));
}

// perf_anchors §10: Llama-3-8B, all seven projections, r 16, T 2048: 15.63 fwd + 16.52 bwd GFLOP/token,
// plus 14.58 recompute with full checkpointing (the bench's flops_per_token is the model part).
TEST(BenchRun, FlopsComeFromThePlannerCounter) {
  BenchOptions o;
  o.model = "llama3-8b";
  o.seq_len = 2048;
  o.checkpointing = Checkpointing::Full;
  const FlopCounts f = bench_flop_counts(preset_config("llama3-8b"), normalize_bench_options(o, DType::BF16));
  EXPECT_NEAR(f.model() / 1e9, 15.63 + 16.52, 0.02);
  EXPECT_NEAR(f.recompute.total() / 1e9, 14.58, 0.02);
}

TEST(BenchRun, CudaDeviceNamesMapToTheCatalog) {
  const int64_t gib = int64_t(1) << 30;
  auto key = [](const GpuSpec* g) { return g ? g->name : std::string("null"); };
  EXPECT_EQ(key(gpu_for_device_name("NVIDIA H100 80GB HBM3", 79 * gib)), "h100-sxm");
  EXPECT_EQ(key(gpu_for_device_name("NVIDIA H100 NVL", 94 * gib)), "h100-nvl");
  EXPECT_EQ(key(gpu_for_device_name("NVIDIA H100 PCIe", 80 * gib)), "null");
  EXPECT_EQ(key(gpu_for_device_name("NVIDIA H200", 140 * gib)), "h200");
  EXPECT_EQ(key(gpu_for_device_name("NVIDIA H200 NVL", 140 * gib)), "null");
  EXPECT_EQ(key(gpu_for_device_name("NVIDIA A100-SXM4-40GB", 40 * gib)), "a100-40gb");
  EXPECT_EQ(key(gpu_for_device_name("NVIDIA A100-SXM4-80GB", 80 * gib)), "a100-80gb");
  EXPECT_EQ(key(gpu_for_device_name("NVIDIA B200", 179 * gib)), "b200-180gb");
  EXPECT_EQ(key(gpu_for_device_name("NVIDIA GB200", 185 * gib)), "gb200");
  EXPECT_EQ(key(gpu_for_device_name("NVIDIA GeForce RTX 4090", 24 * gib)), "rtx4090");
  EXPECT_EQ(key(gpu_for_device_name("Tesla T4", 15 * gib)), "null");
}
