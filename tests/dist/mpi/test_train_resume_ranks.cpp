// Checkpoints at one world size resume at another: 2 ranks -> 1 process and 1 process -> 2 ranks,
// with the same global batch, continue the data and the optimizer state exactly where they
// stopped (the result equals an uninterrupted run within fp32 summation-order tolerance).
#include "mpi_util.h"

using namespace qlora::mpi_test;
namespace fs = std::filesystem;

namespace {


// checkpoint-3 of `from` copied into a fresh output_dir, to resume there.
std::string resume_dir(const std::string& from, const std::string& name) {
  const std::string d = temp_dir(name);
  fs::copy(from + "/checkpoint-3", d + "/checkpoint-3", fs::copy_options::recursive);
  return d;
}

}  // namespace

TEST(MpiTrain, ResumeAcrossWorldSizes) {
  const std::string common = "max_steps=6 save_steps=3 eval_steps=3 per_device_train_batch_size=2" + kOptimizerLipschitzInGradient;
  const std::string ref = temp_dir("rs_ref"), two = temp_dir("rs_two");
  RunResult a = train(0, common + "gradient_accumulation_steps=4 output_dir=" + ref);
  ASSERT_EQ(a.code, 0) << a.output;
  RunResult b = train(2, common + "gradient_accumulation_steps=2 output_dir=" + two);
  ASSERT_EQ(b.code, 0) << b.output;
  const auto st = nlohmann::json::parse(read_file(two + "/checkpoint-3/trainer_state.json"));
  EXPECT_EQ(st["world_size"], 2);
  EXPECT_EQ(st["global_step"], 3);
  EXPECT_EQ(st["global_batch_rows"], 8);

  // 2 ranks -> 1 process (gradient_accumulation_steps doubled: the same global batch)
  const std::string to_one = resume_dir(two, "rs_2to1");
  RunResult c = train(0, common + "gradient_accumulation_steps=4 output_dir=" + to_one +
                             " resume_from_checkpoint=" + to_one + "/checkpoint-3");
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_NE(c.output.find("was written by 2 rank(s) with a global batch of 8 rows; this run has 1 with 8"),
            std::string::npos) << c.output;
  expect_same_curves(to_one, ref, kRanksLossRtol, /*only_a_steps=*/true);
  EXPECT_FALSE(metrics(to_one).count(2)) << "a resumed run logs only the steps after its checkpoint";
  expect_same_adapter(to_one, ref, kRanksAdapterRtol);

  // 1 process -> 2 ranks
  const std::string to_two = resume_dir(ref, "rs_1to2");
  RunResult d = train(2, common + "gradient_accumulation_steps=2 output_dir=" + to_two +
                             " resume_from_checkpoint=" + to_two + "/checkpoint-3");
  ASSERT_EQ(d.code, 0) << d.output;
  expect_same_curves(to_two, ref, kRanksLossRtol, /*only_a_steps=*/true);
  expect_same_adapter(to_two, ref, kRanksAdapterRtol);
}
