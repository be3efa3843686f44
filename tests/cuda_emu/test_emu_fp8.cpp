// FP8 base GEMMs under the host harness: the model planned with gemm_dtype fp8 on an fp8 base
// trains on the CUDA backend (matmul_fp8: cuBLASLt FP8, the activation quantized on the device) as
// on the CPU backend (the same arithmetic in f32); the activation quantization kernel is bit-exact
// with the CPU reference; on sm_80 the options are refused before the first step, as qlora plan
// refuses --gemm-dtype fp8 on an A100.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "emu_arch_scope.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/decoder_model.h"
#include "model/peft_io.h"
#include "quant/minifloat.h"
#include "quant/quant_layout.h"
#include "quant/quantize.h"
#include "train/model_source.h"
#include "train/step.h"
#include "model_test_util.h"

namespace qlora {
namespace {

using qlora::emu_test::ArchScope;
using testing_util::fixtures;
using testing_util::ints;
using Fp8Run = testing_util::TestModel;

Fp8Run make_run(std::unique_ptr<Backend> be, const std::string& ckpt) {
  ModelPlanOptions po;
  po.method = Method::Qlora;
  po.base_precision = BasePrecision::Fp8;
  po.gemm_dtype = GemmDtype::Fp8;
  po.micro_batch = 2;
  po.seq_len = 12;
  po.checkpointing = parse_checkpointing(ckpt, "checkpointing");
  return testing_util::make_model_on(std::move(be), "llama_gqa", po, testing_util::fixture_lora(),
                                     "parity/llama_gqa_adapter");
}

std::vector<float> weights_of(DecoderModel& m, const TrainParam& p) {  // LoRA weights are f32 on both backends
  std::vector<float> w(size_t(p.w.numel()));
  m.backend().copy_to_host(w.data(), p.w.data, w.size() * 4);
  return w;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

bool plans(const DecoderModel& m, const std::string& name) {
  for (const auto& b : m.plan().buffers)
    if (b.name == name) return true;
  return false;
}

// The activation quantization kernel against the CPU reference: with w = 448 I (per-tensor
// scale_inv exactly 1, code 448) each output is one product, y = 448 code(x) / s, so y shows each
// e4m3 code of x; y's bf16 rounding (2^-8) is far below the codes' spacing (2^-3), so a code that
// differs from the CPU's fails.
TEST(CudaEmuFp8, ActivationCodesEqualTheCpuReference) {
  std::string why;
  auto cu = make_cuda_backend(&why);
  ASSERT_TRUE(cu) << why;
  const int64_t m = 70, n = 32;
  std::vector<float> w(size_t(n * n), 0.0f);
  for (int64_t i = 0; i < n; i++) w[size_t(i * n + i)] = 448.0f;
  QuantParams p;
  p.format = QuantFormat::FP8_E4M3;
  const QuantizedTensor q = quantize_ref(w.data(), n, n, p);
  ASSERT_EQ(q.scales_f32[0], 1.0f);
  std::vector<uint8_t> blob(size_t(quant_layout(p, n, n).total));
  pack_quantized(q, blob.data());
  std::vector<uint16_t> xb(size_t(m * n));
  std::vector<float> x(xb.size());
  uint32_t h = 12345;
  for (size_t i = 0; i < x.size(); i++) {
    h = h * 1664525u + 1013904223u;
    const float v = (float(h >> 8) / 16777216.0f - 0.5f) * 6.0f;
    uint32_t u;
    std::memcpy(&u, &v, 4);
    xb[i] = uint16_t(u >> 16);  // truncate to bf16
    u = uint32_t(xb[i]) << 16;
    std::memcpy(&x[i], &u, 4);
  }
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float s = 448.0f / amax;
  void* dblob = cu->alloc(blob.size());
  void* dx = cu->alloc(xb.size() * 2);
  void* dy = cu->alloc(size_t(m * n) * 2);
  void* damax = cu->alloc(4);
  cu->copy_to_device(dblob, blob.data(), blob.size());
  cu->copy_to_device(dx, xb.data(), xb.size() * 2);
  cu->matmul_fp8({Tensor(dy, DType::BF16, {m, n}), Tensor(dx, DType::BF16, {m, n}), dblob, m, n, n,
                  Tensor(damax, DType::F32, {1})});
  std::vector<uint16_t> yb(size_t(m * n));
  float got_amax = 0;
  cu->copy_to_host(yb.data(), dy, yb.size() * 2);
  cu->copy_to_host(&got_amax, damax, 4);
  EXPECT_EQ(got_amax, amax);
  int bad = 0, changed = 0;
  for (size_t i = 0; i < x.size(); i++) {
    const float want = 448.0f * e4m3_to_f32(f32_to_e4m3(x[i] * s, true)) * (1.0f / s);
    uint32_t u = uint32_t(yb[i]) << 16;
    float got;
    std::memcpy(&got, &u, 4);
    if (std::fabs(got - want) > std::fabs(want) * (1.0f / 256) && bad++ < 5)
      ADD_FAILURE() << "x[" << i << "] = " << x[i] << ": got " << got << " want " << want;
    changed += want != 448.0f * x[i];
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(changed, int(x.size()) / 2) << "e4m3 keeps 3 mantissa bits: most bf16 values move";
  for (void* ptr : {dblob, dx, dy, damax}) cu->free(ptr);
}

// A few FP8-base LoRA steps on the CUDA backend against the CPU backend. Both quantize the same
// way (the weights' e4m3 codes are the same bytes; activations go to e4m3 by the same formula), so
// what differs is the CUDA run's bf16 activations and GEMM outputs. A bf16 rounding (2^-8 relative)
// moves an activation across an e4m3 rounding boundary (codes 2^-3 apart) with probability about
// 2^-8 / 2^-3 = 1/32, by one code: per FP8 GEMM output ~sqrt(1/32) * 2^-3 / sqrt(3) ~ 1.3% rms
// between the backends against ~0.3% for bf16 alone, but the loss and gradient norm average it
// out. Tolerances: loss 2^-5 relative, as the bf16 runs (seen: <= 0.35%); gradient norm 10%
// (seen: <= 1.2%); each adapter's update within 30% normwise (seen: <= 25.6%; bf16 runs use 20%).
// AdamW moves every element by ~lr whatever its gradient's size, so elements near the noise floor
// go either way: this bound catches a wrong or missing gradient term (~100%), not the e4m3
// rounding itself, which on this 2-layer model moves the updates as much (a CPU run with the base
// dequantized differs from the CPU FP8 run by up to 24%). The op tests check the rounding:
// CudaOps.matmul_fp8_*, CpuOps.matmul_fp8_*, CudaEmuFp8.ActivationCodesEqualTheCpuReference.
void compare_fp8_training(const std::string& ckpt) {
  std::string why;
  Fp8Run gpu = make_run(make_cuda_backend(&why), ckpt);
  Fp8Run cpu = make_run(make_cpu_backend(), ckpt);
  ASSERT_EQ(gpu.model->backend().device(), DeviceKind::Cuda);
  EXPECT_TRUE(plans(*gpu.model, "cuda.fp8_act")) << "the plan holds matmul_fp8's scratch";
  SafetensorsArchive fx(fixtures() + "/qlora/llama_gqa_nf4.safetensors");
  const Batch batch = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
  // The forward reads the fp8 weights as stored: it dequantizes nothing.
  gpu.model->forward_loss(batch);
  EXPECT_EQ(gpu.model->dequantized_layers(), 0);
  std::vector<std::vector<float>> w0;
  for (auto& p : cpu.model->trainable_params()) w0.push_back(weights_of(*cpu.model, p));
  OptimHyper h;
  double first = 0, last = 0;
  for (int s = 0; s < 4; s++) {
    const StepResult rg = train_step(*gpu.model, {batch}, h, 5e-3, s, 0);
    const StepResult rc = train_step(*cpu.model, {batch}, h, 5e-3, s, 0);
    // Only the backward dequantizes (dy W in bf16): each layer once in the first step, then as
    // many as the planner counts per micro-step (dequant_layers_per_micro_step(L, GemmDtype::Fp8)).
    const int64_t L = gpu.model->config().n_layer;
    EXPECT_EQ(gpu.model->dequantized_layers(), L + s * dequant_layers_per_micro_step(L, GemmDtype::Fp8)) << "step " << s;
    ASSERT_TRUE(std::isfinite(rg.loss)) << "step " << s;
    EXPECT_NEAR(rg.loss, rc.loss, std::fabs(rc.loss) / 32) << "step " << s;
    EXPECT_NEAR(rg.grad_norm, rc.grad_norm, 0.1 * rc.grad_norm) << "step " << s;
    (s == 0 ? first : last) = rc.loss;
  }
  EXPECT_LT(last, first) << "the steps train";
  auto& gp = gpu.model->trainable_params();
  auto& cp = cpu.model->trainable_params();
  ASSERT_EQ(gp.size(), cp.size());
  for (size_t i = 0; i < cp.size(); i++) {
    const auto wg = weights_of(*gpu.model, gp[i]), wc = weights_of(*cpu.model, cp[i]);
    std::vector<float> diff(wc.size()), dc(wc.size());
    for (size_t j = 0; j < wc.size(); j++) dc[j] = wc[j] - w0[i][j], diff[j] = (wg[j] - w0[i][j]) - dc[j];
    EXPECT_GT(norm(dc), 0.0) << cp[i].peft_key;
    EXPECT_LE(norm(diff), 0.3 * norm(dc)) << cp[i].peft_key << ": update differs by " << norm(diff) / norm(dc);
  }
}

TEST(CudaEmuFp8, Fp8BaseLoraStepsMatchTheCpu) { compare_fp8_training("none"); }
TEST(CudaEmuFp8, Fp8BaseLoraStepsWithCheckpointingMatchTheCpu) { compare_fp8_training("full"); }

// sm_80 has no FP8 tensor cores: gemm_dtype fp8 is an Error(Config) when the model is made, as
// qlora plan --gemm-dtype fp8 is on an A100, so the plan and the run never assume different GEMMs.
TEST(CudaEmuFp8, Sm80RefusesFp8GemmsBeforeTheFirstStep) {
  ArchScope arch("80");
  std::string why;
  auto be = make_cuda_backend(&why);
  ASSERT_TRUE(be) << why;
  EXPECT_FALSE(be->has_fp8_gemm());
  try {
    make_run(std::move(be), "none");
    ADD_FAILURE() << "gemm_dtype fp8 accepted on sm_80";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("gemm_dtype fp8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no FP8 tensor cores"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qlora
