// GgufWriter: what it writes reads back through GgufFile (every metadata type, tensors of every
// writable type, alignment), it reproduces a file written by gguf-py's GGUFWriter byte for byte,
// and its Q8_0 / Q4_0 / F16 / BF16 encodings equal gguf-py's numpy quantizers
// (tests/fixtures/export/quant_ref.gguf, tools/make_gguf_quant_fixtures.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "gguf_builder.h"
#include "tmp_dir.h"

namespace qlora {
namespace {

const std::string kRef = std::string(QLORA_FIXTURES) + "/export/quant_ref.gguf";

std::vector<uint8_t> encode(GgmlType t, const std::vector<float>& x, int64_t row) {
  std::vector<uint8_t> out(size_t(ggml_row_bytes(t, row) * int64_t(x.size()) / row));
  for (size_t r = 0; r < x.size() / size_t(row); r++)
    quantize_row(t, x.data() + r * size_t(row), out.data() + r * size_t(ggml_row_bytes(t, row)), row);
  return out;
}

TEST(GgufWriterQuant, EncodingsEqualGgufPy) {
  GgufFile ref(kRef);
  const std::vector<float> x = ref.read_tensor_f32("input");
  ASSERT_EQ(x.size(), 8u * 64u);
  for (const char* name : {"q8_0", "q4_0", "f16", "bf16"}) {
    SCOPED_TRACE(name);
    const GgufTensorInfo& ti = ref.tensor(name);
    const std::vector<uint8_t> ours = encode(ti.type, x, 64);
    ASSERT_EQ(ours.size(), ti.n_bytes);
    EXPECT_EQ(0, std::memcmp(ours.data(), ref.tensor_data(name), ours.size()));
    size_t first = 0;
    while (first < ours.size() && ours[first] == ref.tensor_data(name)[first]) first++;
    EXPECT_EQ(first, ours.size()) << "first differing byte";
  }
}

// The same error bound the formats promise: Q8_0 within d/2 = max|x|/254 per block, Q4_0 within
// d/2 = max|x|/16 except at the far end of its asymmetric range (-8..7 levels of d = max/-8: a value
// near -max rounds to 7|d|, off by up to max/8), F16/BF16 within half an ulp.
TEST(GgufWriterQuant, RoundTripThroughOurDequantizer) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> x(32 * 64);
  for (auto& v : x) v = nd(rng) * 0.05f;
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F16, GgmlType::BF16, GgmlType::F32}) {
    SCOPED_TRACE(ggml_type_name(t));
    const auto q = encode(t, x, 64);
    std::vector<float> y(x.size());
    for (size_t r = 0; r < 32; r++)
      dequantize_row(t, q.data() + r * size_t(ggml_row_bytes(t, 64)), y.data() + r * 64, 64);
    for (size_t b = 0; b < x.size() / 32; b++) {
      float amax = 0;
      for (size_t j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      for (size_t j = 0; j < 32; j++) {
        const float v = x[b * 32 + j], err = std::fabs(y[b * 32 + j] - v);
        float bound = 0;
        if (t == GgmlType::Q8_0) bound = amax / 254 + amax * 5e-4f + 1e-7f;  // + the f16 rounding of d
        if (t == GgmlType::Q4_0) bound = (std::fabs(v) > amax * 7 / 8 ? amax / 8 : amax / 16) + amax * 5e-4f + 1e-7f;
        if (t == GgmlType::F16) bound = std::fabs(v) * 4.9e-4f + 3e-8f;
        if (t == GgmlType::BF16) bound = std::fabs(v) * 3.91e-3f;
        EXPECT_LE(err, bound) << "block " << b << " element " << j;
      }
    }
  }
  // Q8_0 is symmetric: the largest magnitude maps to +-127.
  const auto q = encode(GgmlType::Q8_0, x, 64);
  float amax = 0;
  for (size_t j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[j]));
  int maxq = 0;
  for (size_t j = 0; j < 32; j++) maxq = std::max(maxq, std::abs(int(int8_t(q[2 + j]))));
  EXPECT_EQ(maxq, 127);
}

