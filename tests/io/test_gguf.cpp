// GgufFile: header/metadata/tensor-info parsing, typed getters, and every rejection path.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/error.h"
#include "io/gguf.h"
#include "gguf_builder.h"

namespace qlora {
namespace {

using testing::GgufBuilder;
const std::string kDir = std::string(QLORA_FIXTURES) + "/gguf/";

// Runs f, which must throw qlora::Error of `kind` whose text contains every fragment.
void expect_error(const std::function<void()>& f, ErrorKind kind, std::vector<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(error_kind_name(e.kind()), std::string(error_kind_name(kind))) << e.what();
    for (const auto& s : fragments) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << "'" << s << "' not in: " << e.what();
  }
}

GgufFile from(const GgufBuilder& b) { return GgufFile::from_bytes(b.build(), "mem.gguf"); }

TEST(Gguf, MetadataOfEveryValueType) {
  GgufFile f(kDir + "meta.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  ASSERT_FALSE(f.keys().empty());
  EXPECT_EQ(f.keys()[0], "general.architecture");  // file order is kept
  EXPECT_EQ(f.get_string("general.architecture"), "test");
  EXPECT_EQ(f.type_of("t.u8"), GgufType::U8);
  EXPECT_EQ(f.get_u32("t.u8"), 200u);
  EXPECT_EQ(f.get_i64("t.i8"), -100);
  EXPECT_EQ(f.get_u32("t.u16"), 60000u);
  EXPECT_EQ(f.get_i64("t.i16"), -30000);
  EXPECT_EQ(f.get_u32("t.u32"), 4000000000u);
  EXPECT_EQ(f.get_i64("t.i32"), -2000000000);
  EXPECT_EQ(f.get_f32("t.f32"), 1.5f);
  EXPECT_EQ(f.get_u64("t.u64"), (uint64_t(1) << 63) + 5);
  EXPECT_EQ(f.get_i64("t.i64"), -(int64_t(1) << 62) - 7);
  EXPECT_EQ(f.get_f64("t.f64"), 3.141592653589793);
  EXPECT_TRUE(f.get_bool("t.bool"));
  EXPECT_EQ(f.get_string("t.string"), "h\xc3\xa9llo GGUF");
  EXPECT_EQ(f.get_array_type("t.arr_str"), GgufType::STRING);
  EXPECT_EQ(f.get_array_strings("t.arr_str"), (std::vector<std::string>{"a", "bc", "\xe6\x97\xa5\xe6\x9c\xac", "last"}));
  EXPECT_EQ(f.get_array_i64("t.arr_i32"), (std::vector<int64_t>{1, -2, 300000}));
  EXPECT_EQ(f.get_array_f64("t.arr_f32"), (std::vector<double>{0.5, -1.25, 3.0}));
  EXPECT_EQ(f.get_array_f64("t.arr_i32"), (std::vector<double>{1, -2, 300000}));
  EXPECT_EQ(f.get_array_i64("t.arr_bool"), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(f.get_array_f64("t.arr_f64"), (std::vector<double>{0.1, -2.5}));
  EXPECT_EQ(f.get_array_size("t.arr_u64"), 2u);
  EXPECT_EQ(f.get("t.arr_u64").arr[1].u, ~uint64_t(0));
  const GgufValue& nested = f.get("t.nested");
  EXPECT_EQ(nested.elem_type, GgufType::ARRAY);
  ASSERT_EQ(nested.arr.size(), 2u);
  EXPECT_EQ(nested.arr[0].arr.size(), 2u);
  EXPECT_EQ(nested.arr[1].arr[0].i, 3);
}

TEST(Gguf, GetterTypeErrorsNameTheKey) {
  GgufFile f(kDir + "meta.gguf");
  expect_error([&] { f.get_string("t.u32"); }, ErrorKind::Format, {"key 't.u32'", "u32", "expected string"});
  expect_error([&] { f.get_u32("t.i8"); }, ErrorKind::Format, {"key 't.i8'", "negative"});
  expect_error([&] { f.get_u32("t.u64"); }, ErrorKind::Format, {"key 't.u64'", "does not fit in u32"});
  expect_error([&] { f.get_i64("t.u64"); }, ErrorKind::Format, {"does not fit in i64"});
  expect_error([&] { f.get_f32("t.string"); }, ErrorKind::Format, {"expected f32 or f64"});
  expect_error([&] { f.get_bool("t.u8"); }, ErrorKind::Format, {"expected bool"});
  expect_error([&] { f.get_array_strings("t.arr_i32"); }, ErrorKind::Format, {"array of string"});
  expect_error([&] { f.get_array_i64("t.arr_f32"); }, ErrorKind::Format, {"array of integers"});
  expect_error([&] { f.get_array_f64("t.arr_str"); }, ErrorKind::Format, {"array of numbers"});
  expect_error([&] { f.get_array_size("t.u8"); }, ErrorKind::Format, {"expected array"});
  expect_error([&] { f.get_array_i64("t.arr_u64"); }, ErrorKind::Format, {"element 1"});
  expect_error([&] { f.get_u32("t.u3"); }, ErrorKind::Format, {"key 't.u3'", "missing metadata key", "did you mean"});
  EXPECT_FALSE(f.has("t.u3"));
}

TEST(Gguf, TensorInfoAndRawBytes) {
  GgufFile f(kDir + "meta.gguf");
  ASSERT_EQ(f.tensors().size(), 1u);
  const GgufTensorInfo& t = f.tensor("tiny");
  EXPECT_EQ(t.ne, (std::vector<int64_t>{4}));
  EXPECT_EQ(t.type, GgmlType::F32);
  EXPECT_EQ(t.n_bytes, 16u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  float raw[4];
  std::memcpy(raw, f.tensor_data("tiny"), 16);
  EXPECT_EQ(f.read_tensor_f32("tiny"), (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));
  EXPECT_EQ(raw[3], 3.5f);
  expect_error([&] { f.tensor("tinyy"); }, ErrorKind::Format, {"tensor 'tinyy'", "did you mean 'tiny'"});
}

TEST(Gguf, HonoursCustomAlignmentAndHfOrientation) {
  GgufFile f(kDir + "types.gguf");
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  for (const auto& t : f.tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  // A (3, 512) numpy array is stored with ne = [512, 3]; shape() gives back the PyTorch order.
  const GgufTensorInfo& t = f.tensor("q4_k");
  EXPECT_EQ(t.ne, (std::vector<int64_t>{512, 3}));
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{3, 512}));
  EXPECT_EQ(t.n_bytes, 3u * 2 * 144);
}

TEST(Gguf, UnsupportedTensorTypeIsNamedOnRead) {
  GgufFile f(kDir + "types.gguf");  // opening works: IQ2_XXS has a known size
  std::vector<float> out(512);
  expect_error([&] { f.read_tensor_f32("iq2_xxs", out.data()); }, ErrorKind::Unsupported, {"tensor 'iq2_xxs'", "IQ2_XXS"});
}

// ggml's integer tensor types read as floats (a fuzzer found I8 claimed readable but refused, the
// error then thrown inside the parallel read, which ends the process). The 1M+-element tensor takes
// the multi-threaded path.
TEST(Gguf, IntegerTensorsReadAsFloats) {
  const size_t big = (size_t(1) << 20) + 64;
  std::vector<uint8_t> i8(big), i16(2 * 3);
  for (size_t i = 0; i < big; i++) i8[i] = uint8_t(int8_t(int(i % 256) - 128));
  const int16_t v16[3] = {-300, 7, 32767};
  std::memcpy(i16.data(), v16, sizeof v16);
  GgufFile f = from(GgufBuilder().tensor_raw("i8", {big}, 24, i8).tensor_raw("i16", {3}, 25, i16));
  const auto a = f.read_tensor_f32("i8");
  ASSERT_EQ(a.size(), big);
  EXPECT_EQ(a[0], -128.0f);
  EXPECT_EQ(a[255], 127.0f);
  EXPECT_EQ(a[big - 1], float(int((big - 1) % 256) - 128));
  EXPECT_EQ(f.read_tensor_f32("i16"), (std::vector<float>{-300.0f, 7.0f, 32767.0f}));
}

struct BadCase {
  const char* file;
  ErrorKind kind;
  std::vector<std::string> fragments;
};

TEST(Gguf, MalformedFixturesAreRejected) {
  EXPECT_NO_THROW(GgufFile(kDir + "bad/valid.gguf"));
  const BadCase cases[] = {
      {"bad_magic.gguf", ErrorKind::Format, {"offset 0", "not a GGUF file"}},
      {"empty.gguf", ErrorKind::Format, {"not a GGUF file"}},
      {"version1.gguf", ErrorKind::Unsupported, {"version 1"}},
      {"version4.gguf", ErrorKind::Unsupported, {"version 4"}},
      {"big_endian.gguf", ErrorKind::Unsupported, {"big-endian"}},
      {"bad_tensor_type.gguf", ErrorKind::Unsupported, {"tensor 'weight'", "type id 99"}},
      {"misaligned_offset.gguf", ErrorKind::Format, {"tensor 'weight'", "alignment"}},
      {"offset_out_of_range.gguf", ErrorKind::Format, {"tensor 'weight'", "outside"}},
      {"huge_string.gguf", ErrorKind::Format, {"offset 24", "claims 1099511627776 bytes"}},
      {"huge_kv_count.gguf", ErrorKind::Format, {"metadata count", "cannot fit"}},
      {"truncated_data.gguf", ErrorKind::Format, {"tensor 'bias'", "outside"}},
      {"truncated_header.gguf", ErrorKind::Format, {"truncated"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    std::vector<std::string> fragments = c.fragments;
    fragments.push_back(kDir + "bad/" + c.file);  // every error names the file
    expect_error([&] { GgufFile f(kDir + "bad/" + c.file); }, c.kind, fragments);
  }
  expect_error([&] { GgufFile f(kDir + "bad/no_such_file.gguf"); }, ErrorKind::Io, {"no_such_file.gguf"});
}

TEST(Gguf, EveryTruncationAndByteFlipFailsCleanly) {
  const std::vector<uint8_t> good = testing::read_bytes(kDir + "bad/valid.gguf");
  ASSERT_GT(good.size(), 100u);
  for (size_t n = 0; n < good.size(); n++) {
    std::vector<uint8_t> b(good.begin(), good.begin() + long(n));
    EXPECT_THROW(GgufFile::from_bytes(b, "cut"), Error) << "prefix of " << n << " bytes";
  }
  // Flipped bytes must open or throw qlora::Error, never anything else (nor crash).
  int opened = 0;
  for (size_t i = 0; i < good.size(); i++) {
    std::vector<uint8_t> b = good;
    b[i] ^= 0xff;
    try {
      GgufFile f = GgufFile::from_bytes(b, "flip");
      for (const auto& t : f.tensors())
        if (ggml_type_traits(t.type).can_dequantize) f.read_tensor_f32(t.name);
      opened++;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(opened, 0);  // flips inside tensor data are harmless
}

TEST(Gguf, HeaderAndMetadataErrors) {
  auto base = [] { GgufBuilder b; b.str("general.architecture", "x"); return b; };
  {
    GgufBuilder b = base();
    b.u32("a", 1).u32("a", 2);
    expect_error([&] { from(b); }, ErrorKind::Format, {"key 'a'", "duplicate"});
  }
  {
    GgufBuilder b = base();
    b.kv_raw("weird", 13, {0, 0, 0, 0});
    expect_error([&] { from(b); }, ErrorKind::Format, {"key 'weird'", "unknown value type 13"});
  }
  {
    GgufBuilder b = base();
    b.kv<uint8_t>("flag", testing::kBool, 2);
    expect_error([&] { from(b); }, ErrorKind::Format, {"key 'flag'", "expected 0 or 1"});
  }
  {
    GgufBuilder b = base();
    b.u32("general.alignment", 48);
    expect_error([&] { from(b); }, ErrorKind::Format, {"general.alignment", "power of two"});
  }
  {
    GgufBuilder b = base();
    b.i32("general.alignment", 64);
    expect_error([&] { from(b); }, ErrorKind::Format, {"general.alignment", "u32"});
  }
  {
    GgufBuilder b = base();
    std::vector<uint8_t> v;
    GgufBuilder::put<uint32_t>(v, testing::kU32);
    GgufBuilder::put<uint64_t>(v, uint64_t(1) << 50);
    b.kv_raw("big", testing::kArray, v);
    expect_error([&] { from(b); }, ErrorKind::Format, {"key 'big'", "array claims"});
  }
  {
    GgufBuilder b = base();
    std::vector<uint8_t> v;  // arrays nested 9 deep
    for (int d = 0; d < 9; d++) {
      GgufBuilder::put<uint32_t>(v, testing::kArray);
      GgufBuilder::put<uint64_t>(v, 1);
    }
    GgufBuilder::put<uint32_t>(v, testing::kU8);
    GgufBuilder::put<uint64_t>(v, 1);
    v.push_back(7);
    b.kv_raw("deep", testing::kArray, v);
    expect_error([&] { from(b); }, ErrorKind::Format, {"key 'deep'", "nested deeper"});
  }
  {
    GgufBuilder b = base();
    b.arr_str("tokenizer.ggml.tokens", {"aaaa", "bbbb", "cccc"});
    std::vector<uint8_t> bytes = b.build();
    std::string text(bytes.begin(), bytes.end());
    bytes.resize(text.find("cccc") + 2);  // cut inside the last string
    expect_error([&] { GgufFile::from_bytes(bytes, "cut.gguf"); }, ErrorKind::Format,
                 {"in key 'tokenizer.ggml.tokens'", "claims 4 bytes"});
  }
  {
    GgufBuilder b = base();
    b.version = 0;
    expect_error([&] { from(b); }, ErrorKind::Unsupported, {"version 0"});
  }
  {
    GgufBuilder b = base();
    b.version = 2;  // v2 has the same layout as v3
    EXPECT_EQ(from(b).version(), 2u);
  }
}

TEST(Gguf, TensorInfoErrors) {
  std::vector<float> four{1, 2, 3, 4};
  {
    GgufBuilder b;
    b.tensor_f32("t", {4}, four).tensor_f32("t", {4}, four);
    expect_error([&] { from(b); }, ErrorKind::Format, {"tensor 't'", "duplicate tensor name"});
  }
  {
    GgufBuilder b;
    b.tensor_f32("t", {1, 1, 1, 1, 4}, four);
    expect_error([&] { from(b); }, ErrorKind::Format, {"tensor 't'", "5 dimensions"});
  }
  {
    GgufBuilder b;
    b.tensor_f32("t", {uint64_t(1) << 40, uint64_t(1) << 40}, four);
    expect_error([&] { from(b); }, ErrorKind::Format, {"tensor 't'", "overflows"});
  }
  {
    GgufBuilder b;  // Q4_0 rows must hold whole 32-element blocks
    b.tensor_raw("q", {16, 2}, uint32_t(GgmlType::Q4_0), std::vector<uint8_t>(18, 0));
    expect_error([&] { from(b); }, ErrorKind::Format, {"tensor 'q'", "not a multiple of the Q4_0 block size 32"});
  }
  {
    GgufBuilder b;
    b.tensor_f32("a", {8}, {1, 2, 3, 4, 5, 6, 7, 8}).tensor_raw("b", {4}, 0, std::vector<uint8_t>(16, 0), 0);
    expect_error([&] { from(b); }, ErrorKind::Format, {"overlaps"});
  }
  {
    GgufBuilder b;
    b.tensor_raw("e", {0, 3}, 0, {});  // empty tensors are legal
    GgufFile f = from(b);
    EXPECT_EQ(f.tensor("e").n_elements(), 0);
    EXPECT_TRUE(f.read_tensor_f32("e").empty());
  }
}

}  // namespace
}  // namespace qlora
