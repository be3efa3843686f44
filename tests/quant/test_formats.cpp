// Table-driven tests over every quant format: storage bytes, slicing, nearest-code, error bounds, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "quant/bnb4.h"
#include "quant/format.h"
#include "quant/quantize.h"

using namespace qlora;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

namespace {

// N(0,1) weights with ~0.5% outliers x12 (the shape of real weight outliers).
std::vector<float> weights(int64_t rows, int64_t cols, uint64_t seed, bool outliers = true) {
  Rng rng(seed);
  std::vector<float> w(size_t(rows * cols));
  for (float& x : w) {
    x = rng.normal();
    if (outliers && rng.uniform() < 0.005f) x *= 12.0f;
  }
  return w;
}

// Every parameter variant worth covering for a format (each mode of each option).
std::vector<QuantParams> variants(const QuantFormatTraits& t) {
  QuantParams p;
  p.format = t.format;
  std::vector<QuantParams> out;
  switch (t.format) {
    case QuantFormat::NF4:
    case QuantFormat::FP4:
      for (int bs : {32, 64, 256})
        for (bool dq : {false, true}) {
          p.blocksize = bs;
          p.double_quant = dq;
          out.push_back(p);
        }
      break;
    case QuantFormat::MXFP4:
    case QuantFormat::MXFP8_E4M3:
      for (auto rule : {MxScaleRule::Floor, MxScaleRule::Ceil}) {
        p.mx_scale_rule = rule;
        out.push_back(p);
      }
      break;
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2:
      for (auto s : {Fp8Scaling::PerTensor, Fp8Scaling::Block1x128, Fp8Scaling::Block128x128}) {
        p.fp8_scaling = s;
        out.push_back(p);
      }
      break;
    default: out.push_back(p);
  }
  return out;
}

std::string describe(const QuantParams& p) {
  return std::string(quant_format_name(p.format)) + " bs=" + std::to_string(p.blocksize) +
         " dq=" + std::to_string(p.double_quant) + " fp8=" + std::to_string(int(p.fp8_scaling)) +
         " mx=" + std::to_string(int(p.mx_scale_rule));
}

// Largest |x| over the scaling block that holds element (r, c): what the format's scale derives
// from. Memoized per block because FP8 blocks are large.
class BlockAmax {
 public:
  BlockAmax(const QuantizedTensor& q, const std::vector<float>& w) : q_(q), w_(w) {}
  float operator()(int64_t r, int64_t c) {
    const auto& t = quant_traits(q_.params.format);
    int64_t r0 = r, r1 = r + 1, c0 = 0, c1 = q_.cols;
    if (t.flat_blocks) {  // blocks over the flattened tensor: express as element range [e0, e1)
      const int64_t bs = q_.params.blocksize, e0 = (r * q_.cols + c) / bs * bs;
      return memo(e0, [&] {
        float m = 0;
        for (int64_t e = e0; e < std::min(q_.numel(), e0 + bs); e++) m = std::max(m, std::fabs(w_[size_t(e)]));
        return m;
      });
    }
    if (t.block_elems > 1) {
      c0 = c / t.block_elems * t.block_elems, c1 = c0 + t.block_elems;
    } else if (q_.params.fp8_scaling == Fp8Scaling::PerTensor) {
      r0 = 0, r1 = q_.rows;
    } else {
      c0 = c / 128 * 128, c1 = c0 + 128;
      if (q_.params.fp8_scaling == Fp8Scaling::Block128x128) r0 = r / 128 * 128, r1 = r0 + 128;
    }
    return memo(r0 * q_.cols + c0, [&] {
      float m = 0;
      for (int64_t i = r0; i < std::min(q_.rows, r1); i++)
        for (int64_t j = c0; j < std::min(q_.cols, c1); j++) m = std::max(m, std::fabs(w_[size_t(i * q_.cols + j)]));
      return m;
    });
  }

