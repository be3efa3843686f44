// Fit searches: the limits found are tight (fits at the limit, not one step past it) and the
// fastest configuration fits and beats the configurations it was chosen over.
#include <gtest/gtest.h>

#include "plan/fit.h"

using namespace qlora;

namespace {

PlanRequest request(const std::string& model, const std::string& gpu, const std::string& method) {
  PlanRequest r;
  r.model = preset_config(model);
  r.model_label = model;
  r.gpu = resolve_gpu(gpu);
  r.method = parse_method(method, "method");
  return r;
}

}  // namespace

TEST(Fit, MaxSeqLenIsTight) {
  for (const char* ck : {"none", "full"}) {
    PlanRequest r = request("llama3-8b", "h100", "qlora");
    r.checkpointing = parse_checkpointing(ck, "checkpointing");
    const int64_t T = max_seq_len_that_fits(r);
    ASSERT_GT(T, 2048) << ck;
    EXPECT_EQ(T % 128, 0);
    r.seq_len = T;
    EXPECT_TRUE(make_plan(r).fits) << ck;
    r.seq_len = T + 128;
    EXPECT_FALSE(make_plan(r).fits) << ck;
  }
  // Checkpointing buys context: perf_anchors §10 puts 8B activations at ~4 MB/token without it.
  PlanRequest r = request("llama3-8b", "h100", "qlora");
  const int64_t none = max_seq_len_that_fits(r);
  r.checkpointing = Checkpointing::Full;
  EXPECT_GT(max_seq_len_that_fits(r), 3 * none);
}

TEST(Fit, MaxMicroBatchIsTight) {
  PlanRequest r = request("llama3-70b", "h200", "qlora");
  r.checkpointing = Checkpointing::Full;
  const int64_t b = max_micro_batch_that_fits(r);
  ASSERT_GT(b, 0);
  r.micro_batch = b;
  EXPECT_TRUE(make_plan(r).fits);
  r.micro_batch = b + 1;
  EXPECT_FALSE(make_plan(r).fits);
}

TEST(Fit, NothingFitsGivesZero) {
  PlanRequest r = request("llama3-70b", "rtx4090", "full");
  EXPECT_EQ(max_seq_len_that_fits(r), 0);
  EXPECT_EQ(max_micro_batch_that_fits(r), 0);
  FitReport f = fit_search(r);
  EXPECT_FALSE(f.has_fastest);
  EXPECT_EQ(f.fitting, 0);
}

TEST(Fit, FastestKeepsTheBatchAndBeatsTheRequest) {
  PlanRequest r = request("llama3-8b", "h100", "qlora");
  r.micro_batch = 1;
  r.grad_accum = 8;
  r.checkpointing = Checkpointing::Full;
  const PlanResult asked = make_plan(r);
  ASSERT_TRUE(asked.fits);
  FitReport f = fit_search(r);
  ASSERT_TRUE(f.has_fastest);
  EXPECT_TRUE(f.fastest.result.fits);
  EXPECT_EQ(f.fastest.req.micro_batch * f.fastest.req.grad_accum, 8);  // same sequences per step
  EXPECT_EQ(f.fastest.req.seq_len, r.seq_len);
  EXPECT_GE(f.fastest.result.speed.tokens_per_second, asked.speed.tokens_per_second);
  EXPECT_EQ(f.candidates, 3 * 4);  // checkpointing x divisors of 8
  // Recompute only costs time, so the winner does not recompute when no-recompute fits.
  EXPECT_EQ(f.fastest.req.checkpointing, Checkpointing::None);
}

TEST(Fit, SuggestionsFitWhenRequestDoesNot) {
  PlanRequest r = request("llama3-70b", "b200", "full");
  ASSERT_FALSE(make_plan(r).fits);
  std::vector<std::string> s = suggest_fixes(r);
  std::string all;
  for (const auto& x : s) all += x + "\n";
  EXPECT_NE(all.find("--method qlora --base-precision nf4"), std::string::npos) << all;
  EXPECT_NE(all.find("--sharding zero3"), std::string::npos) << all;
  // Each suggestion that names a configuration says it fits.
  for (const auto& x : s)
    if (x.rfind("--method", 0) == 0 || x.rfind("--sharding", 0) == 0 || x.rfind("--checkpointing", 0) == 0) {
      EXPECT_NE(x.find("fits"), std::string::npos) << x;
    }
}
