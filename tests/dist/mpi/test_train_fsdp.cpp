// sharding: fsdp under mpirun: each rank stores 1/N of every decoder layer's NF4 base (an exact
// byte split) and all-gathers layers before use; the training equals one process with the whole
// base and the same global batch (fp32 summation-order tolerance), evaluation is the one process's
// number, checkpoints resume at another world size, and sample answers decode on every rank.
#include "core/comm.h"
#include "mpi_util.h"

#include <regex>

using namespace qlora::mpi_test;
namespace fs = std::filesystem;

namespace {

const std::string kCommon =
    "max_steps=6 save_steps=3 eval_steps=3 per_device_train_batch_size=2 base_precision=nf4" + kOptimizerLipschitzInGradient;

std::vector<int64_t> int_list(const std::string& s) {
  std::vector<int64_t> v;
  std::istringstream in(s);
  for (std::string item; std::getline(in, item, ',');) v.push_back(std::stoll(item));
  return v;
}

}  // namespace

TEST(MpiFsdp, ThreeRanksEqualOneProcessAndResumeOnTwo) {
  const std::string one = temp_dir("fsdp_one"), three = temp_dir("fsdp_three"), two = temp_dir("fsdp_resume2");
  RunResult r1 = train(0, kCommon + "gradient_accumulation_steps=6 output_dir=" + one);
  ASSERT_EQ(r1.code, 0) << r1.output;
  RunResult r3 = train(3, kCommon + "gradient_accumulation_steps=2 sharding=fsdp output_dir=" + three);
  ASSERT_EQ(r3.code, 0) << r3.output;
  expect_same_curves(one, three, kRanksLossRtol);
  expect_same_adapter(three, one, kRanksAdapterRtol);
  // Before training the weights are the same bits: the sharded evaluation is the one process's number.
  const auto m1 = metrics(one), m3 = metrics(three);
  ASSERT_TRUE(m1.count(0) && m3.count(0));
  EXPECT_FALSE(std::isnan(m1.at(0).eval_loss));
  EXPECT_EQ(m1.at(0).eval_loss, m3.at(0).eval_loss);
  EXPECT_EQ(count_of(r3.output, "eval_loss"), 4u) << r3.output;  // before training, steps 3 and 6, "done:"

  // Each rank holds exactly its share of every layer's blob: slice_of(blob, r, 3) bytes per layer.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r3.output, m, std::regex("\\| ([0-9]+) layers,"))) << r3.output;
  const int64_t layers = std::stoll(m[1].str());
  ASSERT_TRUE(std::regex_search(r3.output, m, std::regex("frozen base is ([0-9]+) bytes; each rank holds its share of "
                                                         "every layer \\(bytes per rank: ([0-9, ]+)\\)")))
      << r3.output;
  const int64_t whole = std::stoll(m[1].str());
  const std::vector<int64_t> per_rank = int_list(m[2].str());
  ASSERT_EQ(per_rank.size(), 3u);
  ASSERT_EQ(whole % layers, 0);
  const int64_t blob = whole / layers;
  EXPECT_NE(blob % 3, 0) << "the split is uneven for 3 ranks (remainders handled)";
  int64_t sum = 0;
  for (int r = 0; r < 3; r++) {
    EXPECT_EQ(per_rank[size_t(r)], layers * int64_t(qlora::slice_of(size_t(blob), r, 3).count)) << "rank " << r;
    sum += per_rank[size_t(r)];
  }
  EXPECT_EQ(sum, whole);

  // One process with fsdp: one shard, its gather a copy: the whole base's run bit for bit.
  const std::string single = temp_dir("fsdp_single");
  RunResult r0 = train(0, kCommon + "gradient_accumulation_steps=6 sharding=fsdp output_dir=" + single);
  ASSERT_EQ(r0.code, 0) << r0.output;
  EXPECT_EQ(read_file(single + "/adapter_model.safetensors"), read_file(one + "/adapter_model.safetensors"));
  for (const auto& [step, rec] : metrics(single)) {
    ASSERT_TRUE(m1.count(step)) << "step " << step;
    if (!std::isnan(rec.loss)) EXPECT_EQ(rec.loss, m1.at(step).loss) << "step " << step;
    if (!std::isnan(rec.eval_loss)) EXPECT_EQ(rec.eval_loss, m1.at(step).eval_loss) << "step " << step;
  }

  // The 3-rank fsdp checkpoint resumes on 2 ranks with fsdp (same global batch of 12 rows).
  fs::copy(three + "/checkpoint-3", two + "/checkpoint-3", fs::copy_options::recursive);
  RunResult r2 = train(2, kCommon + "gradient_accumulation_steps=3 sharding=fsdp output_dir=" + two +
                              " resume_from_checkpoint=" + two + "/checkpoint-3");
  ASSERT_EQ(r2.code, 0) << r2.output;
  expect_same_curves(two, one, kRanksLossRtol, /*only_a_steps=*/true);
  expect_same_adapter(two, one, kRanksAdapterRtol);
}

// Generation runs the forward, which gathers layers: every rank decodes the same prompts in
// lockstep and only rank 0 prints and writes. Before training the answers are the one process's.
TEST(MpiFsdp, SampleAnswersDecodeOnEveryRank) {
  const std::string one = temp_dir("fsdp_samples_one"), two = temp_dir("fsdp_samples_two");
  const std::string args = "max_steps=2 eval_strategy=no per_device_train_batch_size=2 base_precision=nf4 "
                           "sample_max_new_tokens=8 'sample_prompts=[The ocean, \"Once upon a time\"]' ";
  RunResult r1 = train(0, args + "gradient_accumulation_steps=2 output_dir=" + one);
  ASSERT_EQ(r1.code, 0) << r1.output;
  RunResult r2 = train(2, args + "gradient_accumulation_steps=1 sharding=fsdp output_dir=" + two);
  ASSERT_EQ(r2.code, 0) << r2.output;
  EXPECT_EQ(count_of(r2.output, "sample answers before training:"), 1u) << r2.output;
  EXPECT_EQ(count_of(r2.output, "sample answers after training:"), 1u) << r2.output;
  const auto s1 = nlohmann::json::parse(read_file(one + "/samples.json"));
  const auto s2 = nlohmann::json::parse(read_file(two + "/samples.json"));
  ASSERT_EQ(s2["before"].size(), 2u);
  EXPECT_EQ(s2["before"], s1["before"]);
  ASSERT_EQ(s2["after"].size(), 2u);
  EXPECT_FALSE(s2["after"][0]["answer"].get<std::string>().empty());
}
