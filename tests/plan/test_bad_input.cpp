// Bad input: every impossible or unknown option is an Error naming the option, with a hint; a
// sequence past the model's positions is a warning explaining RoPE scaling.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "plan/model_presets.h"
#include "plan/planner.h"

using namespace qlora;

namespace {

PlanRequest request(const std::string& method = "lora") {
  PlanRequest r;
  r.model = preset_config("llama3-8b");
  r.model_label = "llama3-8b";
  r.gpu = resolve_gpu("h100");
  r.method = parse_method(method, "method");
  return r;
}

// The Error thrown by f (kind + full message), or fails the test when none is thrown.
std::pair<ErrorKind, std::string> error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.kind(), e.what()};
  }
  ADD_FAILURE() << "no qlora::Error thrown";
  return {ErrorKind::Internal, ""};
}

void expect_config_error(const PlanRequest& r, const std::string& needle, const std::string& hint_needle) {
  auto [kind, msg] = error_of([&] { make_plan(r); });
  EXPECT_EQ(kind, ErrorKind::Config) << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  EXPECT_NE(msg.find(hint_needle), std::string::npos) << msg;
}

}  // namespace

TEST(BadInput, ImpossibleMethodPrecisionCombinations) {
  PlanRequest r = request("qlora");
  r.base_precision = BasePrecision::Bf16;
  expect_config_error(r, "QLoRA needs a quantized frozen base", "--method lora");
  r = request("lora");
  r.base_precision = BasePrecision::Nf4;
  expect_config_error(r, "is QLoRA, not LoRA", "--method qlora --base-precision nf4");
  r = request("full");
  r.base_precision = BasePrecision::Nf4;
  expect_config_error(r, "full fine-tuning trains fp32 weights, or bf16", "--method qlora");
  r = request("qlora");
  r.base_precision = BasePrecision::Nvfp4;
  r.double_quant = true;
  expect_config_error(r, "double quantization applies to the bitsandbytes formats", "drop --double-quant");
  r = request("qlora");
  r.quant_blocksize = 48;
  expect_config_error(r, "power of two", "64");
}

TEST(BadInput, UnknownValuesSuggestTheClosest) {
  // The modes are types: each spelling is checked where it is parsed, once (model/modes.h).
  auto expect_parse_error = [](const std::function<void()>& parse, const std::string& needle, const std::string& hint) {
    auto [kind, msg] = error_of(parse);
    EXPECT_EQ(kind, ErrorKind::Config) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find(hint), std::string::npos) << msg;
  };
  expect_parse_error([] { parse_method("lorra", "--method"); }, "unknown value 'lorra'", "did you mean 'lora'");
  expect_parse_error([] { parse_base_precision("nf5", "--base-precision"); }, "unknown value 'nf5'", "did you mean 'nf4'");
  expect_parse_error([] { parse_checkpointing("ful", "--checkpointing"); }, "unknown value 'ful'", "did you mean 'full'");
  expect_parse_error([] { parse_gemm_dtype("fp16", "--gemm-dtype"); }, "unknown value 'fp16'", "did you mean 'bf16'");
  expect_parse_error([] { parse_optimizer_dtype("fp16", "--optimizer-dtype"); }, "unknown value 'fp16'",
                     "choose one of fp32, bf16");
  expect_parse_error([] { parse_sharding("zero4", "--sharding"); }, "unknown value 'zero4'", "did you mean 'zero");
  PlanRequest r = request();
  r.lora.targets = {"q_proj", "v_prj"};
  expect_config_error(r, "unknown value 'v_prj'", "did you mean 'v_proj'");
}

TEST(BadInput, DeviceCannotRunTheGemmDtype) {
  PlanRequest r = request("qlora");
  r.gpu = resolve_gpu("a100");
  r.gemm_dtype = GemmDtype::Fp8;
  expect_config_error(r, "has no fp8 tensor cores", "--gemm-dtype bf16");
  r.gpu = resolve_gpu("h100");
  r.gemm_dtype = GemmDtype::Fp4;
  expect_config_error(r, "has no fp4 tensor cores", "or fp8");
}

