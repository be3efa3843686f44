// The planner agrees with the engine at world size N: every rank of `mpirun -np N qlora train`
// allocates exactly the per-GPU plan of `qlora plan --config C --gpus-per-node N` for the config's
// `sharding` (none: a whole replica; zero1: the AdamW moments split; fsdp: those and each rank's
// share of every decoder layer's NF4 base, which differ by the split's remainders, so each rank is
// compared with its own line of per_rank_bytes), and the collectives move the bytes the planner
// counts, fsdp's all-gathers of base layers included.
#include <regex>

#include "mpi_util.h"

using namespace qlora::mpi_test;

TEST(MpiPlan, EachRankAllocatesThePlannedPerRankBytes) {
  for (const std::string sharding : {"none", "zero1", "fsdp"})
  for (int np : {2, 3}) {
    SCOPED_TRACE(sharding + " x " + std::to_string(np));
    const std::string out = temp_dir("plan_" + sharding + std::to_string(np));
    const std::string base = sharding == "fsdp" ? " base_precision=nf4" : "";
    RunResult plan = run_command(std::string(QLORA_BIN) + " plan --config " + QLORA_SOURCE_DIR +
                                 "/examples/tiny.yaml --set sharding=" + sharding + base + " --gpu cpu --threads 1 --gpus-per-node " +
                                 std::to_string(np) + " --json 2>/dev/null");
    ASSERT_EQ(plan.code, 0) << plan.output;
    const auto j = nlohmann::json::parse(plan.output);
    int64_t planned = 0;
    for (const auto& [cat, bytes] : j["categories"].items())
      if (cat != "overhead") planned += bytes.get<int64_t>();  // library overhead is an estimate, not a buffer
    ASSERT_GT(planned, 0);
    RunResult run = train(np, std::string(sharding == "fsdp" ? "max_steps=2" : "max_steps=1") +
                                  " eval_strategy=no sharding=" + sharding + base + " output_dir=" + out);
    ASSERT_EQ(run.code, 0) << run.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(run.output, m, std::regex("memory allocated per rank \\(bytes\\): ([0-9, ]+)"))) << run.output;
    std::istringstream list(m[1].str());
    int ranks = 0;
    for (std::string item; std::getline(list, item, ',');) {
      if (sharding == "fsdp") {
        ASSERT_EQ(j["per_rank_bytes"].size(), size_t(np));
        EXPECT_EQ(std::stoll(item), j["per_rank_bytes"][size_t(ranks)].get<int64_t>()) << "rank " << ranks << " of " << np;
      } else {
        EXPECT_EQ(std::stoll(item), planned) << "rank " << ranks << " of " << np;
      }
      ranks++;
    }
    EXPECT_EQ(ranks, np);
    if (sharding == "none") {
      // The planner counts an all-reduce as twice the gradient bytes (reduce-scatter + all-gather).
      ASSERT_TRUE(std::regex_search(run.output, m, std::regex("all-reduce of ([0-9]+) bytes of fp32 LoRA gradients"))) << run.output;
      EXPECT_EQ(2.0 * std::stod(m[1].str()), j["comm_bytes"]["all-reduce gradients"].get<double>());
    } else {
      if (sharding == "fsdp") {
        // Step 2 is in steady state (step 1 gathers the first forward's every layer): the layers it
        // all-gathered are the planner's, per micro-step times gradient_accumulation_steps.
        const auto rec = nlohmann::json::parse([&] {
          std::istringstream in(read_file(out + "/metrics.jsonl"));
          std::string l, last;
          while (std::getline(in, l))
            if (l.find("\"step\": 2") != std::string::npos || l.find("\"step\":2") != std::string::npos) last = l;
          return last;
        }());
        const double gathered = rec["fsdp_allgather_bytes"].get<double>();
        EXPECT_GT(gathered, 0);
        EXPECT_EQ(gathered, j["comm_bytes"]["all-gather base layers (per micro-step)"].get<double>());
      }
      ASSERT_TRUE(std::regex_search(run.output, m, std::regex("reduce-scatter of ([0-9]+) bytes of fp32 LoRA gradients"))) << run.output;
      EXPECT_EQ(std::stod(m[1].str()), j["comm_bytes"]["reduce-scatter gradients"].get<double>());
      EXPECT_EQ(std::stod(m[1].str()), j["comm_bytes"]["all-gather updated parameters"].get<double>());  // fp32 LoRA weights
    }
  }
}
