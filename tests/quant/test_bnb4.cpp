// bitsandbytes NF4/FP4 (+ double quant) parity: packed bytes, absmax, nested state and dequant vs bnb.
#include <gtest/gtest.h>

#include <cmath>

#include "quant/bnb4.h"
#include "quant/quantize.h"
#include "st_fixture.h"

using namespace qlora;
using qlora::test::f32_bits;

namespace {

const test::StFixture& fixture() {
  static const test::StFixture f(std::string(QLORA_FIXTURES) + "/quant/bnb4.safetensors");
  return f;
}

nlohmann::json cases() { return nlohmann::json::parse(fixture().meta("cases")); }

// Counts positions where a and b differ bitwise; reports the first few.
template <class T, class Bits>
int count_diff(const std::vector<T>& got, const std::vector<T>& want, const std::string& what, Bits bits) {
  if (got.size() != want.size()) {
    ADD_FAILURE() << what << ": size " << got.size() << " vs " << want.size();
    return -1;
  }
  int bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (bits(got[i]) != bits(want[i]) && bad++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: got " << +got[i] << " want " << +want[i];
  }
  return bad;
}
uint32_t u8_bits(uint8_t v) { return v; }

QuantParams params_of(const nlohmann::json& c) {
  QuantParams p;
  p.format = c["quant_type"] == "nf4" ? QuantFormat::NF4 : QuantFormat::FP4;
  p.blocksize = c["blocksize"].get<int>();
  p.double_quant = c["double_quant"].get<int>() != 0;
  return p;
}

}  // namespace

TEST(Bnb4, CodeTablesMatchBitsandbytes) {
  const auto nf4 = fixture().get<float>("nf4_code", "F32");
  const auto fp4 = fixture().get<float>("fp4_code", "F32");
  const auto dyn = fixture().get<float>("nested_code", "F32");
  for (int i = 0; i < 16; i++) {
    EXPECT_EQ(f32_bits(nf4_code()[i]), f32_bits(nf4[size_t(i)])) << "nf4 " << i;
    EXPECT_EQ(f32_bits(fp4_code()[i]), f32_bits(fp4[size_t(i)])) << "fp4 " << i;
  }
  for (int i = 0; i < 256; i++) EXPECT_EQ(f32_bits(dynamic_map_signed()[i]), f32_bits(dyn[size_t(i)])) << i;
}

TEST(Bnb4, EveryFixtureCaseIsBitExact) {
  const auto all = cases();
  ASSERT_GE(all.size(), 50u);
  for (const auto& c : all) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const auto shape = c["shape"].get<std::vector<int64_t>>();
    const auto w = fixture().get<float>(c["input"].get<std::string>(), "F32");
    const QuantParams p = params_of(c);
    const QuantizedTensor q = quantize_ref(w.data(), shape[0], shape[1], p);

    EXPECT_EQ(count_diff(q.data, fixture().get<uint8_t>(name + ".packed", "U8"), "packed", u8_bits), 0);
    const auto raw = fixture().get<float>(name + ".absmax_raw", "F32");
    if (!p.double_quant) {
      EXPECT_EQ(count_diff(q.absmax, raw, "absmax", f32_bits), 0);
    } else {
      EXPECT_EQ(f32_bits(q.offset), f32_bits(fixture().get<float>(name + ".offset", "F32")[0])) << "offset";
      EXPECT_EQ(count_diff(q.absmax_q, fixture().get<uint8_t>(name + ".qabsmax", "U8"), "qabsmax", u8_bits), 0);
      EXPECT_EQ(count_diff(q.nested_absmax, fixture().get<float>(name + ".nested_absmax", "F32"), "nested", f32_bits), 0);
      std::vector<float> rec;
      for (size_t b = 0; b < raw.size(); b++) rec.push_back(bnb_block_absmax(q, int64_t(b)));
      EXPECT_EQ(count_diff(rec, fixture().get<float>(name + ".absmax_dq", "F32"), "absmax_dq", f32_bits), 0);
    }
    if (c["has_dequant"].get<bool>()) {
      std::vector<float> out(w.size());
      dequantize_ref(q, out.data());
      // == rather than bits: bnb decodes FP4 code 8 as +0 or -0 depending on the kernel it picks.
      EXPECT_EQ(count_diff(out, fixture().get<float>(name + ".dequant", "F32"), "dequant",
                           [](float v) { return v == 0.0f ? 0u : f32_bits(v); }), 0);
    }
  }
}