TEST(BadInput, NonPositiveSizes) {
  PlanRequest r = request();
  r.micro_batch = 0;
  expect_config_error(r, "must be at least 1", "");
  r = request();
  r.seq_len = -5;
  expect_config_error(r, "--seq-len -5", "");
  r = request();
  r.topo.nodes = 0;
  expect_config_error(r, "--nodes", "");
  r = request();
  r.avg_doc_len = 4096;  // longer than the 2048-token sequences
  expect_config_error(r, "exceeds --seq-len 2048", "raise --seq-len");
}

TEST(BadInput, UnknownModelListsPresetsAndSuggests) {
  auto [kind, msg] = error_of([] { resolve_model("llama3-80b"); });
  EXPECT_EQ(kind, ErrorKind::Config);
  EXPECT_NE(msg.find("unknown model 'llama3-80b'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'llama3-8b'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("known presets: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama3.1-405b"), std::string::npos) << msg;
  auto [kind2, msg2] = error_of([] { resolve_model("/no/such/dir/config.json"); });
  EXPECT_EQ(kind2, ErrorKind::Io) << msg2;
  const auto dir = std::filesystem::temp_directory_path() / "qlora_plan_empty_model_dir";
  std::filesystem::create_directories(dir);
  auto [kind3, msg3] = error_of([&] { resolve_model(dir.string()); });
  EXPECT_EQ(kind3, ErrorKind::Io);
  EXPECT_NE(msg3.find("neither config.json nor a .gguf"), std::string::npos) << msg3;
  std::filesystem::remove_all(dir);
}

// Past max_position_embeddings the plan still computes (memory does not depend on RoPE) but warns.
TEST(BadInput, SequenceBeyondMaxPositionWarnsAboutRope) {
  PlanRequest r = request();
  r.seq_len = 16384;  // llama3-8b: 8192 positions, no RoPE scaling
  PlanResult p = make_plan(r);
  ASSERT_FALSE(p.warnings.empty());
  const std::string& w = p.warnings[0];
  EXPECT_NE(w.find("exceeds llama3-8b's max_position_embeddings 8192"), std::string::npos) << w;
  EXPECT_NE(w.find("rope_scaling"), std::string::npos) << w;
  EXPECT_NE(w.find("\"factor\": 2.0"), std::string::npos) << w;
  r.seq_len = 8192;
  EXPECT_TRUE(make_plan(r).warnings.empty());
  // A model that already scales RoPE (llama3.1: factor 8 to 131072) is told how far to go.
  r.model = preset_config("llama3.1-8b");
  r.model_label = "llama3.1-8b";
  r.seq_len = 262144;
  r.checkpointing = Checkpointing::Full;
  p = make_plan(r);
  ASSERT_FALSE(p.warnings.empty());
  EXPECT_NE(p.warnings[0].find("already applies llama3 RoPE scaling (factor 8.0)"), std::string::npos) << p.warnings[0];
  EXPECT_NE(p.warnings[0].find("factor about 16.0"), std::string::npos) << p.warnings[0];
}

TEST(ModelSource, ConfigJsonDirectoryAndFile) {
  const std::string dir = std::string(QLORA_FIXTURES) + "/models/llama_gqa";
  LlamaConfig a = resolve_model(dir);
  LlamaConfig b = resolve_model(dir + "/config.json");
  EXPECT_GT(a.hidden_size, 0);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.n_layer, b.n_layer);
  // And it plans: a config.json is as good as a preset.
  PlanRequest r = request();
  r.model = a;
  r.model_label = dir;
  r.seq_len = 64;
  EXPECT_TRUE(make_plan(r).fits);
}

// A GGUF header gives the same plan as the HF config it was converted from (fixture README).
TEST(ModelSource, GgufHeaderPlansLikeItsHfConfig) {
  PlanRequest hf = request(), gg = request();
  hf.model = resolve_model(std::string(QLORA_FIXTURES) + "/models/llama_gqa");
  gg.model = resolve_model(std::string(QLORA_FIXTURES) + "/gguf/tiny_llama.gguf");
  EXPECT_EQ(gg.model.n_layer, 2);
  EXPECT_EQ(gg.model.hidden_size, 64);
  hf.seq_len = gg.seq_len = 64;
  const PlanResult a = make_plan(hf), b = make_plan(gg);
  EXPECT_EQ(a.total_bytes, b.total_bytes);
  EXPECT_EQ(a.categories, b.categories);
}
