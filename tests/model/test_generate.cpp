// Decoding with the KV cache (DecoderModel::decode, the training forward with cached keys and values)
// against the training forward over the whole sequence: logits after a prompt and after each
// decoded token equal DecoderModel::logits, with random (non-zero) LoRA B, on float and nf4 bases,
// for every fixture family (GQA + llama3 RoPE, tied + linear RoPE, MQA, qwen2 bias).
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"
#include "model/generate.h"
#include "model_test_util.h"

using namespace qlora;
using namespace qlora::testing_util;

namespace {

// fp32 both ways, the same ops; only the summation order differs (one row against many in each
// GEMM, the attention's key tiles). rel_err = max|a-b| / max(1, max|ref|).
constexpr double kTol = 2e-5;  // rel_err per logit row; ~1e-6 seen (decode vs full forward, both f32)
constexpr int64_t kPrompt = 9, kSteps = 6, kSeq = kPrompt + kSteps;

struct Case {
  std::string variant, precision;  // precision "" = as stored (f32)
  bool rslora = false;
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return i.param.variant + (i.param.precision.empty() ? "" : "_" + i.param.precision) + (i.param.rslora ? "_rslora" : "");
}

TestModel make(const Case& c, int64_t seq_len = kSeq) {
  LoraSpec lora = fixture_lora(c.variant);  // a mixture of experts: the attention (and gpt-oss's expert stacks)
  lora.use_rslora = c.rslora;
  TestModel t;
  t.be = make_cpu_backend();
  t.src = open_model_source(fixtures() + "/models/" + c.variant);
  ModelPlanOptions po;
  adopt_stored_quantization(po, t.src.tensors);  // gpt-oss: its MXFP4 experts as shipped
  po.micro_batch = 1;
  po.seq_len = seq_len;
  po.kv_cache_tokens = kSeq;
  if (!c.precision.empty()) {
    po.method = Method::Qlora;
    po.base_precision = optional_base_precision(c.precision, "base_precision");
  }
  t.model = std::make_unique<DecoderModel>(t.src.config, *t.be, po, lora);
  t.model->load_base(t.src.tensors);
  t.model->init_trainable(7);
  // PEFT inits B to zero, which would make the merge untested: give every B random values.
  Rng rng(11);
  for (auto& p : t.model->trainable_params()) {
    if (p.name.find("lora_B") == std::string::npos) continue;
    std::vector<float> h(size_t(p.w.numel()));
    for (float& x : h) x = rng.uniform(-0.3f, 0.3f);
    t.be->copy_to_device(p.w.data, h.data(), h.size() * 4);
  }
  return t;
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = int32_t(3 + rng.below(uint64_t(vocab - 3)));  // skip pad/bos/eos
  return v;
}

// Row `pos` of DecoderModel::logits over `ids` (one row of length ids.size()).
std::vector<float> ref_row(DecoderModel& m, const std::vector<int32_t>& ids, int64_t pos) {
  const int64_t t = int64_t(ids.size()), V = m.config().vocab_size;
  std::vector<float> all = m.logits(Batch::from_hf(1, t, ids, ids));
  return std::vector<float>(all.begin() + pos * V, all.begin() + (pos + 1) * V);
}

class GenerateParity : public ::testing::TestWithParam<Case> {};

TEST_P(GenerateParity, PrefillAndDecodeLogitsMatchFullForward) {
  TestModel t = make(GetParam());
  DecoderModel& m = *t.model;
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> seq = random_ids(kSeq, V, 3);
  std::vector<float> full = m.logits(Batch::from_hf(1, kSeq, seq, seq));
  auto row = [&](int64_t p) { return std::vector<float>(full.begin() + p * V, full.begin() + (p + 1) * V); };

  Generator gen(m);
  std::vector<int32_t> prompt(seq.begin(), seq.begin() + kPrompt);
  EXPECT_LT(rel_err(gen.feed(prompt), row(kPrompt - 1)), kTol) << "after prefill";
  for (int64_t p = kPrompt; p < kSeq; p++) {
    EXPECT_LT(rel_err(gen.feed({seq[size_t(p)]}), row(p)), kTol) << "decode position " << p;
    EXPECT_EQ(gen.position(), p + 1);
  }

  // A prompt fed in two chunks (the second a multi-token feed on a non-empty cache) gives the same.
  gen.reset();
  gen.feed(std::vector<int32_t>(seq.begin(), seq.begin() + 4));
  EXPECT_LT(rel_err(gen.feed(std::vector<int32_t>(seq.begin() + 4, seq.begin() + kPrompt)), row(kPrompt - 1)), kTol);

  // Non-vacuous: the merged LoRA moves the logits well beyond the tolerance.
  for (auto& p : m.trainable_params())
    if (p.name.find("lora_B") != std::string::npos) t.be->memset0(p.w.data, size_t(p.w.nbytes()));
  Generator base_only(m);
  EXPECT_GT(rel_err(base_only.feed(prompt), row(kPrompt - 1)), 100 * kTol);
}

TEST_P(GenerateParity, GreedyEqualsArgmaxOfRecomputedLogits) {
  TestModel t = make(GetParam());
  DecoderModel& m = *t.model;
  const std::vector<int32_t> prompt = random_ids(kPrompt, m.config().vocab_size, 5);
  Generator gen(m);
  const std::vector<int32_t> out = gen.greedy(prompt, kSteps, {});
  ASSERT_EQ(int64_t(out.size()), kSteps);
  std::vector<int32_t> seq = prompt;
  for (int64_t i = 0; i < kSteps; i++) {
    const int32_t want = argmax_token(ref_row(m, seq, int64_t(seq.size()) - 1));
    EXPECT_EQ(out[size_t(i)], want) << "token " << i;
    seq.push_back(want);
  }
  EXPECT_EQ(gen.greedy(prompt, kSteps, {}), out) << "greedy is deterministic";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateParity,
                         ::testing::Values(Case{"llama_gqa", ""}, Case{"llama_gqa", "nf4"}, Case{"llama_tied", ""},
                                           Case{"llama_tied", "nf4", true}, Case{"mistral", ""},
                                           Case{"qwen2", ""}, Case{"qwen2", "nf4"}, Case{"qwen3", ""}, Case{"qwen3", "nf4", true},
                                           Case{"mistral_sw", ""}, Case{"qwen3_sw", "nf4"},
                                           Case{"mixtral", ""}, Case{"gpt_oss", ""}, Case{"tiny_byte", ""}),
                         case_name);

TEST(Generate, StopIdsEndGeneration) {
  TestModel t = make({"llama_gqa", ""});
  Generator gen(*t.model);
  const std::vector<int32_t> prompt = random_ids(kPrompt, t.model->config().vocab_size, 9);
  const std::vector<int32_t> free_run = gen.greedy(prompt, kSteps, {});
  ASSERT_EQ(int64_t(free_run.size()), kSteps);
  // Stopping at the third token's id: output ends at its first occurrence, stop id included.
  const int32_t stop = free_run[2];
  const size_t first = size_t(std::find(free_run.begin(), free_run.end(), stop) - free_run.begin());
  const std::vector<int32_t> stopped = gen.greedy(prompt, kSteps, {95, stop});
  EXPECT_EQ(stopped, std::vector<int32_t>(free_run.begin(), free_run.begin() + long(first) + 1));
  EXPECT_EQ(stopped.back(), stop);
  // An id that never comes changes nothing; max_new_tokens bounds the output.
  const int32_t absent = [&] {
    for (int32_t id = 3;; id++)
      if (std::find(free_run.begin(), free_run.end(), id) == free_run.end()) return id;
  }();
  EXPECT_EQ(gen.greedy(prompt, kSteps, {absent}), free_run);
  EXPECT_EQ(gen.greedy(prompt, 2, {}), std::vector<int32_t>(free_run.begin(), free_run.begin() + 2));
  EXPECT_TRUE(gen.greedy(prompt, 0, {}).empty());
}

// A prompt longer than the planned rows (seq_len 4) goes through decode in chunks, each attending
// to the cache the chunks before it filled: the same logits as one pass over the whole prompt.
TEST(Generate, LongPromptGoesThroughInChunksOfSeqLen) {
  TestModel whole = make({"llama_gqa", "nf4"}), chunked = make({"llama_gqa", "nf4"}, 4);
  const std::vector<int32_t> prompt = random_ids(kPrompt, whole.model->config().vocab_size, 13);
  const std::vector<float> want = ref_row(*whole.model, prompt, kPrompt - 1);
  Generator gen(*chunked.model);
  EXPECT_LT(rel_err(gen.feed(prompt), want), kTol);
  EXPECT_EQ(gen.position(), kPrompt);
}

// The KV cache bounds prompt + answer: a prompt that fills it is an error before any work, an
// answer stops when the cache is full, and feeding past it is an error naming both sizes.
TEST(Generate, KvCacheCapacityBoundsTheSequence) {
  TestModel t = make({"llama_gqa", ""});
  Generator gen(*t.model);
  ASSERT_EQ(gen.capacity(), kSeq);
  const int64_t V = t.model->config().vocab_size;
  try {
    gen.greedy(random_ids(kSeq, V, 1), 4, {});
    ADD_FAILURE() << "no error for a prompt that fills the cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the prompt of 15 tokens leaves no room in the KV cache of 15 positions"),
              std::string::npos)
        << e.what();
  }
  const std::vector<int32_t> out = gen.greedy(random_ids(kSeq - 3, V, 2), 100, {});
  EXPECT_EQ(int64_t(out.size()), 4);  // 3 free positions: three fed tokens, then the last one
  EXPECT_EQ(gen.position(), kSeq);
  try {
    gen.feed({5});
    ADD_FAILURE() << "no error past the cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("16 tokens does not fit the KV cache of 15"), std::string::npos) << e.what();
  }
}

TEST(Generate, ArgmaxTiesGoToTheLowestId) {
  EXPECT_EQ(argmax_token({0.5f, 2.0f, -1.0f, 2.0f}), 1);
  EXPECT_EQ(argmax_token({-3.0f, -2.0f, -2.0f}), 1);
  EXPECT_EQ(argmax_token({std::nanf(""), 1.0f, 1.0f}), 1);
}

TEST(Generate, BadTokensAreErrors) {
  TestModel t = make({"llama_gqa", ""});
  Generator gen(*t.model);
  EXPECT_THROW(gen.feed({}), Error);
  EXPECT_THROW(gen.feed({3, 96}), Error);  // vocab_size is 96
}

}  // namespace
