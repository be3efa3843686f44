// Folding a PEFT adapter into the base (model/merge.h): the merged weights, run with no adapter,
// give the logits PEFT computes for base + adapter, from HF, GGUF and bnb-4bit bases; bad adapters
// are refused naming the file and tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/merge.h"
#include "model_test_util.h"

using namespace qlora;
using namespace qlora::testing_util;

namespace {

// Logits of the merged model, run by the engine with a LoRA that adds nothing (B = 0 after init).
std::vector<float> merged_logits(const MergedModel& m, const Batch& b) {
  TensorSource src;
  src.has = [&](const std::string& n) {
    return std::find(m.names().begin(), m.names().end(), n) != m.names().end();
  };
  src.read_f32 = [&](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    EXPECT_EQ(shape, m.shape(n)) << n;
    m.read(n, dst);
  };
  src.description = "merged model";
  auto be = make_cpu_backend();
  ModelPlanOptions po;
  po.micro_batch = b.b;
  po.seq_len = b.t;
  LoraSpec lora = fixture_lora();
  lora.targets = lora_modules(m.config());  // a MoE model's: the attention's
  DecoderModel model(m.config(), *be, po, lora);
  model.load_base(src);
  model.init_trainable(1);
  return model.logits(b);
}

Batch fixture_batch(const SafetensorsArchive& fx) {
  return Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
}

}  // namespace

class MergeParity : public ::testing::TestWithParam<std::string> {};

TEST_P(MergeParity, MergedWeightsGivePeftLogits) {
  const std::string v = GetParam();
  SafetensorsArchive fx(fixtures() + "/parity/" + v + ".safetensors");
  ModelSource src = open_model_source(fixtures() + "/models/" + v);
  MergedModel m(src.config, src.tensors, open_peft_adapter(fixtures() + "/parity/" + v + "_adapter", src.config));
  int merged = 0;
  for (const auto& n : m.names()) merged += m.merged(n);
  // Every adapted module (phi3: 4 fused modules); with LoRA on the experts, each expert's gate, up and
  // down weight its stack's adapter covers.
  const LoraSpec& spec = m.adapter()->spec;
  int64_t per_layer = int64_t(spec.targets.size());
  // (gpt-oss keeps each stack one tensor: one merged tensor per stack.)
  const bool fused = src.config.model_type == "gpt_oss";
  for (const auto& k : spec.expert_targets) per_layer += fused ? 1 : src.config.n_experts * (k == "gate_up_proj" ? 2 : 1);
  // (The expert-LoRA fixtures leave out k_proj, and qwen3_moe_experts o_proj too.)
  EXPECT_EQ(spec.targets.size(), lora_modules(src.config).size() - (spec.expert_targets.empty() ? 0 : fused ? 1 : 2));
  EXPECT_EQ(merged, per_layer * src.config.n_layer);
  const Batch b = fixture_batch(fx);
  // PEFT's logits with the adapter applied; the base alone is far from them.
  EXPECT_LT(rel_err(merged_logits(m, b), floats(fx, "lora_logits")), 2e-5);
  EXPECT_GT(rel_err(floats(fx, "logits"), floats(fx, "lora_logits")), 1e-3);
  MergedModel base_only(src.config, src.tensors, std::nullopt);
  EXPECT_LT(rel_err(merged_logits(base_only, b), floats(fx, "logits")), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Families, MergeParity, ::testing::Values("llama_gqa", "mistral", "qwen2", "llama_tied", "qwen3",
                                                                     "gemma3", "phi3", "gemma2", "mixtral", "qwen3_moe",
                                                                     "phi3_longrope", "qwen3_yarn", "qwen3_moe_norm",
                                                                     "qwen3_moe_experts", "gpt_oss"));

// The same adapter merged into the GGUF of the same model (f32 tensors, Q/K rows permuted the
// llama.cpp way) gives the same logits.
TEST(Merge, FromAGgufBase) {
  SafetensorsArchive fx(fixtures() + "/parity/llama_gqa.safetensors");
  ModelSource src = open_model_source(fixtures() + "/gguf/tiny_llama.gguf");
  MergedModel m(src.config, src.tensors, open_peft_adapter(fixtures() + "/parity/llama_gqa_adapter", src.config));
  EXPECT_LT(rel_err(merged_logits(m, fixture_batch(fx)), floats(fx, "lora_logits")), 2e-5);
}

// A bnb-4bit base is dequantized, then merged: the result equals the dequantized base plus the
// adapter's update exactly as computed from the files.
TEST(Merge, FromABnbNf4BaseAddsTheUpdateToTheDequantizedWeight) {
  ModelSource src = open_model_source(fixtures() + "/qlora/llama_gqa_bnb_nf4");
  ASSERT_TRUE(src.tensors.stored_quant.has_value());
  const PeftAdapter ad = open_peft_adapter(fixtures() + "/parity/llama_gqa_adapter", src.config);
  MergedModel m(src.config, src.tensors, ad);
  MergedModel base(src.config, src.tensors, std::nullopt);
  EXPECT_TRUE(m.base_quantized());
  EXPECT_EQ(m.base_precision().rfind("nf4", 0), 0u) << m.base_precision();
  const std::string name = "model.layers.1.mlp.down_proj.weight";
  const auto w = base.read(name), mw = m.read(name);
  const auto a = ad.weights->read_f32("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight", {ad.spec.r, 160});
  const auto bm = ad.weights->read_f32("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", {64, ad.spec.r});
  double worst = 0, scale = 0;
  for (int64_t o = 0; o < 64; o++)
    for (int64_t i = 0; i < 160; i++) {
      double d = 0;
      for (int64_t k = 0; k < ad.spec.r; k++) d += double(bm[size_t(o * ad.spec.r + k)]) * a[size_t(k * 160 + i)];
      const double want = double(w[size_t(o * 160 + i)]) + double(ad.spec.scale()) * d;
      worst = std::max(worst, std::fabs(double(mw[size_t(o * 160 + i)]) - want));
      scale = std::max(scale, std::fabs(want));
    }
  EXPECT_LT(worst / scale, 1e-7);
  // Norms are not touched.
  EXPECT_EQ(m.read("model.norm.weight"), base.read("model.norm.weight"));
}

TEST(Merge, AdapterErrorsNameFileAndTensor) {
  namespace fs = std::filesystem;
  ModelSource src = open_model_source(fixtures() + "/models/llama_gqa");
  // An adapter for another base (mistral's shapes differ only in ... none here: use qwen2's config
  // with a different rank instead): r mismatch shows as a shape error naming the tensor.
  LlamaConfig other = src.config;
  other.intermediate_size = 96;
  try {
    open_peft_adapter(fixtures() + "/parity/llama_gqa_adapter", other);
    FAIL() << "an adapter for another shape was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Shape);
    EXPECT_NE(e.where().find("adapter_model.safetensors: tensor 'base_model.model.model.layers.0.mlp."),
              std::string::npos) << e.where();
  }
  const fs::path dir = fs::temp_directory_path() / ("qlora_merge_missing_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  try {
    open_peft_adapter(dir.string(), src.config);
    FAIL() << "a directory without adapter files was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.where().find("adapter_config.json"), std::string::npos) << e.where();
  }
  fs::remove_all(dir);
}