 private:
  template <class F>
  float memo(int64_t key, F compute) {
    auto it = cache_.find(key);
    if (it == cache_.end()) it = cache_.emplace(key, compute()).first;
    return it->second;
  }
  const QuantizedTensor& q_;
  const std::vector<float>& w_;
  std::map<int64_t, float> cache_;
};

// Worst-case |x - x^| / block_amax, derived by hand from each format's value grid:
//   NF4: half the widest code gap, (-0.69619 - -1)/2 = 0.1519.  bnb FP4: (1 - 2/3)/2 = 0.1667.
//   NVFP4: unit u = E4M3(amax/6) ~ amax/6 * (1 + 2^-4); widest E2M1 half gap (4..6) = 1u -> 0.178.
//   MXFP4 floor: u <= amax/4, half gap 1u, saturation amax - 6u < amax/4 -> 0.25.
//   MXFP4 ceil: u < amax/3, half gap 1u -> 0.334.
//   MXFP8 floor: amax in [256u, 512u): half ulp 16u <= amax/16, saturation < amax/8 -> 0.125.
//   MXFP8 ceil: u < amax/224, half ulp 16u -> 0.0715.
//   FP8 E4M3: scale maps amax to 448, half ulp of the top binade 16/448 -> 0.0358.
//   FP8 E5M2: amax -> 57344, half ulp 4096/57344 -> 0.0715.
// A new format without a line here fails the tests below on arrival.
double max_rel_error(const QuantParams& p) {
  const bool floor = p.mx_scale_rule == MxScaleRule::Floor;
  switch (p.format) {
    case QuantFormat::NF4: return 0.1520;
    case QuantFormat::FP4: return 0.1667;
    case QuantFormat::NVFP4: return 0.178;
    case QuantFormat::MXFP4: return floor ? 0.25 : 0.334;
    case QuantFormat::MXFP8_E4M3: return floor ? 0.125 : 0.0715;
    case QuantFormat::FP8_E4M3: return 0.0358;
    case QuantFormat::FP8_E5M2: return 0.0715;
  }
  return -1;
}

// RMSE / sigma on N(0,1) weights (64 x 256, no outliers), a stated expectation with margin:
// a nearest quantizer with local step D has error ~ D/sqrt(12).
//   NF4 bs64: amax of 64 normals ~ 2.4 sigma, so code gaps are ~0.2 sigma within 1 sigma (68% of the
//     mass), ~0.3-0.4 sigma in 1-2 sigma (27%), ~0.7 sigma beyond: sum p D^2/12 -> ~0.08; bound 0.10.
//   bnb FP4: gap near zero 0.16 x 2.4 sigma ~ 0.4 sigma -> ~0.11 -> bound 0.15.
//   NVFP4: u ~ amax16/6 ~ 0.33 sigma, steps 0.5u..1u -> 0.05..0.1 -> bound 0.12.
//   MXFP4: u in (amax/8, amax/3] with amax32 ~ 2.2 sigma, steps 0.5u..2u -> bound 0.16.
//   8-bit floats: relative step 2^-M, RMS relative error ~ 2^-M/sqrt(12) * (mantissa spread):
//     E4M3 (M=3) 0.036 -> bound 0.045; E5M2 (M=2) 0.072 -> bound 0.09.
double rmse_bound(QuantFormat f) {
  switch (f) {
    case QuantFormat::NF4: return 0.10;
    case QuantFormat::FP4: return 0.15;
    case QuantFormat::NVFP4: return 0.12;
    case QuantFormat::MXFP4: return 0.16;
    case QuantFormat::MXFP8_E4M3: return 0.045;
    case QuantFormat::FP8_E4M3: return 0.045;
    case QuantFormat::FP8_E5M2: return 0.09;
  }
  return -1;
}

// Byte and nibble that hold element (r, c), from the traits alone (a check of the packing too).
struct CodeSlot {
  size_t byte;
  int shift;   // 0 or 4 for 4-bit codes, 0 for 8-bit
  int mask;
};
CodeSlot code_slot(const QuantizedTensor& q, int64_t r, int64_t c) {
  const auto& t = quant_traits(q.params.format);
  if (t.bits == 8) return {size_t(r * q.cols + c), 0, 0xff};
  const int64_t i = t.flat_blocks ? r * q.cols + c : c;
  const size_t byte = t.flat_blocks ? size_t(i / 2) : size_t(r * ceil_div(q.cols, 2) + c / 2);
  const bool even = i % 2 == 0;
  const int shift = (t.nibbles == NibbleOrder::HighFirst) == even ? 4 : 0;
  return {byte, shift, 0x0f};
}

const int64_t kShapes[][2] = {{7, 33}, {3, 130}, {130, 140}};

}  // namespace

