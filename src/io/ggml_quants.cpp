// ggml type table and scalar dequantizers, written from the block layouts of ggml's ggml-common.h.
#include "io/ggml_quants.h"

#include <cstring>
#include <iterator>

#include "core/dtype.h"
#include "core/error.h"

namespace qlora {

namespace {

constexpr int64_t QK = 32;     // legacy quants: elements per block
constexpr int64_t QK_K = 256;  // k-quants: elements per super-block

// Sizes follow ggml-common.h's static_asserts; gguf-py's GGML_QUANT_SIZES agrees except for Q8_1,
// whose fp32 d/s were changed to fp16 in ggml (36 bytes). Q8_1/Q8_K are runtime-only types anyway.
const GgmlTypeTraits kTraits[] = {
    {GgmlType::F32, "F32", 1, 4, true},
    {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", QK, 2 + QK / 2, true},
    {GgmlType::Q4_1, "Q4_1", QK, 4 + QK / 2, true},
    {GgmlType::Q5_0, "Q5_0", QK, 2 + 4 + QK / 2, true},
    {GgmlType::Q5_1, "Q5_1", QK, 4 + 4 + QK / 2, true},
    {GgmlType::Q8_0, "Q8_0", QK, 2 + QK, true},
    {GgmlType::Q8_1, "Q8_1", QK, 4 + QK, false},
    {GgmlType::Q2_K, "Q2_K", QK_K, QK_K / 16 + QK_K / 4 + 4, true},
    {GgmlType::Q3_K, "Q3_K", QK_K, QK_K / 8 + QK_K / 4 + 12 + 2, true},
    {GgmlType::Q4_K, "Q4_K", QK_K, 4 + 12 + QK_K / 2, true},
    {GgmlType::Q5_K, "Q5_K", QK_K, 4 + 12 + QK_K / 8 + QK_K / 2, true},
    {GgmlType::Q6_K, "Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, true},
    {GgmlType::Q8_K, "Q8_K", QK_K, 4 + QK_K + QK_K / 8, false},
    {GgmlType::IQ2_XXS, "IQ2_XXS", QK_K, 2 + QK_K / 4, false},
    {GgmlType::IQ2_XS, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32, false},
    {GgmlType::IQ3_XXS, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8, false},
    {GgmlType::IQ1_S, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16, false},
    {GgmlType::IQ4_NL, "IQ4_NL", QK, 2 + QK / 2, true},
    {GgmlType::IQ3_S, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, false},
    {GgmlType::IQ2_S, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16, false},
    {GgmlType::IQ4_XS, "IQ4_XS", QK_K, 4 + QK_K / 2 + QK_K / 64, true},
    {GgmlType::I8, "I8", 1, 1, true},
    {GgmlType::I16, "I16", 1, 2, true},
    {GgmlType::I32, "I32", 1, 4, true},
    {GgmlType::I64, "I64", 1, 8, false},
    {GgmlType::F64, "F64", 1, 8, true},
    {GgmlType::IQ1_M, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32, false},
    {GgmlType::BF16, "BF16", 1, 2, true},
    {GgmlType::TQ1_0, "TQ1_0", QK_K, 2 + 4 * 13, false},
    {GgmlType::TQ2_0, "TQ2_0", QK_K, 2 + 64, false},
    {GgmlType::MXFP4, "MXFP4", QK, 1 + QK / 2, true},
};

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q4_0: d(f16) qs[16]; element j in the low nibble of qs[j], element j+16 in the high nibble.
void dq_q4_0(const uint8_t* b, float* y) {
  float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; j++) {
    y[j] = float(int(qs[j] & 0xF) - 8) * d;
    y[j + 16] = float(int(qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: d(f16) m(f16) qs[16]; x = q*d + m with unsigned q.
void dq_q4_1(const uint8_t* b, float* y) {
  float d = half(b), m = half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; j++) {
    y[j] = float(qs[j] & 0xF) * d + m;
    y[j + 16] = float(qs[j] >> 4) * d + m;
  }
}

// Q5_0: d(f16) qh(u32 LE) qs[16]; bit j of qh is the 5th bit of element j (j < 32).
void dq_q5_0(const uint8_t* b, float* y) {
  float d = half(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; j++) {
    int lo = (qs[j] & 0xF) | int(((qh >> j) & 1u) << 4);
    int hi = (qs[j] >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
    y[j] = float(lo - 16) * d;
    y[j + 16] = float(hi - 16) * d;
  }
}

// Q5_1: d(f16) m(f16) qh(u32 LE) qs[16]; unsigned 5-bit q, x = q*d + m.
void dq_q5_1(const uint8_t* b, float* y) {
  float d = half(b), m = half(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; j++) {
    int lo = (qs[j] & 0xF) | int(((qh >> j) & 1u) << 4);
    int hi = (qs[j] >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
    y[j] = float(lo) * d + m;
    y[j + 16] = float(hi) * d + m;
  }
}

// Q8_0: d(f16) qs[32] int8.
void dq_q8_0(const uint8_t* b, float* y) {
  float d = half(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; j++) y[j] = float(qs[j]) * d;
}

// Q2_K: scales[16] (low nibble scale, high nibble min) qs[64] (2 bits) d(f16) dmin(f16).
// Each 128-element half reads 32 bytes of qs four times, shifting by 2 bits each pass.
void dq_q2_k(const uint8_t* b, float* y) {
  const uint8_t* sc = b;
  const uint8_t* q = b + 16;
  float d = half(b + 80), dmin = half(b + 82);
  int is = 0;
  for (int n = 0; n < QK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half_i = 0; half_i < 2; half_i++) {
        uint8_t s = sc[is++];
        float dl = d * float(s & 0xF), ml = dmin * float(s >> 4);
        const uint8_t* qq = q + 16 * half_i;
        for (int l = 0; l < 16; l++) *y++ = dl * float((qq[l] >> shift) & 3) - ml;
      }
    }
    q += 32;
  }
}

// Q3_K: hmask[32] qs[64] scales[12] (16 signed 6-bit scales, offset 32) d(f16).
// The 3rd bit of each quant lives in hmask; a clear bit subtracts 4.
void dq_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const uint8_t* s = b + 96;
  float d = half(b + 108);
  // Scales 0-7 take their low 4 bits from the low nibbles of s[0..7], 8-15 from the high
  // nibbles; the top 2 bits of scale i come from s[8 + i%4] at bit 2*(i/4).
  int scales[16];
  for (int i = 0; i < 16; i++) {
    int low = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
    int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = (low | (high << 4)) - 32;
  }
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < QK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half_i = 0; half_i < 2; half_i++) {
        float dl = d * float(scales[is++]);
        const uint8_t* qq = q + 16 * half_i;
        const uint8_t* hh = hm + 16 * half_i;
        for (int l = 0; l < 16; l++) {
          int v = int((qq[l] >> shift) & 3) - ((hh[l] & m) ? 0 : 4);
          *y++ = dl * float(v);
        }
      }
      m = uint8_t(m << 1);
    }
    q += 32;
  }
}

// 6-bit scale/min pairs of Q4_K/Q5_K packed in 12 bytes: pairs 0-3 use the low 6 bits of
// bytes 0-3 (scale) and 4-7 (min); pairs 4-7 take 4 bits from bytes 8-11 and their top
// 2 bits from the spare high bits of bytes 0-7.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K: d(f16) dmin(f16) scales[12] qs[128]; 8 sub-blocks of 32, x = d*sc*q - dmin*m.
// Each 32 bytes of qs hold two sub-blocks: low nibbles first, then high nibbles.
void dq_q4_k(const uint8_t* b, float* y) {
  float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0; j < 8; j += 2) {
    uint8_t sc, m;
    scale_min_k4(j, scales, sc, m);
    float d1 = d * float(sc), m1 = dmin * float(m);
    scale_min_k4(j + 1, scales, sc, m);
    float d2 = d * float(sc), m2 = dmin * float(m);
    for (int l = 0; l < 32; l++) *y++ = d1 * float(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; l++) *y++ = d2 * float(q[l] >> 4) - m2;
    q += 32;
  }
}

// Q5_K: like Q4_K plus qh[32]; bit (sub-block index) of qh[l] is the 5th bit of element l
// of that sub-block.
void dq_q5_k(const uint8_t* b, float* y) {
  float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  for (int j = 0; j < 8; j += 2) {
    uint8_t sc, m;
    scale_min_k4(j, scales, sc, m);
    float d1 = d * float(sc), m1 = dmin * float(m);
    scale_min_k4(j + 1, scales, sc, m);
    float d2 = d * float(sc), m2 = dmin * float(m);
    for (int l = 0; l < 32; l++) *y++ = d1 * float((ql[l] & 0xF) + (((qh[l] >> j) & 1) << 4)) - m1;
    for (int l = 0; l < 32; l++) *y++ = d2 * float((ql[l] >> 4) + (((qh[l] >> (j + 1)) & 1) << 4)) - m2;
    ql += 32;
  }
}

// Q6_K: ql[128] (low 4 bits) qh[64] (high 2 bits) scales[16] int8 d(f16); q in [-32, 31].
// Per 128 elements: ql[0..63] and qh[0..31]; the four 32-element quarters take the low/high
// nibbles of ql[l] / ql[l+32] and bit pairs 0-1, 2-3, 4-5, 6-7 of qh[l]; one scale per 16.
void dq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  float d = half(b + 208);
  for (int n = 0; n < QK_K; n += 128) {
    for (int l = 0; l < 32; l++) {
      int is = l / 16;
      int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * float(sc[is + 0]) * float(q1);
      y[l + 32] = d * float(sc[is + 2]) * float(q2);
      y[l + 64] = d * float(sc[is + 4]) * float(q3);
      y[l + 96] = d * float(sc[is + 6]) * float(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// IQ4_NL's non-linear code book (ggml's kvalues_iq4nl), shared by IQ4_XS.
constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// IQ4_NL: d(f16) qs[16]; x = d * kIq4nl[q], element j in the low nibble of qs[j], j+16 in the high.
void dq_iq4_nl(const uint8_t* b, float* y) {
  const float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; j++) {
    y[j] = d * float(kIq4nl[qs[j] & 0xF]);
    y[j + 16] = d * float(kIq4nl[qs[j] >> 4]);
  }
}

// IQ4_XS: d(f16) scales_h(u16) scales_l[4] qs[128]; eight 32-element sub-blocks, each with a 6-bit
// scale (low 4 bits: nibble ib%2 of scales_l[ib/2]; high 2 bits: bits 2ib, 2ib+1 of scales_h) less
// 32, and IQ4_NL's code book and nibble order.
void dq_iq4_xs(const uint8_t* b, float* y) {
  const float d = half(b);
  uint16_t sh;
  std::memcpy(&sh, b + 2, 2);
  const uint8_t* sl = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < QK_K / 32; ib++) {
    const int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
    const float dl = d * float(ls - 32);
    for (int j = 0; j < 16; j++) {
      y[j] = dl * float(kIq4nl[qs[j] & 0xF]);
      y[j + 16] = dl * float(kIq4nl[qs[j] >> 4]);
    }
    y += 32;
    qs += 16;
  }
}

// MXFP4 as ggml stores it (gpt-oss's experts in its GGUFs): e (E8M0 exponent) qs[16]; x = the E2M1
// value of the nibble times 2^(e - 127), computed as ggml does: twice the E2M1 value (an integer)
// times 2^(e - 128), both exact. Element j in the low nibble of qs[j], j+16 in the high.
constexpr int8_t kMxfp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
void dq_mxfp4(const uint8_t* b, float* y) {
  const uint8_t e = b[0];
  const uint32_t bits = e < 2 ? (uint32_t(0x00200000) << e) : (uint32_t(e - 1) << 23);  // 2^(e - 128), subnormal below e = 2
  float d;
  std::memcpy(&d, &bits, 4);
  const uint8_t* qs = b + 1;
  for (int j = 0; j < 16; j++) {
    y[j] = float(kMxfp4Doubled[qs[j] & 0xF]) * d;
    y[j + 16] = float(kMxfp4Doubled[qs[j] >> 4]) * d;
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return dq_q4_0;
    case GgmlType::Q4_1: return dq_q4_1;
    case GgmlType::Q5_0: return dq_q5_0;
    case GgmlType::Q5_1: return dq_q5_1;
    case GgmlType::Q8_0: return dq_q8_0;
    case GgmlType::Q2_K: return dq_q2_k;
    case GgmlType::Q3_K: return dq_q3_k;
    case GgmlType::Q4_K: return dq_q4_k;
    case GgmlType::Q5_K: return dq_q5_k;
    case GgmlType::Q6_K: return dq_q6_k;
    case GgmlType::IQ4_NL: return dq_iq4_nl;
    case GgmlType::IQ4_XS: return dq_iq4_xs;
    case GgmlType::MXFP4: return dq_mxfp4;
    default: return nullptr;
  }
}

}  // namespace

const GgmlTypeTraits* ggml_type_traits(uint32_t id) {
  for (const auto& t : kTraits)
    if (uint32_t(t.type) == id) return &t;
  return nullptr;
}

const GgmlTypeTraits& ggml_type_traits(GgmlType t) {
  const GgmlTypeTraits* p = ggml_type_traits(uint32_t(t));
  if (!p) fail(ErrorKind::Unsupported, "ggml type", "unknown ggml type id " + std::to_string(uint32_t(t)));
  return *p;
}

std::string ggml_type_label(uint32_t id) {
  const GgmlTypeTraits* p = ggml_type_traits(id);
  return p ? std::string(p->name) : "type id " + std::to_string(id);
}

std::string ggml_dequantizable_types() {
  std::string out;
  for (const auto& t : kTraits) {
    if (!t.can_dequantize) continue;
    if (!out.empty()) out += ' ';
    out += t.name;
  }
  return out;
}

int64_t ggml_row_bytes(GgmlType t, int64_t n) {
  const GgmlTypeTraits& tr = ggml_type_traits(t);
  if (n < 0 || n % tr.block_size != 0)
    fail(ErrorKind::Shape, std::string("ggml type ") + tr.name,
         std::to_string(n) + " elements is not a whole number of " + std::to_string(tr.block_size) +
             "-element blocks");
  return n / tr.block_size * tr.block_bytes;
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  const GgmlTypeTraits& tr = ggml_type_traits(t);
  if (!tr.can_dequantize)
    fail(ErrorKind::Unsupported, std::string("ggml type ") + tr.name, "dequantization is not implemented",
         "supported: " + ggml_dequantizable_types() + "; re-quantize the model with llama-quantize to one of them");
  ggml_row_bytes(t, n);  // checks whole blocks
  switch (t) {
    case GgmlType::F32: convert_to_f32(DType::F32, src, dst, n); return;
    case GgmlType::F16: convert_to_f32(DType::F16, src, dst, n); return;
    case GgmlType::BF16: convert_to_f32(DType::BF16, src, dst, n); return;
    case GgmlType::F64: convert_to_f32(DType::F64, src, dst, n); return;
    case GgmlType::I8: convert_to_f32(DType::I8, src, dst, n); return;
    case GgmlType::I16: convert_to_f32(DType::I16, src, dst, n); return;
    case GgmlType::I32: convert_to_f32(DType::I32, src, dst, n); return;
    default: break;
  }
  BlockFn fn = block_fn(t);
  QLORA_ASSERT(fn != nullptr);
  const auto* s = static_cast<const uint8_t*>(src);
  for (int64_t b = 0, nb = n / tr.block_size; b < nb; b++) fn(s + b * tr.block_bytes, dst + b * tr.block_size);
}

void mxfp4_from_ggml(const uint8_t* blocks, int64_t n, uint8_t* codes, uint8_t* scales) {
  if (n % 32 != 0) fail(ErrorKind::Shape, "MXFP4", std::to_string(n) + " elements are not whole blocks of 32");
  for (int64_t b = 0; b < n / 32; b++, blocks += 17, codes += 16) {
    scales[b] = blocks[0];
    const uint8_t* qs = blocks + 1;
    auto code = [qs](int k) { return k < 16 ? qs[k] & 0xF : qs[k - 16] >> 4; };
    for (int i = 0; i < 16; i++) codes[i] = uint8_t(code(2 * i) | code(2 * i + 1) << 4);
  }
}

void mxfp4_to_ggml(const uint8_t* codes, const uint8_t* scales, int64_t n, uint8_t* blocks) {
  if (n % 32 != 0) fail(ErrorKind::Shape, "MXFP4", std::to_string(n) + " elements are not whole blocks of 32");
  for (int64_t b = 0; b < n / 32; b++, blocks += 17, codes += 16) {
    blocks[0] = scales[b];
    auto code = [codes](int k) { return k % 2 == 0 ? codes[k / 2] & 0xF : codes[k / 2] >> 4; };
    for (int j = 0; j < 16; j++) blocks[1 + j] = uint8_t(code(j) | code(j + 16) << 4);
  }
}

}  // namespace qlora
