// The real SmolLM2-135M-Instruct GGUF (Q4_1, dequantized on load to an fp32 base): the chat
// template from the file, our tokenizer and our forward pass against transformers loading the same
// file with gguf_file= (fixture by tools/make_smollm2_logits_fixture.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/decoder_model.h"
#include "text/chat_template.h"
#include "train/model_source.h"
#include "real_models.h"

namespace qlora {
namespace {

using nlohmann::json;

json fixture() {
  std::ifstream in(std::string(QLORA_FIXTURES) + "/gguf/smollm2_logits.json");
  return json::parse(in);
}

// Tolerance: transformers sums in a different order (fp32 GEMMs with other blocking), so logits
// differ by float rounding accumulated over 30 layers; the observed max |diff| over the top-20 of
// every position is 6e-5 (logits span about -10..25) with both the AVX-512 and the AVX2 OpenBLAS
// kernels; the bound is twice that. The top-1 token must agree wherever its margin over the
// runner-up exceeds twice the bound.
constexpr double kAbsTol = 1.2e-4;

TEST(SmolLM2Real, TemplateTokensAndLogitsMatchTransformers) {
  const std::string path = testing_paths::smollm2_gguf();
  if (path.empty()) GTEST_SKIP() << testing_paths::smollm2_skip_reason();
  const json fx = fixture();
  ModelSource src = open_model_source(path);
  ASSERT_TRUE(src.tokenizer);

  std::unique_ptr<Backend> be = make_cpu_backend();
  LoraSpec lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.targets = LoraSpec::resolve_targets({"q_proj"});
  ModelPlanOptions po;
  po.micro_batch = 1;
  po.seq_len = 128;
  DecoderModel model(src.config, *be, po, lora);
  model.load_base(src.tensors);
  model.init_trainable(7);  // B = 0: the adapter adds nothing

  int n_cases = 0;
  for (const json& c : fx["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::string text = c["text"];
    if (c.contains("messages")) {
      const ChatTemplate t = ChatTemplate::from_source(src.tokenizer->chat_template(), "smollm2");
      EXPECT_EQ(t.render(c["messages"], c["add_generation_prompt"].get<bool>()), text);
    }
    const std::vector<int32_t> ids = src.tokenizer->encode(text, false);
    ASSERT_EQ(ids, c["ids"].get<std::vector<int32_t>>());

    const int64_t T = int64_t(ids.size());
    ASSERT_LE(T, po.seq_len);
    std::vector<int32_t> labels(ids.begin(), ids.end());
    const Batch batch = Batch::from_hf(1, T, ids, labels);
    const std::vector<float> lg = model.logits(batch);
    const int64_t V = src.config.vocab_size;
    double max_diff = 0;
    for (int64_t t = 0; t < T; t++) {
      const json& r = c["rows"][size_t(t)];
      const float* row = lg.data() + t * V;
      const auto top_ids = r["top_ids"].get<std::vector<int64_t>>();
      const auto top = r["top_logits"].get<std::vector<double>>();
      for (size_t k = 0; k < top_ids.size(); k++) {
        max_diff = std::max(max_diff, std::abs(row[top_ids[k]] - top[k]));
        EXPECT_NEAR(row[top_ids[k]], top[k], kAbsTol) << "position " << t << " rank " << k;
      }
      const int64_t argmax = std::max_element(row, row + V) - row;
      if (top[0] - top[1] > 2 * kAbsTol) {
        EXPECT_EQ(argmax, top_ids[0]) << "position " << t;
      }
      double m = *std::max_element(row, row + V), s = 0, sum = 0, sq = 0;
      for (int64_t v = 0; v < V; v++) s += std::exp(double(row[v]) - m), sum += row[v], sq += double(row[v]) * row[v];
      EXPECT_NEAR(m + std::log(s), r["logsumexp"].get<double>(), kAbsTol) << "position " << t;
      EXPECT_NEAR(sum, r["sum"].get<double>(), 1e-4 * std::abs(r["sum"].get<double>()) + 0.5) << "position " << t;
      // The row's rms logit (~7) within 1e-5 relative: fp32 parity whatever GEMM kernels OpenBLAS
      // picks (AVX-512 and AVX2 kernels sum in different orders; both stay near 5e-6 here).
      const double rms = std::sqrt(sq / double(V)), ref_rms = std::sqrt(r["sum_sq"].get<double>() / double(V));
      EXPECT_NEAR(rms, ref_rms, 1e-5 * ref_rms) << "position " << t;
    }
    RecordProperty("max_abs_logit_diff_" + c["name"].get<std::string>(), std::to_string(max_diff));
    n_cases++;
  }
  EXPECT_EQ(n_cases, 2);
}

}  // namespace
}  // namespace qlora
