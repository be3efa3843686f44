// Bad PEFT adapters (adapter_config.json + adapter_model.safetensors): each error names the file
// and the key or tensor at fault and says what was expected.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/peft_io.h"
#include "model_test_util.h"

using namespace qlora;
using namespace qlora::testing_util;
namespace fs = std::filesystem;

namespace {

const char* kLoraA = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";

// A valid adapter for llama_gqa (r=4, all-linear) in a fresh directory.
struct AdapterFixture {
  TestModel t = make_model("llama_gqa", fixture_lora(), 1, 8);
  std::string dir;
  explicit AdapterFixture(const std::string& tag) {
    dir = (fs::temp_directory_path() / ("qlora_badadapter_" + tag + std::to_string(::getpid()))).string();
    fs::remove_all(dir);
    fs::create_directories(dir);
    write_peft_adapter(dir, *t.model, "llama_gqa");
  }
  ~AdapterFixture() { fs::remove_all(dir); }
  std::string config() const { return dir + "/adapter_config.json"; }
  std::string weights() const { return dir + "/adapter_model.safetensors"; }
  void edit_config(const std::function<void(nlohmann::json&)>& f) const {
    nlohmann::json j;
    std::ifstream(config()) >> j;
    f(j);
    std::ofstream(config()) << j.dump(2);
  }
  // Rewrites adapter_model.safetensors; `edit` may change a tensor's shape or drop it (return false).
  void edit_weights(const std::function<bool(const std::string&, std::vector<int64_t>&)>& edit) const {
    std::string bytes;
    {
      SafetensorsArchive ar(weights());
      std::vector<std::vector<char>> keep;
      SafetensorsWriter w;
      for (const auto& n : ar.names()) {
        const TensorInfo& ti = ar.get(n);
        std::vector<int64_t> shape = ti.shape;
        if (!edit(n, shape)) continue;
        keep.emplace_back(static_cast<const char*>(ti.data), static_cast<const char*>(ti.data) + ti.nbytes);
        w.add(n, ti.dtype, shape, keep.back().data());
      }
      bytes = w.serialize();
    }
    fs::remove(weights());
    std::ofstream(weights(), std::ios::binary) << bytes;
  }
  Error load_error() {
    try {
      load_peft_adapter(dir, *t.model);
    } catch (const Error& e) {
      return e;
    }
    ADD_FAILURE() << dir << " loaded without an error";
    return Error(ErrorKind::Internal, "", "");
  }
};

}  // namespace

TEST(AdapterErrors, ValidAdapterLoads) {
  AdapterFixture a("ok");
  EXPECT_NO_THROW(load_peft_adapter(a.dir, *a.t.model));
}

TEST(AdapterErrors, RankThatDisagreesWithTheModel) {
  AdapterFixture a("rank");
  a.edit_config([](nlohmann::json& j) { j["r"] = 8; });
  Error e = a.load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Config) << e.what();
  EXPECT_EQ(e.where(), a.config());
  EXPECT_NE(e.message().find("adapter has r=8 and 7 target modules; the model was set up with r=4 and 7"),
            std::string::npos)
      << e.what();
}

TEST(AdapterErrors, TensorShapeThatDisagreesWithTheBase) {
  AdapterFixture a("shape");
  a.edit_weights([](const std::string& n, std::vector<int64_t>& shape) {
    if (n == kLoraA) std::swap(shape[0], shape[1]);  // [4, 64] stored as [64, 4]
    return true;
  });
  Error e = a.load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Shape) << e.what();
  EXPECT_EQ(e.where(), a.weights() + ": tensor '" + kLoraA + "'");
  EXPECT_EQ(e.message(), "has shape [64, 4], expected [4, 64]");
}

TEST(AdapterErrors, MissingTensorNamesTheClosest) {
  AdapterFixture a("missing");
  a.edit_weights([](const std::string& n, std::vector<int64_t>&) { return n != kLoraA; });
  Error e = a.load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Format) << e.what();
  EXPECT_EQ(e.where(), std::string("tensor '") + kLoraA + "'");
  EXPECT_NE(e.message().find("not found in " + a.weights()), std::string::npos) << e.what();
}

TEST(AdapterErrors, TargetModulesOfTheWrongJsonType) {
  AdapterFixture a("targets");
  a.edit_config([](nlohmann::json& j) { j["target_modules"] = nlohmann::json::array({"q_proj", 7}); });
  Error e = a.load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Config) << e.what();
  EXPECT_EQ(e.where(), a.config() + ": key 'target_modules[1]'");
  EXPECT_EQ(e.message(), "expected a module name string, got integer 7");
  a.edit_config([](nlohmann::json& j) { j["target_modules"] = {{"q", 1}}; });
  e = a.load_error();
  EXPECT_EQ(e.where(), a.config() + ": key 'target_modules'");
  EXPECT_EQ(e.message(), "expected a list of module names, got object");
}

// A multimodal model's text model: target_modules is the regex that keeps PEFT off the vision
// tower, written by the engine and by PEFT (the fixture's adapter) alike and read back as the names
// it lists; any other regular expression is refused by key.
TEST(AdapterErrors, TextModelTargetRegexReadsBackAndOtherRegexesAreRefused) {
  AdapterFixture a("regex");
  const LoraSpec s = fixture_lora();
  const nlohmann::json j = nlohmann::json::parse(peft_adapter_config_json(s, "gemma3_mm", "gemma3"));
  EXPECT_EQ(j["target_modules"], ".*language_model.*\\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)");
  a.edit_config([&](nlohmann::json& c) { c["target_modules"] = j["target_modules"]; });
  EXPECT_EQ(read_peft_adapter_config(a.config()).targets, s.targets);
  EXPECT_NO_THROW(load_peft_adapter(a.dir, *a.t.model));  // the names, as the model has them
  EXPECT_EQ(read_peft_adapter_config(fixtures() + "/parity/gemma3_mm_adapter/adapter_config.json").targets, s.targets);
  a.edit_config([](nlohmann::json& c) { c["target_modules"] = ".*\\.(q_proj|v_proj)"; });
  Error e = a.load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Unsupported) << e.what();
  EXPECT_EQ(e.where(), a.config() + ": key 'target_modules'");
}

TEST(AdapterErrors, MissingWeightsFileIsNamed) {
  AdapterFixture a("noweights");
  fs::remove(a.weights());
  Error e = a.load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Io) << e.what();
  EXPECT_EQ(e.where(), a.weights());
}
