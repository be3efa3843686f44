// Element type table and conversions.
#include "core/dtype.h"

#include "core/error.h"

namespace qlora {

static const DTypeTraits kDTypes[] = {
    {DType::F32, "f32", "F32", 4},         {DType::F16, "f16", "F16", 2},
    {DType::BF16, "bf16", "BF16", 2},      {DType::F64, "f64", "F64", 8},
    {DType::I8, "i8", "I8", 1},            {DType::U8, "u8", "U8", 1},
    {DType::I16, "i16", "I16", 2},         {DType::I32, "i32", "I32", 4},
    {DType::I64, "i64", "I64", 8},         {DType::F8_E4M3, "f8_e4m3", "F8_E4M3", 1},
    {DType::F8_E5M2, "f8_e5m2", "F8_E5M2", 1}, {DType::BOOL, "bool", "BOOL", 1},
};

const DTypeTraits& dtype_traits(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d;
  fail(ErrorKind::Internal, "dtype", "unknown dtype id " + std::to_string(int(t)));
}

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (const auto& d : kDTypes)
    if (s == d.safetensors) return d.dtype;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalize
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; exp--; }
      man &= 0x3ff;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int32_t exp = int32_t((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffff;
  if (((u >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    man |= 0x800000;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return uint16_t(sign | half);
  }
  uint32_t h = sign | (uint32_t(exp) << 10) | (man >> 13);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return uint16_t(h);
}

// Integer (and f64) elements to float.
template <class T>
static void widen(const T* s, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = float(s[i]);
}

void convert_to_f32(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      if (n > 0) std::memcpy(dst, src, size_t(n) * 4);  // an empty tensor may have no data pointer
      return;
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F64: return widen(static_cast<const double*>(src), dst, n);
    case DType::I8: return widen(static_cast<const int8_t*>(src), dst, n);
    case DType::U8: return widen(static_cast<const uint8_t*>(src), dst, n);
    case DType::I16: return widen(static_cast<const int16_t*>(src), dst, n);
    case DType::I32: return widen(static_cast<const int32_t*>(src), dst, n);
    case DType::I64: return widen(static_cast<const int64_t*>(src), dst, n);
    default:
      fail(ErrorKind::Unsupported, "dtype", std::string("cannot convert ") + dtype_name(t) + " to f32");
  }
}

void convert_from_f32(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      if (n > 0) std::memcpy(dst, src, size_t(n) * 4);  // an empty tensor may have no data pointer
      return;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; i++) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
      return;
    }
    default:
      fail(ErrorKind::Unsupported, "dtype", std::string("cannot convert f32 to ") + dtype_name(t));
  }
}

}  // namespace qlora
