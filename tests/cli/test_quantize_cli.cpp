// `qlora quantize`: nf4 output equals the checkpoint transformers + bitsandbytes save, other formats
// load back into the engine unchanged, perplexity before/after, and bad arguments fail cleanly.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli_util.h"
#include "io/safetensors.h"
#include "model/decoder_model.h"
#include "train/model_source.h"

using namespace qlora;
using namespace qlora::cli_test;
namespace fs = std::filesystem;

namespace {

const std::string kFix = QLORA_FIXTURES;
const std::string kModel = kFix + "/models/llama_gqa";

std::string bytes_of(const TensorInfo& t) { return std::string(static_cast<const char*>(t.data), size_t(t.nbytes)); }

std::vector<float> engine_logits(const std::string& dir, const std::string& precision) {
  auto be = make_cpu_backend();
  ModelSource src = open_model_source(dir);
  ModelPlanOptions po;
  po.base_precision = optional_base_precision(precision, "base_precision");
  po.double_quant = false;  // as `qlora quantize` without --double-quant
  po.micro_batch = 2;
  po.seq_len = 12;
  adopt_stored_quantization(po, src.tensors);
  LoraSpec lora;
  lora.r = 4;
  lora.targets = LoraSpec::resolve_targets({"all-linear"});
  DecoderModel m(src.config, *be, po, lora);
  m.load_base(src.tensors);
  m.init_trainable(1);  // B = 0: the adapter adds nothing
  EXPECT_TRUE(m.quantized_base()) << dir;
  std::vector<int32_t> ids(24);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = int32_t((i * 37 + 5) % 96);
  return m.logits(Batch::from_hf(2, 12, ids, ids));
}

}  // namespace

// nf4 + double quant: every tensor of the output equals what transformers' save_pretrained wrote
// for this model quantized by bitsandbytes (tests/fixtures/qlora/llama_gqa_bnb_nf4), unquantized
// tensors included; config.json carries the same quantization_config.
TEST(QuantizeCli, Nf4OutputEqualsTheTransformersCheckpoint) {
  const std::string out = temp_dir("quant_nf4") + "/out";
  RunResult r = run_qlora("quantize --model " + kModel + " --quant nf4 --double-quant --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("layer 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("layer 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("total"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rmse"), std::string::npos) << r.output;
  SafetensorsArchive ours(out), ref(kFix + "/qlora/llama_gqa_bnb_nf4");
  EXPECT_EQ(ours.names(), ref.names());
  for (const auto& n : ref.names()) {
    if (!ours.has(n)) continue;
    EXPECT_EQ(ours.get(n).dtype, ref.get(n).dtype) << n;
    EXPECT_EQ(ours.get(n).shape, ref.get(n).shape) << n;
    EXPECT_EQ(bytes_of(ours.get(n)), bytes_of(ref.get(n))) << n;
  }
  auto cfg = nlohmann::json::parse(read_file(out + "/config.json"));
  auto ref_cfg = nlohmann::json::parse(read_file(kFix + "/qlora/llama_gqa_bnb_nf4/config.json"));
  EXPECT_EQ(cfg["quantization_config"], ref_cfg["quantization_config"]);
  auto src_cfg = nlohmann::json::parse(read_file(kModel + "/config.json"));
  for (const auto& [k, v] : src_cfg.items()) EXPECT_EQ(cfg[k], v) << k;  // the rest of config.json is kept
}

// nvfp4, mxfp4 and fp8 use our layout: loaded back, the engine computes exactly what it computes
// when it quantizes the original model itself at load.
TEST(QuantizeCli, OwnLayoutsLoadBackIntoTheEngine) {
  for (const std::string q : {"nvfp4", "mxfp4", "fp8", "fp4"}) {
    SCOPED_TRACE(q);
    const std::string out = temp_dir("quant_" + q) + "/out";
    RunResult r = run_qlora("quantize --model " + kModel + " --quant " + q + " --out " + out);
    ASSERT_EQ(r.code, 0) << r.output;
    auto cfg = nlohmann::json::parse(read_file(out + "/config.json"));
    EXPECT_EQ(cfg["quantization_config"]["quant_method"], q == "fp4" ? "bitsandbytes" : "qlora_cpp");
    EXPECT_EQ(engine_logits(out, ""), engine_logits(kModel, q));
  }
}

