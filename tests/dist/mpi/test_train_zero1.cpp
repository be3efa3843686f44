// sharding: zero1 (AdamW moments split across ranks): the same training as one process with the
// same global batch; checkpoints hold the whole optimizer state, gathered, and resume at another
// world size; the config names what is not implemented.
#include "mpi_util.h"

using namespace qlora::mpi_test;
namespace fs = std::filesystem;

namespace {
}  // namespace

TEST(MpiZero1, ThreeRanksEqualOneProcessAndCheckpointTheWholeOptimizerState) {
  const std::string common = "max_steps=6 save_steps=3 eval_steps=3 per_device_train_batch_size=2" + kOptimizerLipschitzInGradient;
  const std::string one = temp_dir("z1_one"), three = temp_dir("z1_three"), two = temp_dir("z1_resume2");
  RunResult r1 = train(0, common + "gradient_accumulation_steps=6 output_dir=" + one);
  ASSERT_EQ(r1.code, 0) << r1.output;
  RunResult r3 = train(3, common + "gradient_accumulation_steps=2 sharding=zero1 output_dir=" + three);
  ASSERT_EQ(r3.code, 0) << r3.output;
  EXPECT_NE(r3.output.find("ZeRO-1 (AdamW moments split across ranks)"), std::string::npos) << r3.output;
  expect_same_curves(one, three, kRanksLossRtol);
  expect_same_adapter(three, one, kRanksAdapterRtol);
  // The checkpoint's moments are every rank's shares put together: the single process's tensors.
  qlora::SafetensorsArchive a(one + "/checkpoint-3/optimizer.safetensors"), b(three + "/checkpoint-3/optimizer.safetensors");
  ASSERT_EQ(a.names(), b.names());
  for (const auto& name : a.names()) {
    const auto& shape = a.get(name).shape;
    ASSERT_EQ(shape, b.get(name).shape) << name;
    const auto x = a.read_f32(name, shape), y = b.read_f32(name, shape);
    double d2 = 0, x2 = 0;
    for (size_t i = 0; i < x.size(); i++) {
      d2 += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      x2 += double(x[i]) * x[i];
    }
    if (x2 == 0) {
      EXPECT_EQ(d2, 0) << name;
    } else {
      EXPECT_LE(std::sqrt(d2 / x2), kRanksAdapterRtol) << name;
    }
  }
  // Resume the 3-rank ZeRO-1 checkpoint on 2 ranks (the moments re-split): same global batch of 12.
  fs::copy(three + "/checkpoint-3", two + "/checkpoint-3", fs::copy_options::recursive);
  RunResult r2 = train(2, common + "gradient_accumulation_steps=3 sharding=zero1 output_dir=" + two +
                              " resume_from_checkpoint=" + two + "/checkpoint-3");
  ASSERT_EQ(r2.code, 0) << r2.output;
  expect_same_curves(two, one, kRanksLossRtol, /*only_a_steps=*/true);
  expect_same_adapter(two, one, kRanksAdapterRtol);
}

TEST(MpiZero1, UnimplementedShardingIsAConfigErrorNamingTheKey) {
  const std::string out = temp_dir("z1_zero3");
  RunResult r = train(0, "max_steps=1 sharding=zero3 output_dir=" + out);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("sharding"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not implemented in training yet"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/adapter_model.safetensors"));
}
