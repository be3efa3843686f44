// Scalar minifloat conversions: one generic RNE encoder/decoder plus each type's inf/NaN rules.
#include "quant/minifloat.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

namespace qlora {

namespace {

struct MiniSpec {
  int exp_bits, man_bits, bias;
  uint32_t max_code;  // magnitude code of the largest finite value
};
constexpr MiniSpec kE4M3{4, 3, 7, 0x7e};   // 448
constexpr MiniSpec kE5M2{5, 2, 15, 0x7b};  // 57344
constexpr MiniSpec kE2M1{2, 1, 1, 0x7};    // 6

uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float quiet_nan(bool neg) { return bits_f32(0x7fc00000u | (neg ? 0x80000000u : 0u)); }

// Magnitude code (sign excluded) of finite a >= 0, rounded to nearest even on the type's grid.
// Codes grow with the value, so a result above s.max_code means overflow.
uint32_t encode_magnitude(float a, const MiniSpec& s) {
  const int emin = 1 - s.bias;  // exponent of the smallest normal
  const uint32_t u = f32_bits(a);
  const int e = int(u >> 23) - 127;
  if (e < emin) {
    // Subnormal range: count units of the smallest subnormal (scaling by a power of two is exact);
    // rounding up to 2^M units lands exactly on the smallest normal's code.
    return uint32_t(std::nearbyint(std::ldexp(a, s.man_bits - emin)));
  }
  // Drop the low 23-M mantissa bits with round-half-to-even; a carry bumps the exponent.
  const int drop = 23 - s.man_bits;
  const uint32_t lsb = (u >> drop) & 1u;
  const uint32_t r = (u + (1u << (drop - 1)) - 1u + lsb) >> drop;  // f32 exponent | mantissa
  const int er = int(r >> s.man_bits) - 127;
  return (uint32_t(er + s.bias) << s.man_bits) | (r & ((1u << s.man_bits) - 1u));
}

float decode_finite(uint32_t v, const MiniSpec& s) {
  const uint32_t nbits = uint32_t(s.exp_bits + s.man_bits);
  const bool neg = (v >> nbits) & 1u;
  const uint32_t field = (v >> s.man_bits) & ((1u << s.exp_bits) - 1u);
  const uint32_t mant = v & ((1u << s.man_bits) - 1u);
  const float mag = field == 0 ? std::ldexp(float(mant), 1 - s.bias - s.man_bits)
                               : std::ldexp(float(mant + (1u << s.man_bits)), int(field) - s.bias - s.man_bits);
  return neg ? -mag : mag;
}

// Decoding goes through 256-entry tables: dequantization calls these once per element.
template <class F>
std::array<float, 256> decode_table(F decode) {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; v++) t[size_t(v)] = decode(uint8_t(v));
  return t;
}

}  // namespace

uint8_t f32_to_e4m3(float x, bool saturate) {
  const uint8_t sign = (f32_bits(x) >> 31) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7f;
  if (std::isinf(x)) return sign | (saturate ? 0x7e : 0x7f);
  const uint32_t m = encode_magnitude(std::fabs(x), kE4M3);
  if (m > kE4M3.max_code) return sign | (saturate ? 0x7e : 0x7f);
  return uint8_t(sign | m);
}

uint8_t f32_to_e5m2(float x, bool saturate) {
  const uint8_t sign = (f32_bits(x) >> 31) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7e;
  if (std::isinf(x)) return sign | (saturate ? 0x7b : 0x7c);
  const uint32_t m = encode_magnitude(std::fabs(x), kE5M2);
  if (m > kE5M2.max_code) return sign | (saturate ? 0x7b : 0x7c);
  return uint8_t(sign | m);
}

uint8_t f32_to_e2m1(float x) {
  const bool neg = f32_bits(x) >> 31;
  if (std::isnan(x)) return neg ? 0x0 : 0x8;  // ml_dtypes' mapping, see the header
  const uint8_t sign = neg ? 0x8 : 0x0;
  if (std::isinf(x)) return sign | 0x7;
  const uint32_t m = encode_magnitude(std::fabs(x), kE2M1);
  return uint8_t(sign | std::min(m, kE2M1.max_code));  // saturates
}

float e4m3_to_f32(uint8_t v) {
  static const std::array<float, 256> table = decode_table([](uint8_t c) {
    return (c & 0x7f) == 0x7f ? quiet_nan(c & 0x80) : decode_finite(c, kE4M3);
  });
  return table[v];
}

float e5m2_to_f32(uint8_t v) {
  static const std::array<float, 256> table = decode_table([](uint8_t c) {
    if ((c & 0x7c) != 0x7c) return decode_finite(c, kE5M2);
    if ((c & 0x03) == 0) return (c & 0x80) ? -INFINITY : INFINITY;
    return quiet_nan(c & 0x80);
  });
  return table[v];
}

float e2m1_to_f32(uint8_t v) {
  static const std::array<float, 256> table = decode_table([](uint8_t c) { return decode_finite(c & 0x0f, kE2M1); });
  return table[v];
}

uint8_t f32_to_e8m0(float x, E8M0Round mode) {
  const uint32_t u = f32_bits(x);
  if (mode == E8M0Round::Nearest) {
    // ml_dtypes drops the 23 mantissa bits with round-half-to-even where the kept "last bit" is the
    // implicit one: always 1 for normals (ties round up), 0 for f32 subnormals (ties round down).
    if (std::isnan(x) || std::isinf(x) || (u >> 31) || x == 0) return 0xff;
    const bool normal = (u >> 23) != 0;
    const uint32_t e = (u + (normal ? 0x400000u : 0x3fffffu)) >> 23;
    return e >= 0xff ? 0xff : uint8_t(e);
  }
  if (std::isnan(x)) return 0xff;
  if (x <= 0) return 0x00;
  if (std::isinf(x)) return 0xfe;
  int k;
  const double m = std::frexp(double(x), &k);  // x = m * 2^k, m in [0.5, 1)
  const int log2_floor = k - 1;
  const int log2 = (mode == E8M0Round::Up && m != 0.5) ? k : log2_floor;
  const int e = log2 + 127;
  return uint8_t(e < 0 ? 0 : (e > 0xfe ? 0xfe : e));
}

float e8m0_to_f32(uint8_t v) {
  if (v == 0xff) return quiet_nan(false);
  return std::ldexp(1.0f, int(v) - 127);
}

}  // namespace qlora