// --eval-text: perplexity of the original model on the text equals exp(transformers' loss) on the
// same tokens (tests/fixtures/parity/tiny_byte.safetensors); after quantization it is close but not
// equal.
TEST(QuantizeCli, EvalTextPrintsPerplexityBeforeAndAfter) {
  SafetensorsArchive fx(kFix + "/parity/tiny_byte.safetensors");
  const TensorInfo& ids = fx.get("input_ids");
  std::vector<int32_t> v(size_t(ids.numel()));
  std::memcpy(v.data(), ids.data, size_t(ids.nbytes));
  ASSERT_EQ(v[0], 256);  // BOS, then raw bytes
  std::string text;
  for (size_t i = 1; i < v.size(); i++) text += char(v[i]);
  const std::string dir = temp_dir("quant_eval");
  std::ofstream(dir + "/eval.txt", std::ios::binary) << text;
  float loss;
  std::memcpy(&loss, fx.get("loss").data, 4);

  RunResult r = run_qlora("quantize --model " + kFix + "/models/tiny_byte --quant nf4 --double-quant --out " + dir +
                          "/out --eval-text " + dir + "/eval.txt --eval-seq-len 64 --threads 1");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto at = r.output.find("perplexity on ");
  ASSERT_NE(at, std::string::npos) << r.output;
  double before = 0, after = 0;
  ASSERT_EQ(std::sscanf(r.output.c_str() + r.output.find("before", at), "before %lf after %lf", &before, &after), 2)
      << r.output;
  EXPECT_NEAR(before, std::exp(double(loss)), 1e-3 * before);
  EXPECT_NE(after, before);
  EXPECT_LT(std::fabs(after / before - 1.0), 0.25) << "nf4 should cost a few percent of perplexity, not more";
  EXPECT_TRUE(fs::exists(dir + "/out/model.safetensors"));
}

TEST(QuantizeCli, BadArgumentsFailWithoutWritingAnything) {
  const std::string dir = temp_dir("quant_bad");
  struct Case { std::string args, says; };
  for (const Case& c : {Case{"--quant nf5", "did you mean 'nf4'"},
                        Case{"--quant nvfp4 --double-quant", "double quantization is defined for nf4 and fp4 only"},
                        Case{"--quant mxfp4 --blocksize 64", "--blocksize applies to nf4 and fp4 only"},
                        Case{"--quant nf4 --blocksize 48", "blocksize 48 is not supported"},
                        Case{"--quant nf4 --eval-text " + dir + "/missing.txt", "missing.txt"}}) {
    RunResult r = run_qlora("quantize --model " + kModel + " " + c.args + " --out " + dir + "/out");
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(dir + "/out")) << c.args;
  }
  RunResult r = run_qlora("quantize --model " + dir + "/nope --quant nf4 --out " + dir + "/out");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  // Phi-3's fused qkv_proj / gate_up_proj: the output would name projections transformers lacks.
  r = run_qlora("quantize --model " + kFix + "/models/phi3 --quant nf4 --out " + dir + "/out");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("fused projections"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/out"));
  // Gemma 3 as shipped: the output would lose the vision tower.
  r = run_qlora("quantize --model " + kFix + "/models/gemma3_mm --quant nf4 --out " + dir + "/out");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("vision tower would be lost"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

// Recorded by tools/make_qlora_fixtures.py --check-quantize: transformers + bitsandbytes loaded the
// output of this binary and dequantized exactly the weights bitsandbytes itself produces.
TEST(QuantizeCli, TransformersLoadedOurOutput) {
  auto j = nlohmann::json::parse(read_file(kFix + "/qlora/quantize_check.json"));
  for (const char* tag : {"nf4_double_quant", "fp4"}) {
    const auto& r = j["results"][tag];
    EXPECT_EQ(r["exit_code"], 0) << tag;
    EXPECT_EQ(r["loads"], true) << tag;
    EXPECT_EQ(r["same_modules"], true) << tag;
    EXPECT_EQ(r["n_quantized_linears"], 14) << tag;
    EXPECT_EQ(r["max_abs_diff"], 0.0) << tag;
    EXPECT_EQ(r["logits_max_abs_diff"], 0.0) << tag;
  }
}