TEST(GgufWriterQuant, RefusesPartialBlocksAndUnknownTypes) {
  std::vector<float> x(48, 1.0f);
  std::vector<uint8_t> out(64);
  EXPECT_THROW(quantize_row(GgmlType::Q8_0, x.data(), out.data(), 48), Error);
  EXPECT_THROW(quantize_row(GgmlType::Q4_K, x.data(), out.data(), 256), Error);
  GgufWriter w;
  try {
    w.add_tensor("blk.0.attn_q.weight", {48, 2}, GgmlType::Q8_0);
    FAIL() << "accepted a row of 48 in Q8_0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.attn_q.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("block size 32"), std::string::npos) << e.what();
  }
}

// gguf-py wrote quant_ref.gguf with general.architecture and five tensors; ours must be identical.
TEST(GgufWriter, ReproducesGgufPyFileByteForByte) {
  GgufFile ref(kRef);
  test::TmpDir dir;
  const std::string path = dir.path() + "/copy.gguf";
  GgufWriter w;
  w.set("general.architecture", gguf_str(ref.get_string("general.architecture")));
  for (const auto& t : ref.tensors()) w.add_tensor(t.name, t.ne, t.type);
  EXPECT_EQ(w.file_size(), ref.file_size());
  w.begin(path);
  for (const auto& t : ref.tensors()) w.write_tensor(ref.tensor_data(t.name), t.n_bytes);
  w.commit();
  EXPECT_EQ(testing::read_bytes(path), testing::read_bytes(kRef));
}

