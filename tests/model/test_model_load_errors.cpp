// Bad model directories give clear errors naming the file and the tensor, never a crash.
#include <gtest/gtest.h>

#include <functional>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model_test_util.h"

using namespace qlora;
using namespace qlora::testing_util;
namespace fs = std::filesystem;

namespace {

std::string copy_fixture(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("qlora_badmodel_" + name + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  for (const auto& e : fs::directory_iterator(fixtures() + "/models/llama_gqa")) fs::copy(e.path(), d / e.path().filename());
  return d.string();
}

std::string error_of(const std::string& dir) {
  try {
    TestModel t;
    t.be = make_cpu_backend();
    t.src = open_model_source(dir);
    ModelPlanOptions po;
    po.micro_batch = 1;
    po.seq_len = 8;
    t.model = std::make_unique<DecoderModel>(t.src.config, *t.be, po, fixture_lora());
    t.model->load_base(t.src.tensors);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& f) {
  nlohmann::json j;
  std::ifstream(dir + "/config.json") >> j;
  f(j);
  std::ofstream(dir + "/config.json") << j.dump();
}

}  // namespace

TEST(ModelLoadErrors, ShapeThatDisagreesWithConfigNamesTheTensor) {
  const std::string d = copy_fixture("shape");
  edit_config(d, [](nlohmann::json& j) { j["intermediate_size"] = 128; });
  const std::string e = error_of(d);
  // The file, the tensor, what it holds and what config.json implies.
  EXPECT_NE(e.find(d + "/model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("has shape [160, 64], expected [128, 64]"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(ModelLoadErrors, MissingTensorIsNamed) {
  const std::string d = copy_fixture("missing");
  edit_config(d, [](nlohmann::json& j) { j["num_hidden_layers"] = 3; });
  const std::string e = error_of(d);
  EXPECT_NE(e.find("tensor 'model.layers.2."), std::string::npos) << e;
  EXPECT_NE(e.find("not found in " + d), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(ModelLoadErrors, TruncatedSafetensorsIsAnError) {
  const std::string d = copy_fixture("trunc");
  fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") / 2);
  const std::string e = error_of(d);
  EXPECT_NE(e.find(d + "/model.safetensors: tensor '"), std::string::npos) << e;
  EXPECT_NE(e.find("exceed the file's data section of"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(ModelLoadErrors, UnsupportedModelTypeListsSupported) {
  const std::string d = copy_fixture("type");
  edit_config(d, [](nlohmann::json& j) { j["model_type"] = "gpt_neox"; });
  const std::string e = error_of(d);
  EXPECT_NE(e.find("gpt_neox"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen2"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(ModelLoadErrors, MissingConfigJson) {
  const std::string d = copy_fixture("noconfig");
  fs::remove(d + "/config.json");
  const std::string e = error_of(d);
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(ModelLoadErrors, InvalidConfigJsonNamesLineAndColumn) {
  const std::string d = copy_fixture("badjson");
  std::ofstream(d + "/config.json") << "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 64,,\n}";
  const std::string e = error_of(d);
  EXPECT_NE(e.find(d + "/config.json:3:21"), std::string::npos) << e;
  EXPECT_NE(e.find("invalid JSON"), std::string::npos) << e;
  fs::remove_all(d);
}

// A weight stored in a dtype the loader cannot turn into floats (here I32 bytes of the right size).
TEST(ModelLoadErrors, WeightInAnUnusableDtypeNamesTensorAndDtype) {
  const std::string d = copy_fixture("dtype");
  {
    SafetensorsArchive ar(d + "/model.safetensors");
    std::vector<std::vector<char>> keep;
    SafetensorsWriter w;
    for (const auto& n : ar.names()) {
      const TensorInfo& t = ar.get(n);
      keep.emplace_back(static_cast<const char*>(t.data), static_cast<const char*>(t.data) + t.nbytes);
      w.add(n, n == "model.norm.weight" ? DType::I32 : t.dtype, t.shape, keep.back().data());
    }
    const std::string bytes = w.serialize();
    fs::remove(d + "/model.safetensors");  // the archive maps the old file; write a new one
    std::ofstream(d + "/model.safetensors", std::ios::binary) << bytes;
  }
  const std::string e = error_of(d);
  EXPECT_NE(e.find(d + "/model.safetensors: tensor 'model.norm.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("dtype I32 cannot be read as floats"), std::string::npos) << e;
  fs::remove_all(d);
}

// The index of a sharded checkpoint sends a tensor to a shard that does not hold it.
TEST(ModelLoadErrors, ShardedIndexPlacesATensorInTheWrongShard) {
  const fs::path d = fs::temp_directory_path() / ("qlora_badmodel_index" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::copy(fixtures() + "/models/llama_gqa_sharded", d);
  const std::string idx = (d / "model.safetensors.index.json").string();
  nlohmann::json j;
  std::ifstream(idx) >> j;
  std::string moved, to;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it)
    if (it.key() == "model.norm.weight") moved = it.value().get<std::string>();
  ASSERT_FALSE(moved.empty());
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it)
    if (it.value().get<std::string>() != moved) to = it.value().get<std::string>();
  ASSERT_FALSE(to.empty());
  j["weight_map"]["model.norm.weight"] = to;
  std::ofstream(idx) << j.dump();
  const std::string e = error_of(d.string());
  EXPECT_NE(e.find("tensor 'model.norm.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find(idx + " places it in " + (d / to).string() + ", which lacks it"), std::string::npos) << e;
  fs::remove_all(d);
}

// The CPU backend multiplies in f32, so a base held in bf16 (or fp16) is refused before anything is
// allocated, naming the option and what it takes instead.
TEST(ModelLoadErrors, Bf16BaseOnTheCpuIsRefusedByName) {
  for (const BasePrecision b : {BasePrecision::Bf16, BasePrecision::Fp16}) {
    auto be = make_cpu_backend();
    const ModelSource src = open_model_source(fixtures() + "/models/llama_gqa");
    ModelPlanOptions po;
    po.micro_batch = 1;
    po.seq_len = 8;
    po.base_precision = b;
    try {
      DecoderModel m(src.config, *be, po, fixture_lora());
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Unsupported) << e.what();
      EXPECT_EQ(e.where(), std::string("base_precision ") + base_precision_name(b));
      EXPECT_NE(std::string(e.what()).find("nf4"), std::string::npos) << e.what();
    }
  }
}
