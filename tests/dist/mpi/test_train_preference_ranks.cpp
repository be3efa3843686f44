// Preference training under mpirun: DPO with sharding fsdp on 2 ranks (each holding half of every
// layer's NF4 base, the reference forward gathering the layers as the policy's does) equals one
// process with the same global batch: losses, grad norms, the reward metrics (each rank's
// micro-batches' values summed over ranks), the sharded preference eval and the adapter.
#include "mpi_util.h"

using namespace qlora::mpi_test;

namespace {


std::string common() {
  const std::string fx = std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/";
  return "model_name_or_path=" + fx + "models/pref_tiny train_file=" + fx + "preference/pairs_text.jsonl eval_file=" + fx +
         "preference/pairs_chat.jsonl rl=dpo max_length=128 max_steps=4 save_steps=0 eval_steps=2 "
         "per_device_train_batch_size=1 base_precision=nf4" + kOptimizerLipschitzInGradient;
}

std::map<int64_t, nlohmann::json> records(const std::string& out) {
  std::map<int64_t, nlohmann::json> m;
  std::istringstream in(read_file(out + "/metrics.jsonl"));
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) {
      const auto j = nlohmann::json::parse(l);
      m[j["step"].get<int64_t>()].update(j);
    }
  return m;
}

}  // namespace

class MpiPreference : public ::testing::TestWithParam<bool> {};

// Param: precompute_ref_log_probs (each rank computes its share of the batches, summed over ranks).
TEST_P(MpiPreference, DpoOnTwoFsdpRanksEqualsOneProcess) {
  const std::string pre = GetParam() ? "precompute_ref_log_probs=true " : "";
  const std::string one = temp_dir("pref_one"), two = temp_dir("pref_two");
  RunResult r1 = train(0, common() + pre + "gradient_accumulation_steps=4 output_dir=" + one);
  ASSERT_EQ(r1.code, 0) << r1.output;
  RunResult r2 = train(2, common() + pre + "gradient_accumulation_steps=2 sharding=fsdp output_dir=" + two);
  ASSERT_EQ(r2.code, 0) << r2.output;
  expect_same_curves(one, two, kRanksLossRtol);
  expect_same_adapter(two, one, kRanksAdapterRtol);
  const auto a = records(one), b = records(two);
  int compared = 0;
  for (const auto& [step, ra] : a)
    for (const char* k : {"rewards/accuracies", "rewards/margins", "logps/chosen", "eval_rewards/margins"}) {
      if (!ra.contains(k)) continue;
      ASSERT_TRUE(b.at(step).contains(k)) << k << " at step " << step;
      const double x = ra[k], y = b.at(step)[k];
      EXPECT_LE(std::fabs(x - y), kRanksLossRtol * std::max(1.0, std::fabs(x))) << k << " at step " << step;
      compared++;
    }
  EXPECT_GE(compared, 4 * 3 + 3);  // 4 steps x 3 train metrics + 3 evals
  if (GetParam()) {
    EXPECT_EQ(read_file(one + "/reference_logps.json"), read_file(two + "/reference_logps.json"));
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, MpiPreference, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "Precomputed" : "InStep"; });
