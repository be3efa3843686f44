// GPU dequantization of every quant format against the CPU reference, bit for bit: weights are
// quantized by quantize_ref, dequantized on the GPU to bf16 and compared with dequantize_ref_bf16.
// Shapes cover the 16-byte fast path (Llama-sized) and the element-wise path (odd widths).
#include "backend/cuda/dequant.h"
#include "cuda_test_util.h"
#include "quant/bnb4.h"
#include "quant/quantize.h"

namespace qlora::test {
namespace {

struct DqCase {
  QuantParams p;
  int64_t rows, cols;
};

std::string case_name(const DqCase& c) {
  std::string s = std::string(quant_format_name(c.p.format)) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols);
  if (c.p.double_quant) s += " dq";
  if (c.p.blocksize) s += " bs" + std::to_string(c.p.blocksize);
  if (c.p.format == QuantFormat::FP8_E4M3 || c.p.format == QuantFormat::FP8_E5M2)
    s += c.p.fp8_scaling == Fp8Scaling::PerTensor ? " tensor" : c.p.fp8_scaling == Fp8Scaling::Block1x128 ? " 1x128" : " 128x128";
  return s;
}

std::vector<DqCase> dq_cases() {
  const int64_t big_r = small_shapes() ? 256 : 4096, big_c = small_shapes() ? 512 : 4096;
  std::vector<DqCase> cs;
  auto add = [&](QuantParams p) {
    cs.push_back({p, big_r, big_c});  // fast path
    cs.push_back({p, 77, 100});       // odd: partial blocks, unaligned rows
    cs.push_back({p, 33, 64});
  };
  add({QuantFormat::NF4, 64, true});
  add({QuantFormat::NF4, 64, false});
  add({QuantFormat::FP4, 128, true});
  add({QuantFormat::NVFP4});
  add({QuantFormat::MXFP4});
  add({QuantFormat::MXFP8_E4M3});
  add({QuantFormat::FP8_E4M3, 0, false, Fp8Scaling::PerTensor});
  add({QuantFormat::FP8_E4M3, 0, false, Fp8Scaling::Block1x128});
  add({QuantFormat::FP8_E4M3, 0, false, Fp8Scaling::Block128x128});
  add({QuantFormat::FP8_E5M2, 0, false, Fp8Scaling::Block1x128});
  return cs;
}

TEST(CudaDequant, every_format_bit_exact_with_cpu_reference) {
  QLORA_REQUIRE_CUDA(cu);
  uint64_t seed = 900;
  for (const auto& c : dq_cases()) {
    const std::string name = case_name(c);
    SCOPED_TRACE(name);
    Vec w = randn(seed++, size_t(c.rows * c.cols), 0.02f);
    for (size_t i = 0; i < w.size(); i += 997) w[i] *= 40.0f;  // outliers: blocks with a large absmax
    const QuantizedTensor q = quantize_ref(w.data(), c.rows, c.cols, c.p);
    std::vector<uint16_t> want(w.size());
    dequantize_ref_bf16(q, want.data());
    const float* code4 = c.p.format == QuantFormat::NF4 ? nf4_code() : c.p.format == QuantFormat::FP4 ? fp4_code() : nullptr;
    cuda::QuantDeviceBuffers dev(*cu, q, code4);
    // Double quant: the offset by value, and read from device memory (as a packed blob holds it).
    DBuf offset(*cu, DType::F32, Vec{q.offset});
    for (int from_device = 0; from_device < (c.p.double_quant ? 2 : 1); from_device++) {
      cuda::QuantDeviceView view = dev.view();
      if (from_device) {
        view.offset = -12345.0f;  // must be ignored
        view.offset_dev = static_cast<const float*>(offset.data());
      }
      DBuf out(*cu, DType::BF16, c.rows * c.cols);
      out.poison();
      cuda::dequantize_bf16(*cu, view, out.data());
      std::vector<uint16_t> got(w.size());
      cu->copy_to_host(got.data(), out.data(), got.size() * 2);
      int64_t bad = 0;
      for (size_t i = 0; i < got.size(); i++)
        if (got[i] != want[i] && bad++ < 5)
          ADD_FAILURE() << name << (from_device ? " (offset on device)" : "") << " [" << i / size_t(c.cols) << ","
                        << i % size_t(c.cols) << "]: got 0x" << std::hex << got[i] << " want 0x" << want[i] << std::dec;
      EXPECT_EQ(bad, 0) << name << ": " << bad << " of " << got.size() << " elements differ";
    }
  }
}

TEST(CudaDequant, wrong_backend_is_an_error) {
  auto cpu_be = make_cpu_backend();
  cuda::QuantDeviceView v;
  v.rows = v.cols = 1;
  EXPECT_THROW(cuda::dequantize_bf16(*cpu_be, v, nullptr), Error);
}

}  // namespace
}  // namespace qlora::test