TEST(QuantFormats, TraitsTableIsConsistent) {
  const auto table = quant_formats();
  ASSERT_EQ(table.size(), 7u);
  for (size_t i = 0; i < table.size(); i++) {
    const auto& t = table[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(size_t(t.format), i);
    EXPECT_EQ(quant_format_from_name(t.name), t.format);
    EXPECT_TRUE(t.bits == 4 || t.bits == 8);
    EXPECT_EQ(t.nibbles == NibbleOrder::None, t.bits == 8);
    if (t.block_elems > 1) {
      EXPECT_EQ(t.block_bytes, t.block_elems * t.bits / 8);
    }
    EXPECT_GT(std::string(t.description).size(), 10u);
  }
  EXPECT_FALSE(quant_format_from_name("int4").has_value());
}

TEST(QuantFormats, StorageBytesEqualWhatQuantizeHolds) {
  for (const auto& t : quant_formats())
    for (const QuantParams& p : variants(t))
      for (const auto& s : kShapes) {
        const auto w = weights(s[0], s[1], 1);
        const QuantizedTensor q = quantize_ref(w.data(), s[0], s[1], p);
        EXPECT_EQ(q.nbytes(), quant_storage_bytes(p, s[0], s[1])) << describe(p) << " " << s[0] << "x" << s[1];
        EXPECT_NO_THROW(validate_quantized(q));
      }
}

TEST(QuantFormats, StorageBytesHandComputed) {
  QuantParams p;  // Llama-3-8B q_proj 4096 x 4096, NF4 bs64 + double quant:
  p.double_quant = true;  // 8388608 packed + 262144 u8 + 1024 f32 nested + offset + 256 f32 code
  EXPECT_EQ(quant_storage_bytes(p, 4096, 4096), 8388608 + 262144 + 1024 * 4 + 4 + 1024);
  p = {};
  p.format = QuantFormat::NVFP4;  // 4096 x 4096: 0.5 B/elem + 1 B per 16 + one f32
  EXPECT_EQ(quant_storage_bytes(p, 4096, 4096), 4096 * 2048 + 4096 * 256 + 4);
  p.format = QuantFormat::FP8_E4M3;
  p.fp8_scaling = Fp8Scaling::Block128x128;
  EXPECT_EQ(quant_storage_bytes(p, 300, 200), 300 * 200 + 3 * 2 * 4);
}

TEST(QuantFormats, RowSlicesAndBf16MatchFullDequant) {
  for (const auto& t : quant_formats())
    for (const QuantParams& p : variants(t)) {
      const int64_t rows = 7, cols = 33;
      const auto w = weights(rows, cols, 2);
      const QuantizedTensor q = quantize_ref(w.data(), rows, cols, p);
      std::vector<float> full(w.size()), sliced(w.size());
      dequantize_ref(q, full.data());
      dequantize_rows_ref(q, 0, 3, sliced.data());  // rows 0-2; bnb blocks straddle rows here
      dequantize_rows_ref(q, 3, 3, sliced.data());  // empty slice is fine
      dequantize_rows_ref(q, 3, rows, sliced.data() + 3 * cols);
      std::vector<uint16_t> bf(w.size());
      dequantize_ref_bf16(q, bf.data());
      for (size_t i = 0; i < w.size(); i++) {
        ASSERT_EQ(sliced[i], full[i]) << describe(p) << " element " << i;
        ASSERT_EQ(bf[i], f32_to_bf16(full[i])) << describe(p) << " element " << i;
      }
    }
}

TEST(QuantFormats, ErrorWithinHandDerivedBound) {
  for (const auto& t : quant_formats())
    for (const QuantParams& p : variants(t)) {
      const double bound = max_rel_error(p);
      ASSERT_GT(bound, 0) << "no error bound stated for " << t.name;
      for (const auto& s : kShapes) {
        const auto w = weights(s[0], s[1], 3);
        const QuantizedTensor q = quantize_ref(w.data(), s[0], s[1], p);
        std::vector<float> out(w.size());
        dequantize_ref(q, out.data());
        BlockAmax block_amax(q, w);
        int bad = 0;
        for (int64_t r = 0; r < s[0]; r++)
          for (int64_t c = 0; c < s[1]; c++) {
            const size_t i = size_t(r * s[1] + c);
            const double amax = block_amax(r, c);
            double allowed = bound * amax * (1 + 1e-6);
            if (p.double_quant) {  // x^ = code * A^: add the nested-scale error |A - A^|
              const int64_t b = int64_t(i) / p.blocksize;
              allowed += std::fabs(amax - bnb_block_absmax(q, b));
            }
            if (std::fabs(w[i] - out[i]) > allowed && bad++ < 3)
              ADD_FAILURE() << describe(p) << " (" << r << "," << c << ") x=" << w[i] << " x^=" << out[i]
                            << " block amax " << amax;
          }
        EXPECT_EQ(bad, 0) << describe(p);
      }
    }
}

TEST(QuantFormats, DoubleQuantAbsmaxErrorIsBounded) {
  // Nested codes come from the dynamic map, whose widest gap is 0.0140625 (top decade), so
  // |A - A^| <= 0.00703 * nested_absmax, plus the 65536-bin table's 1/65535 of the range.
  for (auto f : {QuantFormat::NF4, QuantFormat::FP4}) {
    QuantParams p;
    p.format = f;
    p.blocksize = 32;
    p.double_quant = true;
    const auto w = weights(40, 520, 4);  // 650 blocks -> 3 nested blocks, the last partial
    const QuantizedTensor q = quantize_ref(w.data(), 40, 520, p);
    ASSERT_EQ(q.nested_absmax.size(), 3u);
    for (int64_t b = 0; b < int64_t(q.absmax_q.size()); b++) {
      float amax = 0;
      for (int64_t e = b * 32; e < (b + 1) * 32; e++) amax = std::max(amax, std::fabs(w[size_t(e)]));
      const double tol = (0.0070313 + 2.0 / 65535) * q.nested_absmax[size_t(b / 256)];
      EXPECT_LE(std::fabs(amax - bnb_block_absmax(q, b)), tol) << quant_format_name(f) << " block " << b;
    }
  }
}

// Every element decodes to the representable value nearest to it, given the stored scales: try
// every other code in its slot and compare distances.
TEST(QuantFormats, EachElementTakesTheNearestCode) {
  for (const auto& t : quant_formats())
    for (const QuantParams& p : variants(t)) {
      if (p.double_quant) continue;  // codes were chosen with the exact absmax, not the stored one
      const int64_t rows = 5, cols = 40;
      const auto w = weights(rows, cols, 5);
      QuantizedTensor q = quantize_ref(w.data(), rows, cols, p);
      std::vector<float> row(static_cast<size_t>(cols));
      int bad = 0;
      for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c += 3) {
          const CodeSlot s = code_slot(q, r, c);
          const uint8_t saved = q.data[s.byte];
          const float x = w[size_t(r * cols + c)];
          dequantize_rows_ref(q, r, r + 1, row.data());
          const double chosen = std::fabs(x - row[size_t(c)]);
          double best = chosen;
          for (int code = 0; code <= s.mask; code++) {
            q.data[s.byte] = uint8_t((saved & ~(s.mask << s.shift)) | (code << s.shift));
            dequantize_rows_ref(q, r, r + 1, row.data());
            if (std::isfinite(row[size_t(c)])) best = std::min(best, std::fabs(double(x) - row[size_t(c)]));
          }
          q.data[s.byte] = saved;
          if (chosen > best + 1e-6 * std::fabs(x) + 1e-30 && bad++ < 3)
            ADD_FAILURE() << describe(p) << " (" << r << "," << c << ") x=" << x << " chosen err " << chosen
                          << " best " << best;
        }
      EXPECT_EQ(bad, 0) << describe(p);
    }
}

