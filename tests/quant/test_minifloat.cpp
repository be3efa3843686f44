// Minifloat conversions vs ml_dtypes (fixture) and hand-computed saturation / E8M0 rounding cases.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <functional>

#include "quant/minifloat.h"
#include "st_fixture.h"

using namespace qlora;
using qlora::test::f32_bits;

namespace {

const test::StFixture& fixture() {
  static const test::StFixture f(std::string(QLORA_FIXTURES) + "/quant/minifloat.safetensors");
  return f;
}

struct MiniType {
  const char* name;
  int n_codes;
  std::function<float(uint8_t)> decode;
  std::function<uint8_t(float)> encode;  // ml_dtypes-compatible (non-saturating) cast
};

const MiniType kTypes[] = {
    {"e4m3", 256, e4m3_to_f32, [](float x) { return f32_to_e4m3(x); }},
    {"e5m2", 256, e5m2_to_f32, [](float x) { return f32_to_e5m2(x); }},
    {"e2m1", 16, e2m1_to_f32, f32_to_e2m1},
    {"e8m0", 256, e8m0_to_f32, [](float x) { return f32_to_e8m0(x); }},
};

}  // namespace

TEST(Minifloat, DecodeEveryCodeMatchesMlDtypes) {
  for (const auto& t : kTypes) {
    const auto want = fixture().get<uint32_t>(std::string("decode.") + t.name, "U32");
    ASSERT_EQ(int(want.size()), t.n_codes) << t.name;
    for (int c = 0; c < t.n_codes; c++)
      EXPECT_EQ(f32_bits(t.decode(uint8_t(c))), want[size_t(c)]) << t.name << " code 0x" << std::hex << c;
  }
}

TEST(Minifloat, EncodeMatchesMlDtypes) {
  const auto x = fixture().get<float>("encode.input", "F32");
  ASSERT_GT(x.size(), 5000u);
  for (const auto& t : kTypes) {
    const auto want = fixture().get<uint8_t>(std::string("encode.") + t.name, "U8");
    ASSERT_EQ(want.size(), x.size());
    int bad = 0;
    for (size_t i = 0; i < x.size(); i++) {
      const uint8_t got = t.encode(x[i]);
      if (got != want[i] && bad++ < 5)
        ADD_FAILURE() << t.name << ": x=" << x[i] << " (0x" << std::hex << f32_bits(x[i]) << ") got 0x" << int(got)
                      << " want 0x" << int(want[i]);
    }
    EXPECT_EQ(bad, 0) << t.name << " mismatches";
  }
}

TEST(Minifloat, FiniteCodesRoundTrip) {
  for (const auto& t : kTypes) {
    for (int c = 0; c < t.n_codes; c++) {
      const float v = t.decode(uint8_t(c));
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(int(t.encode(v)), c) << t.name << " value " << v;
    }
  }
}

TEST(Minifloat, SaturatingFp8ClampsInsteadOfNanOrInf) {
  // E4M3: 464 is the tie between 448 (even mantissa) and the NaN slot; anything past it overflows.
  EXPECT_EQ(f32_to_e4m3(464.0f, true), 0x7e);
  EXPECT_EQ(f32_to_e4m3(465.0f, false), 0x7f);
  EXPECT_EQ(f32_to_e4m3(465.0f, true), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e30f, true), 0xfe);
  EXPECT_EQ(f32_to_e4m3(-INFINITY, true), 0xfe);
  EXPECT_EQ(f32_to_e4m3(NAN, true) & 0x7f, 0x7f);
  // E5M2: 61440 is the tie between 57344 and the Inf slot (odd mantissa loses, so it overflows).
  EXPECT_EQ(f32_to_e5m2(61439.0f, false), 0x7b);
  EXPECT_EQ(f32_to_e5m2(61440.0f, false), 0x7c);
  EXPECT_EQ(f32_to_e5m2(61440.0f, true), 0x7b);
  EXPECT_EQ(f32_to_e5m2(INFINITY, true), 0x7b);
  // Smallest subnormals: E4M3 2^-9 = 0x01, half of it ties to 0 (even), a bit more rounds up.
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(f32_to_e4m3(-std::ldexp(1.0f, -9)), 0x81);
}

TEST(Minifloat, E8M0DirectedRounding) {
  // Hand-computed: byte = log2 + 127.
  EXPECT_EQ(f32_to_e8m0(1.0f, E8M0Round::Up), 127);
  EXPECT_EQ(f32_to_e8m0(std::nextafter(1.0f, 2.0f), E8M0Round::Up), 128);
  EXPECT_EQ(f32_to_e8m0(0.75f, E8M0Round::Up), 127);
  EXPECT_EQ(f32_to_e8m0(0.75f, E8M0Round::Down), 126);
  EXPECT_EQ(f32_to_e8m0(1.99f, E8M0Round::Down), 127);
  EXPECT_EQ(f32_to_e8m0(1.5f, E8M0Round::Nearest), 128);  // ties away from zero, as ml_dtypes
  EXPECT_EQ(f32_to_e8m0(1.4999f, E8M0Round::Nearest), 127);
  // Saturation at both ends for the directed modes; Nearest maps 0 to NaN as ml_dtypes does.
  EXPECT_EQ(f32_to_e8m0(FLT_MAX, E8M0Round::Up), 0xfe);
  EXPECT_EQ(f32_to_e8m0(0.0f, E8M0Round::Up), 0x00);
  EXPECT_EQ(f32_to_e8m0(std::ldexp(1.0f, -140), E8M0Round::Down), 0x00);
  EXPECT_EQ(f32_to_e8m0(std::ldexp(1.0f, -127), E8M0Round::Up), 0x00);  // f32 subnormal, exact
  EXPECT_EQ(f32_to_e8m0(std::ldexp(1.25f, -127), E8M0Round::Up), 0x01);
  EXPECT_EQ(f32_to_e8m0(0.0f, E8M0Round::Nearest), 0xff);
  EXPECT_EQ(e8m0_to_f32(0x00), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
}

TEST(Minifloat, E2M1TiesToEven) {
  // Grid 0, .5, 1, 1.5, 2, 3, 4, 6: ties at .25 .75 1.25 1.75 2.5 3.5 5 go to the even code.
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const uint8_t want[] = {0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6};
  for (int i = 0; i < 7; i++) {
    EXPECT_EQ(f32_to_e2m1(ties[i]), want[i]) << ties[i];
    EXPECT_EQ(f32_to_e2m1(-ties[i]), want[i] | 0x8) << -ties[i];
  }
  EXPECT_EQ(f32_to_e2m1(100.0f), 0x7);
}
