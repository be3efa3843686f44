// ggml dequantizers: every type against gguf.quants (numpy) on random blocks, plus hand-built blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "core/dtype.h"
#include "core/error.h"
#include "io/ggml_quants.h"
#include "io/gguf.h"

namespace qlora {
namespace {

const std::string kDir = std::string(QLORA_FIXTURES) + "/gguf/";

std::vector<float> read_f32_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(f.good()) << path;
  std::vector<float> v(size_t(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
  return v;
}

TEST(GgmlQuants, TraitsMatchTheBlockLayouts) {
  // Bytes per block from the struct definitions: d/dmin are f16, scales/quants as listed.
  struct Row { GgmlType t; int64_t block, bytes; };
  const Row rows[] = {{GgmlType::Q4_0, 32, 2 + 16},          {GgmlType::Q4_1, 32, 2 + 2 + 16},
                      {GgmlType::Q5_0, 32, 2 + 4 + 16},      {GgmlType::Q5_1, 32, 2 + 2 + 4 + 16},
                      {GgmlType::Q8_0, 32, 2 + 32},          {GgmlType::Q2_K, 256, 16 + 64 + 2 + 2},
                      {GgmlType::Q3_K, 256, 32 + 64 + 12 + 2}, {GgmlType::Q4_K, 256, 2 + 2 + 12 + 128},
                      {GgmlType::Q5_K, 256, 2 + 2 + 12 + 32 + 128}, {GgmlType::Q6_K, 256, 128 + 64 + 16 + 2},
                      {GgmlType::IQ4_NL, 32, 2 + 16},        {GgmlType::IQ4_XS, 256, 2 + 2 + 4 + 128},
                      {GgmlType::MXFP4, 32, 1 + 16},
                      {GgmlType::BF16, 1, 2},                {GgmlType::F16, 1, 2}};
  for (const auto& r : rows) {
    const GgmlTypeTraits& tr = ggml_type_traits(r.t);
    EXPECT_EQ(tr.block_size, r.block) << tr.name;
    EXPECT_EQ(tr.block_bytes, r.bytes) << tr.name;
    EXPECT_TRUE(tr.can_dequantize) << tr.name;
  }
  EXPECT_EQ(ggml_type_traits(99u), nullptr);
  EXPECT_EQ(ggml_type_traits(4u), nullptr);  // removed Q4_2
  EXPECT_EQ(ggml_type_label(12), "Q4_K");
  EXPECT_EQ(ggml_type_label(99), "type id 99");
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q6_K, 512), 420);
  EXPECT_THROW(ggml_row_bytes(GgmlType::Q6_K, 300), Error);
}

// The fixture holds random block bytes (scales forced to sane f16 values) and the numpy result.
class DequantVsGgufPy : public ::testing::TestWithParam<const char*> {};

TEST_P(DequantVsGgufPy, MatchesReference) {
  const std::string name = GetParam();
  GgufFile f(kDir + "types.gguf");
  std::vector<float> got = f.read_tensor_f32(name);
  std::vector<float> ref = read_f32_file(kDir + "types/" + name + ".f32");
  ASSERT_EQ(got.size(), ref.size());
  ASSERT_EQ(got.size(), 3u * 512);
  double ss = 0, max_err = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    ss += double(ref[i]) * ref[i];
    // numpy evaluates d*sc*q - dmin*m in the same f32 order; allow an ulp for FMA contraction.
    double err = std::fabs(double(got[i]) - ref[i]) / (1.0 + std::fabs(ref[i]));
    max_err = std::max(max_err, err);
    if (err > 1e-6) {
      ADD_FAILURE() << name << "[" << i << "] = " << got[i] << ", reference " << ref[i];
      break;
    }
  }
  EXPECT_GT(ss, 0.0);  // the reference is not degenerate
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DequantVsGgufPy,
                         ::testing::Values("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k",
                                           "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "mxfp4"));

void put_f16(uint8_t* p, float v) {
  uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

TEST(GgmlQuants, HandBuiltLegacyBlocks) {
  float y[32];
  {  // Q8_0: x = d * q
    uint8_t b[34];
    put_f16(b, 0.5f);
    for (int j = 0; j < 32; j++) b[2 + j] = uint8_t(int8_t(j - 3));
    dequantize_row(GgmlType::Q8_0, b, y, 32);
    for (int j = 0; j < 32; j++) EXPECT_EQ(y[j], 0.5f * float(j - 3));
  }
  {  // Q4_0: element j = low nibble of qs[j], element j+16 = high nibble; x = (q - 8) * d
    uint8_t b[18];
    put_f16(b, 2.0f);
    for (int j = 0; j < 16; j++) b[2 + j] = uint8_t(j | ((15 - j) << 4));
    dequantize_row(GgmlType::Q4_0, b, y, 32);
    for (int j = 0; j < 16; j++) {
      EXPECT_EQ(y[j], float(j - 8) * 2.0f);
      EXPECT_EQ(y[j + 16], float(15 - j - 8) * 2.0f);
    }
  }
  {  // Q4_1: x = q * d + m
    uint8_t b[20];
    put_f16(b, 0.25f);
    put_f16(b + 2, -1.0f);
    for (int j = 0; j < 16; j++) b[4 + j] = uint8_t((j % 16) | (3 << 4));
    dequantize_row(GgmlType::Q4_1, b, y, 32);
    EXPECT_EQ(y[5], 5 * 0.25f - 1.0f);
    EXPECT_EQ(y[20], 3 * 0.25f - 1.0f);
  }
  {  // Q5_0: bit j of qh (little-endian u32) is bit 4 of element j; x = (q - 16) * d
    uint8_t b[22] = {};
    put_f16(b, 1.0f);
    uint32_t qh = 0x80000001u;  // elements 0 and 31
    std::memcpy(b + 2, &qh, 4);
    b[6 + 15] = 0xF0;  // element 31's low bits = 15
    dequantize_row(GgmlType::Q5_0, b, y, 32);
    EXPECT_EQ(y[0], 0.0f);     // 16 - 16
    EXPECT_EQ(y[1], -16.0f);   // 0 - 16
    EXPECT_EQ(y[15], -16.0f);
    EXPECT_EQ(y[31], 15.0f);   // 31 - 16
  }
  {  // Q5_1: unsigned 5-bit q, x = q * d + m
    uint8_t b[24] = {};
    put_f16(b, 0.5f);
    put_f16(b + 2, 1.0f);
    uint32_t qh = 1u << 17;  // element 17
    std::memcpy(b + 4, &qh, 4);
    b[8 + 1] = 0x20;  // element 17's low bits = 2
    dequantize_row(GgmlType::Q5_1, b, y, 32);
    EXPECT_EQ(y[17], 18 * 0.5f + 1.0f);
    EXPECT_EQ(y[16], 1.0f);
  }
}

// The non-linear and microscaling types: code book entries, the 6-bit IQ4_XS scales, the E8M0 exponent.
TEST(GgmlQuants, HandBuiltCodeBookBlocks) {
  std::vector<float> y(256);
  {  // IQ4_NL: x = d * book[q]; nibble order as Q4_0
    uint8_t b[18];
    put_f16(b, 0.5f);
    for (int j = 0; j < 16; j++) b[2 + j] = uint8_t(j | ((15 - j) << 4));
    dequantize_row(GgmlType::IQ4_NL, b, y.data(), 32);
    EXPECT_EQ(y[0], -127 * 0.5f);
    EXPECT_EQ(y[8], 1 * 0.5f);
    EXPECT_EQ(y[15], 113 * 0.5f);
    EXPECT_EQ(y[16], 113 * 0.5f);  // high nibble of qs[0] = 15
    EXPECT_EQ(y[31], -127 * 0.5f);
  }
  {  // IQ4_XS: sub-block 5's scale = low nibble (odd: high half of scales_l[2]) | 2 bits of scales_h << 4, less 32
    std::vector<uint8_t> b(136, 0);
    put_f16(b.data(), 0.25f);
    const uint16_t sh = uint16_t(2u << 10);  // sub-block 5: high bits 2 -> scale 32 + low
    std::memcpy(b.data() + 2, &sh, 2);
    b[4 + 2] = 0x70;  // sub-block 5's low bits 7 (sub-block 4's 0)
    for (int j = 0; j < 16; j++) b[8 + 5 * 16 + j] = 0x8F;  // sub-block 5: book[15] then book[8]
    dequantize_row(GgmlType::IQ4_XS, b.data(), y.data(), 256);
    EXPECT_EQ(y[5 * 32], 0.25f * float(32 + 7 - 32) * 113);
    EXPECT_EQ(y[5 * 32 + 16], 0.25f * 7 * 1);
    EXPECT_EQ(y[4 * 32], 0.25f * -32 * -127);  // scale 0 - 32, all-zero quants = book[0]
  }
  {  // MXFP4: x = E2M1(q) * 2^(e - 127); e = 127 is a scale of 1, e = 0 the smallest (2^-127)
    uint8_t b[17] = {};
    b[0] = 127;
    b[1] = 0x87;  // element 0: 6.0; element 16: E2M1's -0, which ggml's integer table reads as +0
    b[2] = 0xF1;  // element 1: 0.5; element 17: -6.0
    dequantize_row(GgmlType::MXFP4, b, y.data(), 32);
    EXPECT_EQ(y[0], 6.0f);
    EXPECT_EQ(y[16], 0.0f);
    EXPECT_FALSE(std::signbit(y[16]));
    EXPECT_EQ(y[1], 0.5f);
    EXPECT_EQ(y[17], -6.0f);
    b[0] = 0;
    dequantize_row(GgmlType::MXFP4, b, y.data(), 32);
    EXPECT_EQ(y[1], std::ldexp(0.5f, -127));
    EXPECT_EQ(y[0], std::ldexp(6.0f, -127));
  }
}

// ggml's MXFP4 blocks and the checkpoint layout (codes with element 2i low, 2i + 1 high; scales
// apart): on random blocks, every element read from the codes and scales by hand equals ggml's
// dequantization of the block, and the way back gives the same bytes.
TEST(GgmlQuants, Mxfp4MovesBetweenGgmlBlocksAndTheCheckpointLayout) {
  const int64_t n = 32 * 12;
  std::vector<uint8_t> blocks(size_t(n / 32 * 17));
  uint32_t x = 7;
  for (size_t i = 0; i < blocks.size(); i++) {
    x = x * 1664525u + 1013904223u;
    blocks[i] = uint8_t(x >> 24);
    if (i % 17 == 0) blocks[i] = uint8_t(100 + (x >> 24) % 50);  // scales 2^-27 .. 2^22
  }
  std::vector<uint8_t> codes(size_t(n / 2)), scales(size_t(n / 32));
  mxfp4_from_ggml(blocks.data(), n, codes.data(), scales.data());
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(GgmlType::MXFP4, blocks.data(), y.data(), n);
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  int nonzero = 0;
  for (int64_t k = 0; k < n; k++) {
    const int code = (codes[size_t(k / 2)] >> (4 * (k % 2))) & 0xF;
    const float want = e2m1[code] * std::ldexp(1.0f, int(scales[size_t(k / 32)]) - 127);
    EXPECT_EQ(y[size_t(k)], want) << "element " << k;
    nonzero += want != 0;
  }
  EXPECT_GT(nonzero, n / 2);
  std::vector<uint8_t> back(blocks.size());
  mxfp4_to_ggml(codes.data(), scales.data(), n, back.data());
  EXPECT_EQ(back, blocks);
  EXPECT_THROW(mxfp4_from_ggml(blocks.data(), 31, codes.data(), scales.data()), Error);
}

TEST(GgmlQuants, HandBuiltKQuantBlocks) {
  std::vector<float> y(256);
  {  // Q6_K: all-zero quants decode to -32 * d * scale; bits land where the layout says
    std::vector<uint8_t> b(210, 0);
    for (int i = 0; i < 16; i++) b[192 + i] = uint8_t(int8_t(i % 2 ? 2 : -1));
    put_f16(b.data() + 208, 0.5f);
    b[0] = 0x0F;        // ql[0] low nibble -> element 0
    b[128] = 0x03;      // qh[0] bits 0-1 -> element 0 high bits
    b[32] = 0xA0;       // ql[32] high nibble -> element 96
    b[128 + 5] = 0x10;  // qh[5] bits 4-5 -> element 64 + 5
    dequantize_row(GgmlType::Q6_K, b.data(), y.data(), 256);
    EXPECT_EQ(y[0], 0.5f * -1 * float(63 - 32));    // scale 0
    EXPECT_EQ(y[1], 0.5f * -1 * float(-32));
    EXPECT_EQ(y[16], 0.5f * 2 * float(-32));        // scale 1
    EXPECT_EQ(y[96], 0.5f * -1 * float(10 - 32));   // scale 6
    EXPECT_EQ(y[69], 0.5f * -1 * float(16 - 32));   // scale 4
  }
  {  // Q4_K: sub-block j has scale sc_j and min m_j (6-bit packed); x = d*sc*q - dmin*m
    std::vector<uint8_t> b(144, 0);
    put_f16(b.data(), 1.0f);
    put_f16(b.data() + 2, 0.5f);
    uint8_t* s = b.data() + 4;
    s[0] = 2 | (1 << 6);  // sc0 = 2; its top bits feed sc4's bits 4-5
    s[4] = 3;             // m0 = 3
    s[8] = 0x51;          // sc4 low = 1, m4 low = 5
    uint8_t* qs = b.data() + 16;
    qs[0] = 0x97;   // element 0 (sub-block 0) q=7, element 32 (sub-block 1) q=9
    qs[64] = 0x0A;  // element 128 (sub-block 4) q=10
    dequantize_row(GgmlType::Q4_K, b.data(), y.data(), 256);
    EXPECT_EQ(y[0], 2.0f * 7 - 0.5f * 3);
    EXPECT_EQ(y[32], 0.0f);                       // sc1 = m1 = 0
    EXPECT_EQ(y[128], float(1 | (1 << 4)) * 10 - 0.5f * 5);
  }
}

TEST(GgmlQuants, RowErrors) {
  std::vector<uint8_t> src(1024, 0);
  std::vector<float> dst(512);
  try {
    dequantize_row(GgmlType::Q4_K, src.data(), dst.data(), 100);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Shape);
    EXPECT_NE(std::string(e.what()).find("Q4_K"), std::string::npos);
  }
  try {
    dequantize_row(GgmlType::IQ2_XXS, src.data(), dst.data(), 256);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos);
  }
}

}  // namespace
}  // namespace qlora