TEST(QuantFormats, RmseOnGaussianWithinStatedBound) {
  const int64_t rows = 64, cols = 256;
  const auto w = weights(rows, cols, 6, /*outliers=*/false);
  double ss = 0;
  for (float x : w) ss += double(x) * x;
  const double sigma = std::sqrt(ss / double(w.size()));
  for (const auto& t : quant_formats()) {
    const double bound = rmse_bound(t.format);
    ASSERT_GT(bound, 0) << "no RMSE bound stated for " << t.name;
    for (const QuantParams& p : variants(t)) {
      if (p.blocksize != 0 && p.blocksize != 64) continue;  // bnb bounds are stated for blocksize 64
      const QuantizedTensor q = quantize_ref(w.data(), rows, cols, p);
      std::vector<float> out(w.size());
      dequantize_ref(q, out.data());
      double se = 0;
      for (size_t i = 0; i < w.size(); i++) se += (double(w[i]) - out[i]) * (double(w[i]) - out[i]);
      const double rmse = std::sqrt(se / double(w.size())) / sigma;
      EXPECT_LT(rmse, bound) << describe(p);
      EXPECT_GT(rmse, bound / 20) << describe(p) << ": suspiciously exact";
    }
  }
}

TEST(QuantFormats, NibbleOrderPerFormat) {
  // Element 0 is the block maximum (top code), element 1 is zero.
  struct Case {
    QuantFormat f;
    uint8_t byte0;
  };
  const Case cases[] = {
      {QuantFormat::NF4, 0xF7},    // bnb: high nibble first; 1.0 -> 15, 0 -> 7
      {QuantFormat::FP4, 0x30},    // bnb: 1.0 -> code 3, 0 -> code 0
      {QuantFormat::NVFP4, 0x07},  // NVIDIA: low nibble first; 6 -> 0x7, 0 -> 0x0
      {QuantFormat::MXFP4, 0x07},
  };
  for (const auto& c : cases) {
    QuantParams p;
    p.format = c.f;
    std::vector<float> w(32, 0.0f);
    w[0] = c.f == QuantFormat::NF4 || c.f == QuantFormat::FP4 ? 1.0f : 6.0f;
    w[5] = -0.5f;
    const QuantizedTensor q = quantize_ref(w.data(), 1, 32, p);
    EXPECT_EQ(q.data[0], c.byte0) << quant_format_name(c.f);
  }
}

