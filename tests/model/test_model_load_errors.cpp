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
    t.model = std::make_unique<LlamaModel>(t.src.config, *t.be, po, fixture_lora());
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
  EXPECT_NE(e.find("gate_proj"), std::string::npos) << e;
  EXPECT_NE(e.find("shape"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(ModelLoadErrors, MissingTensorIsNamed) {
  const std::string d = copy_fixture("missing");
  edit_config(d, [](nlohmann::json& j) { j["num_hidden_layers"] = 3; });
  const std::string e = error_of(d);
  EXPECT_NE(e.find("model.layers.2"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(ModelLoadErrors, TruncatedSafetensorsIsAnError) {
  const std::string d = copy_fixture("trunc");
  fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") / 2);
  const std::string e = error_of(d);
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
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
