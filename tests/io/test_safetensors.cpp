// Safetensors: files written by Python safetensors/transformers load; writer round trip; every error path.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/json_util.h"
#include "tmp_dir.h"

namespace fs = std::filesystem;
using namespace qlora;
using qlora::test::catch_error;
using qlora::test::read_bytes;
using qlora::test::TmpDir;
using qlora::test::write_bytes;

static const std::string kFix = std::string(QLORA_FIXTURES) + "/io";

// A safetensors file from a raw header text (padded to 8 bytes, so the data section is 8-aligned)
// and data bytes.
static std::string st_bytes(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

static std::string f32_bytes(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

// ---------------------------------------------------------------------------------------------------
// Files written by Python

TEST(Safetensors, PythonSingleFileLoads) {
  json expected = read_json_file(kFix + "/py_single.json");
  SafetensorsArchive a(kFix + "/py_single.safetensors");
  EXPECT_EQ(a.size(), expected["tensors"].size());
  EXPECT_EQ(a.metadata().at("format"), "pt");
  EXPECT_EQ(a.metadata().at("note"), "qlora fixture");
  for (const auto& [name, e] : expected["tensors"].items()) {
    SCOPED_TRACE(name);
    const TensorInfo& t = a.get(name);
    EXPECT_EQ(dtype_traits(t.dtype).safetensors, e["dtype"].get<std::string>());
    EXPECT_EQ(t.shape, e["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.nbytes, t.numel() * dtype_size(t.dtype));
    EXPECT_EQ(t.file, kFix + "/py_single.safetensors");
    if (t.dtype == DType::I64) {
      std::vector<int64_t> v(size_t(t.numel()));
      std::memcpy(v.data(), t.data, size_t(t.nbytes));
      EXPECT_EQ(v, e["values"].get<std::vector<int64_t>>());
      continue;
    }
    std::vector<float> got = a.read_f32(name, t.shape);
    std::vector<double> want = e["values"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i++) EXPECT_EQ(got[i], float(want[i])) << "element " << i;  // exact: same rounding
  }
  EXPECT_TRUE(a.get("e.scalar").shape.empty());
  EXPECT_EQ(a.get("f.empty").nbytes, 0);
  EXPECT_EQ(a.names(), (std::vector<std::string>{"a.f32", "b.f16", "c.bf16", "d.i64", "e.scalar", "f.empty"}));
}

TEST(Safetensors, TransformersShardedCheckpointLoads) {
  json expected = read_json_file(kFix + "/sharded_expected.json");
  SafetensorsArchive a(kFix + "/sharded");  // directory -> model.safetensors.index.json
  ASSERT_EQ(a.files().size(), 2u);
  ASSERT_EQ(a.size(), expected["tensors"].size());
  int64_t total = 0;
  for (const auto& [name, e] : expected["tensors"].items()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(a.has(name));
    const TensorInfo& t = a.get(name);
    EXPECT_EQ(t.dtype, DType::BF16);
    total += t.numel();
    std::vector<float> v = a.read_f32(name, e["shape"].get<std::vector<int64_t>>());
    double sum = 0;
    for (float x : v) sum += x;
    EXPECT_NEAR(sum, e["sum"].get<double>(), 1e-3 * (1 + std::fabs(sum)));
    auto first = e["first"].get<std::vector<double>>();
    for (size_t i = 0; i < first.size(); i++) EXPECT_EQ(v[i], float(first[i]));
  }
  EXPECT_EQ(total, expected["n_params"].get<int64_t>());
  // The index file itself and a single shard open too.
  SafetensorsArchive by_index(kFix + "/sharded/model.safetensors.index.json");
  EXPECT_EQ(by_index.names(), a.names());
  SafetensorsArchive one(kFix + "/sharded/model-00002-of-00002.safetensors");
  EXPECT_LT(one.size(), a.size());
  EXPECT_TRUE(one.has("lm_head.weight"));
}

// ---------------------------------------------------------------------------------------------------
// Writer

TEST(Safetensors, WriterRoundTrip) {
  TmpDir tmp;
  std::vector<float> w(6);
  for (size_t i = 0; i < w.size(); i++) w[i] = 0.37f * float(i) - 1.1f;
  std::vector<int64_t> ids = {5, -7, int64_t(1) << 50};
  std::vector<uint8_t> bytes = {1, 2, 3};  // odd count: the tensors after it would be misaligned if placed after
  float scalar = 3.25f;

  SafetensorsWriter wr;
  wr.add("z.weight", DType::F32, {2, 3}, w.data());
  wr.add_from_f32("b.half", DType::F16, {3, 2}, w.data());
  wr.add_from_f32("c.brain", DType::BF16, {6}, w.data());
  wr.add_ref("d.ids", DType::I64, {3}, ids.data());
  wr.add("a.bytes", DType::U8, {3}, bytes.data());
  wr.add("s", DType::F32, {}, &scalar);
  wr.add("e.empty", DType::F32, {0, 5}, nullptr);
  wr.set_metadata({{"format", "pt"}, {"step", "12"}});
  w[0] = 1000.0f;  // add() copied: later changes to the source must not leak into the file
  wr.write(tmp / "out.safetensors");

  SafetensorsArchive a(tmp / "out.safetensors");
  EXPECT_EQ(a.size(), 7u);
  EXPECT_EQ(a.metadata().at("step"), "12");
  std::vector<float> z = a.read_f32("z.weight", {2, 3});
  EXPECT_EQ(z[0], 0.37f * 0 - 1.1f);
  for (size_t i = 1; i < 6; i++) EXPECT_EQ(z[i], w[i]);
  std::vector<float> h = a.read_f32("b.half", {3, 2}), b = a.read_f32("c.brain", {6});
  int rounded = 0;
  for (size_t i = 1; i < 6; i++) {
    EXPECT_EQ(h[i], f16_to_f32(f32_to_f16(w[i])));
    EXPECT_EQ(b[i], bf16_to_f32(f32_to_bf16(w[i])));
    rounded += b[i] != w[i];
  }
  EXPECT_GE(rounded, 3);  // bf16 really was stored (most of these values are not representable)
  std::vector<int64_t> ids_back(3);
  std::memcpy(ids_back.data(), a.get("d.ids").data, 24);
  EXPECT_EQ(ids_back, ids);
  EXPECT_EQ(a.read_f32("s", {})[0], 3.25f);
  EXPECT_EQ(a.get("e.empty").nbytes, 0);

  // Format rules: header length is a multiple of 8, padded with spaces; every tensor is aligned to its
  // element size from the start of the file.
  std::string file = read_bytes(tmp / "out.safetensors");
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(file[8], '{');
  std::string header = file.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
  for (const auto& name : a.names()) {
    const TensorInfo& t = a.get(name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u) << name;
  }
  // serialize() and write() produce the same bytes.
  EXPECT_EQ(wr.serialize(), file);
}

TEST(Safetensors, WriterHeaderIsContiguousAndDeterministic) {
  float v[4] = {1, 2, 3, 4};
  SafetensorsWriter a, b;
  a.add("x", DType::F32, {4}, v);
  a.add("y", DType::BF16, {3}, v);
  b.add("y", DType::BF16, {3}, v);  // insertion order must not matter
  b.add("x", DType::F32, {4}, v);
  EXPECT_EQ(a.serialize(), b.serialize());
  json h = json::parse(a.header().substr(8));
  EXPECT_EQ(h["x"]["data_offsets"], json::parse("[0,16]"));
  EXPECT_EQ(h["y"]["data_offsets"], json::parse("[16,22]"));
  EXPECT_FALSE(h.contains("__metadata__"));
}

TEST(Safetensors, WriterRejectsDuplicatesAndBadShapes) {
  float v = 1;
  SafetensorsWriter w;
  w.add("x", DType::F32, {1}, &v);
  catch_error([&] { w.add("x", DType::F32, {1}, &v); }, ErrorKind::Internal);
  catch_error([&] { w.add("__metadata__", DType::F32, {1}, &v); }, ErrorKind::Internal);
  catch_error([&] { w.add("neg", DType::F32, {-1}, &v); }, ErrorKind::Shape);
}

TEST(Safetensors, WriteIntoMissingDirectoryFails) {
  SafetensorsWriter w;
  float v = 1;
  w.add("x", DType::F32, {1}, &v);
  Error e = catch_error([&] { w.write("/nonexistent-qlora-dir/x.safetensors"); }, ErrorKind::Io);
  EXPECT_NE(std::string(e.what()).find("/nonexistent-qlora-dir/x.safetensors"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------
// Errors while reading

TEST(SafetensorsErrors, MissingFile) {
  Error e = catch_error([] { SafetensorsFile f("/no/such/model.safetensors"); }, ErrorKind::Io);
  EXPECT_EQ(e.where(), "/no/such/model.safetensors");
  catch_error([] { SafetensorsArchive a("/no/such/dir"); }, ErrorKind::Io);
}

TEST(SafetensorsErrors, TooSmallAndHeaderBeyondEof) {
  TmpDir tmp;
  write_bytes(tmp / "tiny.safetensors", "abc");
  Error e = catch_error([&] { SafetensorsFile f(tmp / "tiny.safetensors"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), tmp / "tiny.safetensors");
  EXPECT_EQ(e.message(), "file is 3 bytes, too small for a safetensors header");

  std::string bytes = st_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32_bytes({1}));
  bytes[0] = char(200);  // header length 200 > file
  write_bytes(tmp / "len.safetensors", bytes);
  e = catch_error([&] { SafetensorsFile f(tmp / "len.safetensors"); }, ErrorKind::Format);
  EXPECT_NE(e.message().find("header length 200 exceeds the file size"), std::string::npos) << e.what();
  EXPECT_EQ(e.where(), tmp / "len.safetensors");

  // A lying header length near 2^63: no overflow, no allocation, the same clear error.
  for (int i = 0; i < 7; i++) bytes[i] = char(0xff);
  bytes[7] = char(0x7f);
  write_bytes(tmp / "huge.safetensors", bytes);
  e = catch_error([&] { SafetensorsFile f(tmp / "huge.safetensors"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), tmp / "huge.safetensors");
  EXPECT_EQ(e.message(), "header length 9223372036854775807 exceeds the file size of " + std::to_string(bytes.size()) + " bytes");
}

TEST(SafetensorsErrors, TruncatedFile) {
  TmpDir tmp;
  SafetensorsWriter w;
  std::vector<float> v(16, 0.5f);
  w.add("model.norm.weight", DType::F32, {16}, v.data());
  std::string good = w.serialize();
  write_bytes(tmp / "model.safetensors", good.substr(0, good.size() - 10));
  Error e = catch_error([&] { SafetensorsFile f(tmp / "model.safetensors"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), tmp / "model.safetensors" + ": tensor 'model.norm.weight'");
  EXPECT_EQ(e.message(), "data_offsets [0,64] exceed the file's data section of 54 bytes");
  EXPECT_NE(e.hint().find("truncated"), std::string::npos);
  // Cut inside the header: the header length now points past the end.
  write_bytes(tmp / "cut.safetensors", good.substr(0, 20));
  catch_error([&] { SafetensorsFile f(tmp / "cut.safetensors"); }, ErrorKind::Format);
}

TEST(SafetensorsErrors, InvalidJsonHeader) {
  TmpDir tmp;
  write_bytes(tmp / "bad.safetensors", st_bytes(R"({"x":{"dtype":"F32",)", f32_bytes({1})));
  Error e = catch_error([&] { SafetensorsFile f(tmp / "bad.safetensors"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), tmp / "bad.safetensors" + ": header");
  EXPECT_NE(e.message().find("invalid JSON at byte"), std::string::npos) << e.what();
  write_bytes(tmp / "arr.safetensors", st_bytes("[1,2]", ""));
  catch_error([&] { SafetensorsFile f(tmp / "arr.safetensors"); }, ErrorKind::Format);
}

TEST(SafetensorsErrors, BadEntries) {
  TmpDir tmp;
  struct Case {
    const char* header;
    const char* needle;
  } cases[] = {
      {R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]}})", "span 8 bytes but F32 [2,2] needs 16"},
      {R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", "needs 4"},
      {R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,8]}})", "unknown dtype 'Q4_K'"},
      {R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "not a non-negative integer"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", "begin > end"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", "data_offsets"},
      {R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", "'shape'"},
      {R"({"w":[1,2]})", "expected an object"},
      {R"({"__metadata__":{"step":12}})", "only strings"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.header);
    write_bytes(tmp / "w.safetensors", st_bytes(c.header, f32_bytes({1, 2})));
    Error e = catch_error([&] { SafetensorsFile f(tmp / "w.safetensors"); }, ErrorKind::Format);
    EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
    if (std::string(c.header).find("\"w\"") != std::string::npos) {
      EXPECT_EQ(e.where(), tmp / "w.safetensors" + ": tensor 'w'");
    } else {
      EXPECT_EQ(e.where().rfind(tmp / "w.safetensors", 0), 0u) << e.where();
    }
  }
}

// Lying data_offsets that make two tensors share bytes.
TEST(SafetensorsErrors, OverlappingDataOffsets) {
  TmpDir tmp;
  write_bytes(tmp / "o.safetensors",
              st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       f32_bytes({1, 2, 3})));
  Error e = catch_error([&] { SafetensorsFile f(tmp / "o.safetensors"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), tmp / "o.safetensors" + ": tensor 'b'");
  EXPECT_EQ(e.message(), "data_offsets [4,12] overlap tensor 'a' at [0,8]");
  // Touching spans and empty tensors anywhere are fine.
  write_bytes(tmp / "ok.safetensors",
              st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       f32_bytes({1, 2, 3})));
  EXPECT_NO_THROW({ SafetensorsFile f(tmp / "ok.safetensors"); });
}

TEST(SafetensorsErrors, TensorListedTwice) {
  TmpDir tmp;
  write_bytes(tmp / "d.safetensors",
              st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                       f32_bytes({1, 2})));
  Error e = catch_error([&] { SafetensorsFile f(tmp / "d.safetensors"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), tmp / "d.safetensors" + ": tensor 'a'");
  EXPECT_EQ(e.message(), "is listed twice in the header");
  // The same name inside an entry's own object or in __metadata__ is not a tensor name.
  write_bytes(tmp / "ok.safetensors",
              st_bytes(R"({"__metadata__":{"a":"x"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                       f32_bytes({1, 2})));
  EXPECT_NO_THROW({ SafetensorsFile f(tmp / "ok.safetensors"); });
}

TEST(SafetensorsErrors, NumberTooLargeForADouble) {
  TmpDir tmp;
  write_bytes(tmp / "n.safetensors", st_bytes(R"({"a":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}})", f32_bytes({1})));
  Error e = catch_error([&] { SafetensorsFile f(tmp / "n.safetensors"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), tmp / "n.safetensors" + ": header");
  EXPECT_EQ(e.message(), "invalid JSON: number overflow parsing '1e999'");
}

TEST(SafetensorsErrors, MissingTensorSuggestsClosest) {
  SafetensorsArchive a(kFix + "/sharded");
  Error e = catch_error([&] { a.get("model.layers.0.self_attn.q_proj.weights"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), "tensor 'model.layers.0.self_attn.q_proj.weights'");
  EXPECT_NE(e.message().find(kFix + "/sharded"), std::string::npos);
  EXPECT_NE(e.hint().find("'model.layers.0.self_attn.q_proj.weight'"), std::string::npos) << e.hint();
}

TEST(SafetensorsErrors, ShapeMismatchNamesBothShapes) {
  SafetensorsArchive a(kFix + "/sharded");
  std::vector<float> buf(64 * 16);
  Error e = catch_error([&] { a.read_f32("model.embed_tokens.weight", buf.data(), {16, 64}); }, ErrorKind::Shape);
  EXPECT_NE(e.message().find("[64, 16]"), std::string::npos) << e.what();
  EXPECT_NE(e.message().find("[16, 64]"), std::string::npos) << e.what();
  EXPECT_NE(e.where().find("model.embed_tokens.weight"), std::string::npos);
}

TEST(SafetensorsErrors, IntegerTensorIsNotReadAsFloat) {
  SafetensorsArchive a(kFix + "/py_single.safetensors");
  Error e = catch_error([&] { a.read_f32("d.i64", {5}); }, ErrorKind::Unsupported);
  EXPECT_EQ(e.where(), kFix + "/py_single.safetensors: tensor 'd.i64'");
  EXPECT_EQ(e.message(), "dtype I64 cannot be read as floats here");
  EXPECT_EQ(e.hint(), "expected F32, F16 or BF16");
}

TEST(SafetensorsErrors, MissingShard) {
  TmpDir tmp;
  fs::copy(kFix + "/sharded", tmp / "m");
  fs::remove(tmp / "m/model-00002-of-00002.safetensors");
  Error e = catch_error([&] { SafetensorsArchive a(tmp / "m"); }, ErrorKind::Io);
  EXPECT_EQ(e.where(), tmp / "m/model-00002-of-00002.safetensors");
  EXPECT_NE(e.message().find("model.safetensors.index.json"), std::string::npos);
  EXPECT_NE(e.message().find("missing"), std::string::npos);
}

TEST(SafetensorsErrors, IndexPointsAtWrongShard) {
  TmpDir tmp;
  fs::copy(kFix + "/sharded", tmp / "m");
  json idx = read_json_file(tmp / "m/model.safetensors.index.json");
  idx["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors";
  write_bytes(tmp / "m/model.safetensors.index.json", idx.dump());
  Error e = catch_error([&] { SafetensorsArchive a(tmp / "m"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), "tensor 'lm_head.weight'");
  EXPECT_EQ(e.message(), tmp / "m/model.safetensors.index.json" + " places it in " +
                             (tmp / "m/model-00001-of-00002.safetensors") + ", which lacks it");
  // An index without weight_map.
  write_bytes(tmp / "m/model.safetensors.index.json", R"({"metadata":{}})");
  e = catch_error([&] { SafetensorsArchive a(tmp / "m"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), tmp / "m/model.safetensors.index.json");
  EXPECT_EQ(e.message(), "has no 'weight_map' object");
}

TEST(SafetensorsErrors, DirectoryCases) {
  TmpDir tmp;
  catch_error([&] { SafetensorsArchive a(tmp.path()); }, ErrorKind::Io);  // no .safetensors at all
  // Without an index every *.safetensors is read; the same name twice is an error.
  float v = 1;
  SafetensorsWriter w;
  w.add("x", DType::F32, {1}, &v);
  w.write(tmp / "b.safetensors");
  SafetensorsWriter w2;
  w2.add("y", DType::F32, {1}, &v);
  w2.write(tmp / "a.safetensors");
  SafetensorsArchive ok(tmp.path());
  EXPECT_EQ(ok.files(), (std::vector<std::string>{tmp / "a.safetensors", tmp / "b.safetensors"}));
  EXPECT_EQ(ok.names(), (std::vector<std::string>{"x", "y"}));
  w.write(tmp / "c.safetensors");
  Error e = catch_error([&] { SafetensorsArchive a(tmp.path()); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), "tensor 'x'");
}

TEST(Safetensors, UnalignedHalfTensorReadsCorrectly) {
  // A writer that sorts by name alone can place an F16 tensor at an odd offset.
  TmpDir tmp;
  uint16_t h[2] = {f32_to_f16(1.5f), f32_to_f16(-0.25f)};
  std::string data(1, char(7));
  data.append(reinterpret_cast<const char*>(h), 4);
  write_bytes(tmp / "u.safetensors",
              st_bytes(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F16","shape":[2],"data_offsets":[1,5]}})", data));
  SafetensorsArchive a(tmp / "u.safetensors");
  EXPECT_EQ(a.read_f32("b", {2}), (std::vector<float>{1.5f, -0.25f}));
}

// Streaming (what `qlora merge` does): tensors declared without data give the header of the same
// writer holding the data, and header + each tensor's bytes in data_order_names() order is the
// same file; a writer with declared tensors refuses to serialize them itself.
TEST(SafetensorsWriter, DeclaredTensorsStreamToTheSameFile) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {7, 8};
  const std::vector<uint16_t> c = {0x3f80, 0x4000, 0x4040};
  SafetensorsWriter full, streamed;
  full.add("w.a", DType::F32, {2, 3}, a.data());
  full.add("w.c", DType::BF16, {3}, c.data());
  full.add("w.b", DType::F32, {2}, b.data());
  for (auto* w : {&full, &streamed}) w->set_metadata({{"format", "pt"}});
  streamed.declare("w.c", DType::BF16, {3});
  streamed.declare("w.a", DType::F32, {2, 3});
  streamed.declare("w.b", DType::F32, {2});
  ASSERT_EQ(streamed.header(), full.header());
  ASSERT_EQ(streamed.data_order_names(), (std::vector<std::string>{"w.a", "w.b", "w.c"}));
  std::string bytes = streamed.header();
  bytes.append(reinterpret_cast<const char*>(a.data()), 24);
  bytes.append(reinterpret_cast<const char*>(b.data()), 8);
  bytes.append(reinterpret_cast<const char*>(c.data()), 6);
  EXPECT_EQ(bytes, full.serialize());
  EXPECT_THROW(streamed.serialize(), Error);
}

// The resident memory of one file's mappings, from /proc/self/smaps (their "Rss:" lines), in bytes.
// A mapping's header line starts with its address range ("7f..-7f.. r--p ... /path").
static int64_t mapping_rss(const std::string& path) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool in_file = false;
  int64_t rss = 0;
  while (std::getline(in, line)) {
    const std::string first = line.substr(0, line.find(' '));
    const bool header = first.find('-') != std::string::npos &&
                        first.find_first_not_of("0123456789abcdef-") == std::string::npos;
    if (header)
      in_file = line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
    else if (in_file && line.rfind("Rss:", 0) == 0)
      rss += std::stoll(line.substr(4)) * 1024;
  }
  return rss;
}

// Loading hands each tensor's pages back once it is copied (SafetensorsArchive::release_pages by
// name prefix): that tensor's range leaves the process's resident memory, its neighbour's stays,
// and both read back the same, the released bytes faulted in again from the file. (A kernel that
// maps the file in 2 MiB folios drops the whole folio at the boundary: the bound allows one.)
TEST(Safetensors, ReleasedTensorPagesLeaveTheProcessAndReadBackTheSame) {
  TmpDir dir;
  const int64_t n = 1 << 20;                    // w.weight: 4 MiB of f32; absmax 2 MiB; x.weight 8 MiB
  const int64_t folio = int64_t(2) << 20;
  std::string data(size_t(n) * 14, '\0');
  for (int64_t i = 0; i < int64_t(data.size()) / 4; i++) {
    const float v = float(i % 1000) * 0.5f + (i >= n * 3 / 2 ? 1000.0f : 0.0f);
    std::memcpy(data.data() + i * 4, &v, 4);
  }
  const std::string file = dir / "big.safetensors";
  write_bytes(file, st_bytes(R"({"w.weight":{"dtype":"F32","shape":[1024,1024],"data_offsets":[0,4194304]},)"
                             R"("w.weight.absmax":{"dtype":"F32","shape":[1024,512],"data_offsets":[4194304,6291456]},)"
                             R"("x.weight":{"dtype":"F32","shape":[2048,1024],"data_offsets":[6291456,14680064]}})",
                             data));
  SafetensorsArchive a(file);
  const std::string real = fs::canonical(file).string();
  const std::vector<float> w = a.read_f32("w.weight", {1024, 1024});
  const std::vector<float> s = a.read_f32("w.weight.absmax", {1024, 512});
  const std::vector<float> x = a.read_f32("x.weight", {2048, 1024});
  EXPECT_GE(mapping_rss(real), n * 14) << "reading touched every page";
  a.release_pages("w.weight");  // the weight and its state
  const int64_t left = mapping_rss(real);
  EXPECT_LE(left, n * 8 + 4096) << "w.weight and w.weight.absmax left the process";
  EXPECT_GE(left, n * 8 - folio) << "x.weight stayed (but for the folio it shares with its neighbour)";
  EXPECT_EQ(a.read_f32("w.weight", {1024, 1024}), w);
  EXPECT_EQ(a.read_f32("w.weight.absmax", {1024, 512}), s);
  EXPECT_EQ(a.read_f32("x.weight", {2048, 1024}), x);
  EXPECT_EQ(w[1001], 0.5f);
  EXPECT_EQ(x[0], float((3 * n / 2) % 1000) * 0.5f + 1000.0f);
}