TEST(QuantFormats, MxScaleRulesHandComputed) {
  // Block max 7: floor rule -> X = 2^(floor(log2 7) - 2) = 1, byte 127, 7 saturates to 6.
  // Ceil rule -> X = 2^ceil(log2(7/6)) = 2, byte 128, 7/2 = 3.5 ties to even 4 -> decodes to 8.
  std::vector<float> w(32, 0.25f);
  w[0] = 7.0f;
  QuantParams p;
  p.format = QuantFormat::MXFP4;
  QuantizedTensor q = quantize_ref(w.data(), 1, 32, p);
  std::vector<float> out(32);
  dequantize_ref(q, out.data());
  EXPECT_EQ(q.scales[0], 127);
  EXPECT_EQ(out[0], 6.0f);
  EXPECT_EQ(out[1], 0.0f);  // 0.25 ties to 0 (even)
  p.mx_scale_rule = MxScaleRule::Ceil;
  q = quantize_ref(w.data(), 1, 32, p);
  dequantize_ref(q, out.data());
  EXPECT_EQ(q.scales[0], 128);
  EXPECT_EQ(out[0], 8.0f);
  // MXFP8: block max 300 -> floor X = 2^(8 - 8) = 1: 300 is not on the E4M3 grid (step 32 above 256):
  // 300 rounds to 288; ceil X = 2^ceil(log2(300/448)) = 1 too.
  p = {};
  p.format = QuantFormat::MXFP8_E4M3;
  w.assign(32, 1.0f);
  w[3] = 300.0f;
  q = quantize_ref(w.data(), 1, 32, p);
  dequantize_ref(q, out.data());
  EXPECT_EQ(q.scales[0], 127);
  EXPECT_EQ(out[3], 288.0f);
  EXPECT_EQ(out[0], 1.0f);
}

TEST(QuantFormats, Nvfp4HandComputed) {
  // Global amax 6: S_enc = 2688/6 = 448, block scale e4m3(6 * 448/6) = 448, S_dec = 1/448, so each
  // element is multiplied by ~1 and E2M1 codes are the values themselves.
  const float w[16] = {6, 0.5f, -1.5f, 3, 0, -6, 2, 1, 4, -0.5f, 1.5f, -3, 0.25f, 0.75f, -4, 5};
  const uint8_t codes[16] = {0x7, 0x1, 0xB, 0x5, 0x0, 0xF, 0x4, 0x2, 0x6, 0x9, 0x3, 0xD, 0x0, 0x2, 0xE, 0x6};
  QuantParams p;
  p.format = QuantFormat::NVFP4;
  const QuantizedTensor q = quantize_ref(w, 1, 16, p);
  EXPECT_EQ(q.scales[0], 0x7E);  // 448
  EXPECT_FLOAT_EQ(q.scales_f32[0], 1.0f / 448.0f);
  for (int i = 0; i < 16; i++) {
    const uint8_t b = q.data[size_t(i / 2)];
    EXPECT_EQ(i % 2 == 0 ? (b & 0xf) : (b >> 4), codes[i]) << "element " << i;
  }
}

