// Element types: one traits table (name, size, safetensors spelling) and scalar conversions.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace qlora {

enum class DType : uint8_t { F32, F16, BF16, F64, I8, U8, I16, I32, I64, F8_E4M3, F8_E5M2, BOOL };

struct DTypeTraits {
  DType dtype;
  const char* name;         // our name, lower case ("bf16")
  const char* safetensors;  // safetensors header spelling ("BF16")
  int size;                 // bytes per element
};

const DTypeTraits& dtype_traits(DType t);
inline int dtype_size(DType t) { return dtype_traits(t).size; }
inline const char* dtype_name(DType t) { return dtype_traits(t).name; }
std::optional<DType> dtype_from_safetensors(std::string_view s);

// bf16 <-> f32: round to nearest even, NaN kept quiet.
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of type src_t at src into f32 at dst (F32/F16/BF16/F64/ints).
void convert_to_f32(DType src_t, const void* src, float* dst, int64_t n);
// Converts n f32 values into dst_t (F32/F16/BF16).
void convert_from_f32(DType dst_t, const float* src, void* dst, int64_t n);

}  // namespace qlora