TEST(GgufWriter, EveryValueTypeAndTensorReadsBack) {
  test::TmpDir dir;
  const std::string path = dir.path() + "/all.gguf";
  GgufWriter w;
  auto v = [](GgufType t, int64_t i) { GgufValue g; g.type = t; g.i = i; return g; };
  w.set("general.alignment", gguf_u32(64));
  w.set("t.u8", v(GgufType::U8, 200));
  w.set("t.i8", v(GgufType::I8, -100));
  w.set("t.u16", v(GgufType::U16, 60000));
  w.set("t.i16", v(GgufType::I16, -30000));
  w.set("t.u32", gguf_u32(4000000000u));
  w.set("t.i32", gguf_i32(-2000000000));
  w.set("t.u64", gguf_u64((uint64_t(1) << 63) + 5));
  w.set("t.i64", v(GgufType::I64, -(int64_t(1) << 62) - 7));
  w.set("t.f32", gguf_f32(1.5f));
  GgufValue f64;
  f64.type = GgufType::F64;
  f64.f = 3.141592653589793;
  w.set("t.f64", f64);
  w.set("t.bool", gguf_bool(true));
  w.set("t.string", gguf_str("h\xc3\xa9llo GGUF"));
  w.set("t.arr_str", gguf_str_array({"a", "", "\xe6\x97\xa5", "last"}));
  w.set("t.arr_i32", gguf_i32_array({1, -2, 300000}));
  w.set("t.arr_f32", gguf_f32_array({0.5f, -1.25f}));
  GgufValue nested;
  nested.type = GgufType::ARRAY;
  nested.elem_type = GgufType::ARRAY;
  nested.arr = {gguf_i32_array({1, 2}), gguf_i32_array({3})};
  w.set("t.nested", nested);
  w.set("t.string", gguf_str("replaced"));  // same key again: replaced in place
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> a(64 * 3), b(5), c(32 * 2);
  for (auto* vec : {&a, &b, &c})
    for (auto& x : *vec) x = nd(rng);
  w.add_tensor("a_q8", {64, 3}, GgmlType::Q8_0);
  w.add_tensor("b_f32", {5}, GgmlType::F32);
  w.add_tensor("c_f16", {32, 2}, GgmlType::F16);
  w.add_tensor("a_q4", {64, 3}, GgmlType::Q4_0);
  w.add_tensor("c_bf16", {32, 2}, GgmlType::BF16);
  const uint64_t expect_size = w.file_size();
  w.begin(path);
  w.write_tensor_f32(a.data(), int64_t(a.size()));
  w.write_tensor_f32(b.data(), int64_t(b.size()));
  w.write_tensor_f32(c.data(), int64_t(c.size()));
  w.write_tensor_f32(a.data(), int64_t(a.size()));
  w.write_tensor_f32(c.data(), int64_t(c.size()));
  EXPECT_FALSE(std::filesystem::exists(path));  // nothing under the final name before commit
  w.commit();
  EXPECT_EQ(std::filesystem::file_size(path), expect_size);

  GgufFile f(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.keys().front(), "general.alignment");
  EXPECT_EQ(f.keys().size(), 17u);
  EXPECT_EQ(f.get_i64("t.u8"), 200);
  EXPECT_EQ(f.type_of("t.u8"), GgufType::U8);
  EXPECT_EQ(f.get_i64("t.i8"), -100);
  EXPECT_EQ(f.get_i64("t.u16"), 60000);
  EXPECT_EQ(f.get_i64("t.i16"), -30000);
  EXPECT_EQ(f.get_u32("t.u32"), 4000000000u);
  EXPECT_EQ(f.get_i64("t.i32"), -2000000000);
  EXPECT_EQ(f.get_u64("t.u64"), (uint64_t(1) << 63) + 5);
  EXPECT_EQ(f.get_i64("t.i64"), -(int64_t(1) << 62) - 7);
  EXPECT_EQ(f.get_f32("t.f32"), 1.5f);
  EXPECT_EQ(f.type_of("t.f64"), GgufType::F64);
  EXPECT_EQ(f.get_f64("t.f64"), 3.141592653589793);
  EXPECT_TRUE(f.get_bool("t.bool"));
  EXPECT_EQ(f.get_string("t.string"), "replaced");
  EXPECT_EQ(f.get_array_strings("t.arr_str"), (std::vector<std::string>{"a", "", "\xe6\x97\xa5", "last"}));
  EXPECT_EQ(f.get_array_i64("t.arr_i32"), (std::vector<int64_t>{1, -2, 300000}));
  EXPECT_EQ(f.get_array_type("t.arr_i32"), GgufType::I32);
  EXPECT_EQ(f.get_array_f64("t.arr_f32"), (std::vector<double>{0.5, -1.25}));
  ASSERT_EQ(f.get("t.nested").arr.size(), 2u);
  EXPECT_EQ(f.get("t.nested").arr[1].arr[0].i, 3);

  ASSERT_EQ(f.tensors().size(), 5u);
  auto bytes_of = [](GgmlType t, const std::vector<float>& x, int64_t row) { return encode(t, x, row); };
  const std::pair<const char*, std::vector<uint8_t>> want[] = {
      {"a_q8", bytes_of(GgmlType::Q8_0, a, 64)}, {"b_f32", bytes_of(GgmlType::F32, b, 5)},
      {"c_f16", bytes_of(GgmlType::F16, c, 32)}, {"a_q4", bytes_of(GgmlType::Q4_0, a, 64)},
      {"c_bf16", bytes_of(GgmlType::BF16, c, 32)}};
  for (const auto& [name, bytes] : want) {
    SCOPED_TRACE(name);
    const GgufTensorInfo& t = f.tensor(name);
    EXPECT_EQ(t.offset % 64, 0u);
    ASSERT_EQ(t.n_bytes, bytes.size());
    EXPECT_EQ(0, std::memcmp(f.tensor_data(name), bytes.data(), bytes.size()));
  }
  EXPECT_EQ(f.tensor("b_f32").ne, (std::vector<int64_t>{5}));
  EXPECT_EQ(f.read_tensor_f32("b_f32"), b);
}

TEST(GgufWriter, UncommittedWriteLeavesNothing) {
  test::TmpDir dir;
  const std::string path = dir.path() + "/x.gguf";
  {
    GgufWriter w;
    w.set("general.architecture", gguf_str("llama"));
    w.add_tensor("t", {32}, GgmlType::F32);
    w.begin(path);
    // an error before the tensors are written: the writer goes out of scope uncommitted
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  GgufWriter w;
  w.add_tensor("t", {32}, GgmlType::F32);
  w.begin(path);
  EXPECT_THROW(w.commit(), Error);  // a tensor is missing
}

}  // namespace
}  // namespace qlora
