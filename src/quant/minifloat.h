// Scalar f32 <-> minifloat conversions: FP8 E4M3FN / E5M2, FP4 E2M1, E8M0 scales (bit-exact references).
#pragma once
#include <cstdint>

namespace qlora {

// Encoders round to nearest, ties to even (RNE), like NVIDIA's cvt.rn and ml_dtypes.
// Without `saturate` they reproduce ml_dtypes' casts bit for bit, including the overflow and NaN
// conventions, which differ per type:
//   e4m3 (E4M3FN, max 448, no inf): overflow (|x| > 464) and +-inf -> NaN 0x7F|sign; NaN -> 0x7F|sign.
//   e5m2 (max 57344, IEEE inf):     overflow (|x| >= 61440) -> inf 0x7C|sign;      NaN -> 0x7E|sign.
//   e2m1 (max 6, no inf/NaN):       always saturates to +-6; NaN -> 0x8 if positive, 0x0 if negative
//                                   (ml_dtypes' quirk; CUDA's cvt gives +6 instead).
// With `saturate` (CUDA __NV_SATFINITE): finite overflow and +-inf clamp to +-max; NaN stays NaN.
uint8_t f32_to_e4m3(float x, bool saturate = false);
uint8_t f32_to_e5m2(float x, bool saturate = false);
uint8_t f32_to_e2m1(float x);  // low nibble; always saturating

float e4m3_to_f32(uint8_t v);
float e5m2_to_f32(uint8_t v);
float e2m1_to_f32(uint8_t v);  // uses the low nibble

// E8M0: unsigned power of two, byte e -> 2^(e-127); 0x00 = 2^-127 (not zero); 0xFF = NaN.
enum class E8M0Round : uint8_t {
  Nearest,  // ml_dtypes' cast: round the significand, ties away from zero; 0, negatives, inf, NaN -> 0xFF
  Up,       // ceil to a power of two (CUDA cudaRoundPosInf, TransformerEngine MXFP8); saturates at 0xFE
  Down,     // floor to a power of two (OCP's floor(log2)); saturates at 0x00 / 0xFE
};
uint8_t f32_to_e8m0(float x, E8M0Round mode = E8M0Round::Nearest);
float e8m0_to_f32(uint8_t v);

// Largest finite magnitudes.
inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;
inline constexpr float kE2M1Max = 6.0f;

}  // namespace qlora
