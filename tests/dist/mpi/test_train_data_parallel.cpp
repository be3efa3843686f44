// mpirun -np 2 / -np 3 `qlora train` against one process with the same global batch
// (per_device_train_batch_size x gradient_accumulation_steps x ranks): the same loss curve, grad
// norms, learning rates and adapter within fp32 summation-order tolerance; bit-identical reruns.
#include "mpi_util.h"

using namespace qlora::mpi_test;
namespace fs = std::filesystem;

namespace {

// The first n rows of the tiny training set: 30 rows in micro-batches of 4 end each epoch with a
// micro-batch of 2, and global steps run across epoch boundaries.
std::string small_train_file(const std::string& dir, int n) {
  std::istringstream in(read_file(std::string(QLORA_SOURCE_DIR) + "/examples/data/tiny_train.jsonl"));
  std::string out, line;
  for (int i = 0; i < n && std::getline(in, line); i++) out += line + "\n";
  const std::string path = dir + "/train.jsonl";
  std::ofstream(path) << out;
  return path;
}

}  // namespace

TEST(MpiTrain, TwoRanksEqualOneProcessWithTheSameGlobalBatch) {
  const std::string one = temp_dir("dp_one"), two = temp_dir("dp_two"), again = temp_dir("dp_two_again");
  const std::string common = "max_steps=6 eval_steps=3 per_device_train_batch_size=2" + kOptimizerLipschitzInGradient;
  RunResult r1 = train(0, common + "gradient_accumulation_steps=4 output_dir=" + one);
  ASSERT_EQ(r1.code, 0) << r1.output;
  RunResult r2 = train(2, common + "gradient_accumulation_steps=2 output_dir=" + two);
  ASSERT_EQ(r2.code, 0) << r2.output;
  expect_same_curves(one, two, kRanksLossRtol);
  expect_same_adapter(two, one, kRanksAdapterRtol);
  // Only rank 0 logs and writes; the progress line and the start-up line show the world size.
  EXPECT_EQ(count_of(r2.output, "done: 6 steps"), 1u) << r2.output;
  EXPECT_EQ(count_of(r2.output, "eval_loss"), 4u) << r2.output;  // before training, steps 3 and 6, "done:"
  EXPECT_NE(r2.output.find("| 2 ranks |"), std::string::npos) << r2.output;
  EXPECT_NE(r2.output.find("global batch 2 x 2 x 2 = 8 rows per step"), std::string::npos) << r2.output;
  // Deterministic for a given world size: a rerun repeats every bit.
  RunResult r3 = train(2, common + "gradient_accumulation_steps=2 output_dir=" + again);
  ASSERT_EQ(r3.code, 0) << r3.output;
  const auto m2 = metrics(two), m3 = metrics(again);
  ASSERT_EQ(m2.size(), m3.size());
  for (const auto& [step, rec] : m2) {
    if (std::isnan(rec.loss)) continue;
    EXPECT_EQ(rec.loss, m3.at(step).loss) << "step " << step;
    EXPECT_EQ(rec.grad_norm, m3.at(step).grad_norm) << "step " << step;
  }
  EXPECT_EQ(read_file(two + "/adapter_model.safetensors"), read_file(again + "/adapter_model.safetensors"));
}

TEST(MpiTrain, ThreeRanksAcrossEpochEndsEqualOneProcess) {
  // Epoch-based length: 8 micro-batches per epoch, 3 per global step -> ceil(8/3) = 3 steps per
  // epoch, 6 in all, the same count and schedule as one process with gradient_accumulation_steps 3.
  const std::string one = temp_dir("dp3_one"), three = temp_dir("dp3_three");
  const std::string data = small_train_file(one, 30);
  const std::string common = "max_steps=-1 num_train_epochs=2 eval_steps=0 per_device_train_batch_size=4 train_file=" + data +
                             kOptimizerLipschitzInGradient;
  RunResult r1 = train(0, common + "gradient_accumulation_steps=3 output_dir=" + one);
  ASSERT_EQ(r1.code, 0) << r1.output;
  RunResult r3 = train(3, common + "gradient_accumulation_steps=1 output_dir=" + three);
  ASSERT_EQ(r3.code, 0) << r3.output;
  EXPECT_NE(r3.output.find("done: 6 steps"), std::string::npos) << r3.output;
  EXPECT_NE(r3.output.find("| 3 ranks |"), std::string::npos) << r3.output;
  expect_same_curves(one, three, kRanksLossRtol);
  expect_same_adapter(three, one, kRanksAdapterRtol);
}