// The 8-bit step and the mean are separable: feed bnb's own offset and check the nested state alone.
TEST(Bnb4, NestedQuantizationGivenBnbOffset) {
  int n_cases = 0;
  for (const auto& c : cases()) {
    if (!c["double_quant"].get<int>()) continue;
    const std::string name = c["name"];
    auto raw = fixture().get<float>(name + ".absmax_raw", "F32");
    const float offset = fixture().get<float>(name + ".offset", "F32")[0];
    EXPECT_EQ(f32_bits(bnb_absmax_mean(raw.data(), int64_t(raw.size()))), f32_bits(offset)) << name << " mean";
    for (float& a : raw) a -= offset;
    std::vector<uint8_t> q(raw.size());
    std::vector<float> nested((raw.size() + 255) / 256);
    bnb_quantize_blockwise_8bit(raw.data(), int64_t(raw.size()), 256, dynamic_map_signed(), q.data(), nested.data());
    EXPECT_EQ(count_diff(q, fixture().get<uint8_t>(name + ".qabsmax", "U8"), name + " qabsmax", u8_bits), 0);
    EXPECT_EQ(count_diff(nested, fixture().get<float>(name + ".nested_absmax", "F32"), name + " nested", f32_bits), 0);
    n_cases++;
  }
  EXPECT_GE(n_cases, 20);
}

// Hand-built: absmax 1.0 makes x * (1/absmax) == x, so x sits exactly on a decision threshold.
TEST(Bnb4, TiesGoToTheLowerCodeAndHighNibbleIsFirst) {
  const float mid78 = (nf4_code()[7] + nf4_code()[8]) / 2.0f;   // between 0 and 0.0796
  const float mid01 = (nf4_code()[0] + nf4_code()[1]) / 2.0f;   // between -1 and -0.696
  const float w[4] = {1.0f, mid78, mid01, std::nextafter(mid78, 1.0f)};
  QuantParams p;
  p.format = QuantFormat::NF4;
  const QuantizedTensor q = quantize_ref(w, 1, 4, p);
  ASSERT_EQ(q.data.size(), 2u);
  EXPECT_EQ(q.data[0], 0xF7);  // element 0 (1.0 -> code 15) high, element 1 (tie -> code 7) low
  EXPECT_EQ(q.data[1], 0x08);  // tie -> code 0; one ulp above the 7/8 threshold -> code 8
}

TEST(Bnb4, Fp4TinyPositiveValuesTakeTheNegativeZeroCode) {
  // bitsandbytes' torch path sorts FP4's two zeros as (code 0, code 8), so x in (0, 0.0026] lands on
  // code 8 and x in (-0.0026, 0] on code 0; both decode to zero.
  const float w[4] = {1.0f, 1e-3f, -1e-3f, 0.0f};
  QuantParams p;
  p.format = QuantFormat::FP4;
  const QuantizedTensor q = quantize_ref(w, 2, 2, p);
  EXPECT_EQ(q.data[0], 0x38);  // 1.0 = code 3 (raw 12/12); 1e-3 -> code 8
  EXPECT_EQ(q.data[1], 0x00);
  float out[4];
  dequantize_ref(q, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 0.0f);
}

TEST(Bnb4, OddElementCountPadsWithTheCodeOfZero) {
  const float w[3] = {0.5f, -1.0f, 0.25f};
  QuantParams p;
  p.format = QuantFormat::NF4;
  const QuantizedTensor q = quantize_ref(w, 1, 3, p);
  ASSERT_EQ(q.data.size(), 2u);
  EXPECT_EQ(q.data[1] & 0x0f, 7);  // NF4 code 7 is 0.0
}