TEST(QuantFormats, Fp8PerTensorHandComputed) {
  // amax 448 -> scale 1: the codes are plain E4M3 of the inputs.
  const float w[4] = {448.0f, -1.0f, 0.001953125f, 100.0f};
  QuantParams p;
  p.format = QuantFormat::FP8_E4M3;
  QuantizedTensor q = quantize_ref(w, 2, 2, p);
  EXPECT_EQ(q.scales_f32[0], 1.0f);
  EXPECT_EQ(q.data[0], 0x7E);  // 448 = max
  EXPECT_EQ(q.data[1], 0xB8);  // -1.0
  EXPECT_EQ(q.data[2], 0x01);  // 2^-9, the smallest subnormal
  EXPECT_EQ(q.data[3], 0x6C);  // 100: step 8 in [64,128), 100/8 = 12.5 ties to even 12 -> 96
  // amax 896 -> scale 0.5, scale_inv 2: 449 -> 224.5 (step 16 in [128,256)) -> 224 -> 448;
  // -100 -> -50 (step 4 in [32,64)) -> 12.5 ties to 12 -> -48 -> -96.
  const float w2[3] = {896.0f, 449.0f, -100.0f};
  q = quantize_ref(w2, 1, 3, p);
  std::vector<float> out(3);
  dequantize_ref(q, out.data());
  EXPECT_EQ(q.scales_f32[0], 2.0f);
  EXPECT_EQ(out[0], 896.0f);
  EXPECT_EQ(out[1], 448.0f);
  EXPECT_EQ(out[2], -96.0f);
}

TEST(QuantFormats, BadParamsAreConfigErrors) {
  auto expect_config = [](QuantParams p, const std::string& needle) {
    try {
      quant_storage_bytes(p, 4, 64);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Config);
      const std::string all = std::string(e.what()) + " " + e.where() + " " + e.hint();
      EXPECT_NE(all.find(needle), std::string::npos) << all;
    }
  };
  for (int bs : {16, 48, 8192, -64, 100}) {
    QuantParams p;
    p.blocksize = bs;
    expect_config(p, std::to_string(bs));
    expect_config(p, "32, 64, 128, 256, 512, 1024, 2048, 4096");
  }
  QuantParams p;
  p.format = QuantFormat::NVFP4;
  p.blocksize = 32;
  expect_config(p, "32");
  p = {};
  p.format = QuantFormat::MXFP4;
  p.double_quant = true;
  expect_config(p, "double_quant");
  // quantize_ref reports the same error before touching the data.
  QuantParams bad;
  bad.blocksize = 48;
  const float w[2] = {1, 2};
  EXPECT_THROW(quantize_ref(w, 1, 2, bad), Error);
}

TEST(QuantFormats, BadInputsAreTypedErrors) {
  std::vector<float> w(12, 0.5f);
  QuantParams p;
  try {
    quantize_ref(w.data(), 0, 12, p);
    ADD_FAILURE() << "empty shape accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Shape);
  }
  w[1 * 4 + 2] = NAN;
  try {
    quantize_ref(w.data(), 3, 4, p);
    ADD_FAILURE() << "NaN accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Data);
    EXPECT_NE(e.where().find("row 1, col 2"), std::string::npos) << e.where();
  }
  w[6] = 0.5f;
  QuantizedTensor q = quantize_ref(w.data(), 3, 4, p);
  std::vector<float> out(12);
  try {
    dequantize_rows_ref(q, 2, 4, out.data());
    ADD_FAILURE() << "row range past the end accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Shape);
  }
  q.absmax.pop_back();  // as a loader that read a truncated checkpoint would build it
  try {
    dequantize_ref(q, out.data());
    ADD_FAILURE() << "inconsistent buffers accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Format);
    EXPECT_NE(e.where().find("absmax"), std::string::npos) << e.where();
  }
}
