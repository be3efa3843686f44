// Pre-quantized checkpoints: the writer reproduces transformers' bitsandbytes-4bit files byte for
// byte, our own layout round-trips, and every inconsistency in a bnb checkpoint is a clear error.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <unistd.h>

#include "core/error.h"
#include "model/bnb_checkpoint.h"
#include "model_test_util.h"

using namespace qlora;
using namespace qlora::testing_util;
namespace fs = std::filesystem;

namespace {

const std::string kBnbDir = fixtures() + "/qlora/llama_gqa_bnb_nf4";

// A checkpoint in memory: name -> (dtype, shape, bytes), and its config.json.
struct Ckpt {
  struct T {
    DType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::map<std::string, T> tensors;
  json config;
};

Ckpt load_ckpt(const std::string& dir) {
  Ckpt c;
  SafetensorsArchive ar(dir);
  for (const auto& n : ar.names()) {
    const TensorInfo& t = ar.get(n);
    c.tensors[n] = {t.dtype, t.shape, std::string(static_cast<const char*>(t.data), size_t(t.nbytes))};
  }
  c.config = read_json_file(dir + "/config.json");
  return c;
}

std::string write_ckpt(const Ckpt& c, const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / ("qlora_qckpt_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  SafetensorsWriter w;
  for (const auto& [n, t] : c.tensors) w.add(n, t.dtype, t.shape, t.bytes.data());
  w.write((d / "model.safetensors").string());
  std::ofstream(d / "config.json") << c.config.dump(2);
  return d.string();
}

const char* kState = "model.layers.1.self_attn.k_proj.weight.quant_state.bitsandbytes__nf4";
const char* kWeight = "model.layers.1.self_attn.k_proj.weight";

json state_of(const Ckpt& c, const std::string& key) { return json::parse(c.tensors.at(key).bytes); }
void set_state(Ckpt& c, const std::string& key, const json& j) {
  c.tensors[key].bytes = j.dump();
  c.tensors[key].shape = {int64_t(c.tensors[key].bytes.size())};
}

// Loads dir as QLoRA (adopting the stored layout) and returns the error it raises.
Error load_error(const std::string& dir, const std::string& precision = "") {
  try {
    auto be = make_cpu_backend();
    ModelSource src = open_model_source(dir);
    ModelPlanOptions po;
    po.base_precision = optional_base_precision(precision, "base_precision");
    po.micro_batch = 1;
    po.seq_len = 4;
    adopt_stored_quantization(po, src.tensors);
    DecoderModel m(src.config, *be, po, fixture_lora());
    m.load_base(src.tensors);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << dir << " loaded without an error";
  return Error(ErrorKind::Internal, "", "");
}

void expect_error(const Error& e, ErrorKind kind, const std::string& where_part, const std::string& what_part) {
  EXPECT_EQ(e.kind(), kind) << e.what();
  EXPECT_NE(e.where().find(where_part), std::string::npos) << e.what();
  EXPECT_NE(e.message().find(what_part), std::string::npos) << e.what();
}

std::vector<QuantizedTensor> quantize_fixture(const QuantParams& p, std::vector<std::string>* names) {
  ModelSource src = open_model_source(fixtures() + "/models/llama_gqa");
  std::vector<QuantizedTensor> out;
  for (int64_t l = 0; l < src.config.n_layer; l++)
    for (const auto& proj : all_linear_targets()) {
      const auto [rows, cols] = projection_shape(src.config, proj);
      std::vector<float> w(size_t(rows * cols));
      const std::string name = hf_weight_name("layers." + std::to_string(l) + "." + proj);
      src.tensors.read_f32(name, {rows, cols}, w.data());
      out.push_back(quantize_ref(w.data(), rows, cols, p));
      names->push_back(name);
    }
  return out;
}

}  // namespace

// Our bitsandbytes writer produces exactly the tensors transformers' save_pretrained wrote for the
// same model (nf4, double quant, blocksize 64): same keys, dtypes, shapes and bytes, quant_state
// JSON text included.
TEST(BnbCheckpoint, WriterReproducesTransformersBytes) {
  QuantParams p;
  p.format = QuantFormat::NF4;
  p.double_quant = true;
  std::vector<std::string> names;
  const auto qs = quantize_fixture(p, &names);
  SafetensorsWriter w;
  for (size_t i = 0; i < qs.size(); i++) add_quantized_weight(w, names[i], qs[i], "float32");
  const fs::path d = fs::temp_directory_path() / ("qlora_bnbwrite_" + std::to_string(::getpid()));
  fs::create_directories(d);
  w.write((d / "q.safetensors").string());
  SafetensorsArchive ours((d / "q.safetensors").string()), ref(kBnbDir);
  int compared = 0;
  for (const auto& n : ref.names()) {
    if (n.find("_proj.weight") == std::string::npos) continue;  // embeddings, norms, head: not quantized
    ASSERT_TRUE(ours.has(n)) << n;
    const TensorInfo &a = ours.get(n), &b = ref.get(n);
    EXPECT_EQ(a.dtype, b.dtype) << n;
    EXPECT_EQ(a.shape, b.shape) << n;
    EXPECT_EQ(std::string(static_cast<const char*>(a.data), size_t(a.nbytes)),
              std::string(static_cast<const char*>(b.data), size_t(b.nbytes)))
        << n;
    compared++;
  }
  EXPECT_EQ(compared, 14 * 6);  // weight, absmax, quant_map, nested_absmax, nested_quant_map, quant_state
  EXPECT_EQ(ours.size(), size_t(compared));
  fs::remove_all(d);
}

TEST(BnbCheckpoint, QuantizationConfigMatchesTransformers) {
  QuantParams p;
  p.format = QuantFormat::NF4;
  p.double_quant = true;
  EXPECT_EQ(quantization_config_json(p, "float32"), read_json_file(kBnbDir + "/config.json")["quantization_config"]);
}

// Python repr() of floats (what json.dumps writes for nested_offset), checked against values whose
// Python spelling is known.
TEST(BnbCheckpoint, PythonFloatRepr) {
  EXPECT_EQ(python_float_repr(double(0.20685851573944092f)), "0.20685851573944092");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1.5), "1.5");
  EXPECT_EQ(python_float_repr(123.0), "123.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e-05), "1e-05");
  EXPECT_EQ(python_float_repr(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1.25e300), "1.25e+300");
  EXPECT_EQ(python_float_repr(0.0), "0.0");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
}

// qlora.cpp's layout for the formats bitsandbytes lacks: written, read back bit for bit.
TEST(QloraCppCheckpoint, EveryFormatRoundTrips) {
  std::vector<QuantParams> ps(5);
  ps[0].format = QuantFormat::NVFP4;
  ps[1].format = QuantFormat::MXFP4;
  ps[2].format = QuantFormat::MXFP8_E4M3;
  ps[3].format = QuantFormat::FP8_E4M3;
  ps[4].format = QuantFormat::FP8_E5M2;
  ps[4].fp8_scaling = Fp8Scaling::Block1x128;
  for (const auto& p : ps) {
    SCOPED_TRACE(quant_format_name(p.format));
    std::vector<std::string> names;
    const auto qs = quantize_fixture(p, &names);
    Ckpt c = load_ckpt(fixtures() + "/models/llama_gqa");
    SafetensorsWriter w;
    for (size_t i = 0; i < qs.size(); i++) add_quantized_weight(w, names[i], qs[i], "float32");
    const fs::path d = fs::temp_directory_path() / ("qlora_ours_" + std::to_string(::getpid()));
    fs::create_directories(d);
    w.write((d / "q.safetensors").string());
    SafetensorsArchive ar((d / "q.safetensors").string());
    json cfg = c.config;
    cfg["quantization_config"] = quantization_config_json(p, "float32");
    auto cq = read_checkpoint_quant(cfg, ar, "config.json");
    ASSERT_TRUE(cq.has_value());
    EXPECT_EQ(cq->method, "qlora_cpp");
    for (size_t i = 0; i < qs.size(); i++) {
      ASSERT_TRUE(is_quantized_weight(ar, *cq, names[i]));
      const QuantizedTensor r = read_quantized_weight(ar, *cq, names[i], qs[i].rows, qs[i].cols);
      EXPECT_EQ(r.data, qs[i].data);
      EXPECT_EQ(r.scales, qs[i].scales);
      EXPECT_EQ(r.scales_f32, qs[i].scales_f32);
    }
    EXPECT_FALSE(is_quantized_weight(ar, *cq, "model.norm.weight"));
    fs::remove_all(d);
  }
}

// ---- Errors: each names the tensor (or config key) at fault and says what disagrees.

TEST(BnbCheckpointErrors, QuantStateShapeDisagreesWithTheModel) {
  Ckpt c = load_ckpt(kBnbDir);
  json j = state_of(c, kState);
  j["shape"] = {64, 64};  // k_proj is (32, 64)
  set_state(c, kState, j);
  expect_error(load_error(write_ckpt(c, "shape")), ErrorKind::Shape, kState, "quant_state shape [64,64] disagrees");
}

TEST(BnbCheckpointErrors, PackedBytesDisagreeWithQuantState) {
  Ckpt c = load_ckpt(kBnbDir);
  auto& t = c.tensors[kWeight];
  t.bytes.resize(t.bytes.size() - 2);
  t.shape = {int64_t(t.bytes.size()), 1};
  expect_error(load_error(write_ckpt(c, "bytes")), ErrorKind::Shape, kWeight, "needs 1024");
}

TEST(BnbCheckpointErrors, BlocksizeThatIsNotABitsandbytesBlocksize) {
  Ckpt c = load_ckpt(kBnbDir);
  json j = state_of(c, kState);
  j["blocksize"] = 48;
  set_state(c, kState, j);
  expect_error(load_error(write_ckpt(c, "bs48")), ErrorKind::Unsupported, kState, "blocksize 48 is not supported");
}

// Every quant_state says 128 but absmax was stored for 64-blocks: the blocks do not divide the
// tensor the way the stored scales say.
TEST(BnbCheckpointErrors, BlocksizeDisagreesWithTheStoredAbsmax) {
  Ckpt c = load_ckpt(kBnbDir);
  for (auto& [n, t] : c.tensors)
    if (n.find(".quant_state.") != std::string::npos) {
      json j = state_of(c, n);
      j["blocksize"] = 128;
      set_state(c, n, j);
    }
  expect_error(load_error(write_ckpt(c, "bs128")), ErrorKind::Format, ".absmax",
               "has 64 entries, but blocksize 128 over 4096 elements makes 32 blocks");
}

TEST(BnbCheckpointErrors, OneTensorWithAnotherBlocksize) {
  Ckpt c = load_ckpt(kBnbDir);
  json j = state_of(c, kState);
  j["blocksize"] = 128;
  set_state(c, kState, j);
  expect_error(load_error(write_ckpt(c, "mixed")), ErrorKind::Format, kState, "blocksize 128");
}

TEST(BnbCheckpointErrors, UnknownQuantStateType) {
  Ckpt c = load_ckpt(kBnbDir);
  auto t = c.tensors.at(kState);
  c.tensors.erase(kState);
  c.tensors[std::string(kWeight) + ".quant_state.bitsandbytes__int4"] = t;
  expect_error(load_error(write_ckpt(c, "int4")), ErrorKind::Unsupported, "bitsandbytes__int4",
               "quant_state type 'bitsandbytes__int4' is not supported");
}

TEST(BnbCheckpointErrors, MissingQuantState) {
  Ckpt c = load_ckpt(kBnbDir);
  c.tensors.erase(kState);
  expect_error(load_error(write_ckpt(c, "nostate")), ErrorKind::Format, kWeight, "without a quant_state");
}

TEST(BnbCheckpointErrors, NonStandardCodeTable) {
  Ckpt c = load_ckpt(kBnbDir);
  auto& t = c.tensors[std::string(kWeight) + ".quant_map"];
  float v = 0.5f;
  std::memcpy(t.bytes.data() + 4 * 3, &v, 4);
  expect_error(load_error(write_ckpt(c, "qmap")), ErrorKind::Unsupported, ".quant_map", "entry 3 is 0.5");
}

TEST(BnbCheckpointErrors, UnsupportedNestedLayout) {
  Ckpt c = load_ckpt(kBnbDir);
  json j = state_of(c, kState);
  j["nested_blocksize"] = 128;
  set_state(c, kState, j);
  expect_error(load_error(write_ckpt(c, "nested")), ErrorKind::Unsupported, kState, "nested_blocksize 128");
}

TEST(BnbCheckpointErrors, MalformedQuantStateJson) {
  Ckpt c = load_ckpt(kBnbDir);
  c.tensors[kState].bytes = "{\"quant_type\": \"nf4\",\n \"blocksize\": }";
  c.tensors[kState].shape = {int64_t(c.tensors[kState].bytes.size())};
  const Error e = load_error(write_ckpt(c, "json"));
  EXPECT_EQ(e.kind(), ErrorKind::Format) << e.what();
  EXPECT_NE(e.where().find(std::string(kState) + "':2:"), std::string::npos) << e.what();  // line 2
}

TEST(BnbCheckpointErrors, EightBitCheckpointsAreRefused) {
  Ckpt c = load_ckpt(kBnbDir);
  c.config["quantization_config"]["load_in_8bit"] = true;
  c.config["quantization_config"]["load_in_4bit"] = false;
  expect_error(load_error(write_ckpt(c, "int8")), ErrorKind::Unsupported, "load_in_8bit", "8-bit (LLM.int8)");
}

TEST(BnbCheckpointErrors, OtherQuantizationMethodsAreRefused) {
  Ckpt c = load_ckpt(kBnbDir);
  c.config["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  expect_error(load_error(write_ckpt(c, "gptq")), ErrorKind::Unsupported, "quant_method", "'gptq' is not supported");
}

// The checks run on the dequantize-on-load path (float base) too.
TEST(BnbCheckpointErrors, FloatBaseHitsTheSameChecks) {
  Ckpt c = load_ckpt(kBnbDir);
  json j = state_of(c, kState);
  j["shape"] = {32, 128};
  set_state(c, kState, j);
  expect_error(load_error(write_ckpt(c, "float"), "fp32"), ErrorKind::Shape, kState, "disagrees");
}
