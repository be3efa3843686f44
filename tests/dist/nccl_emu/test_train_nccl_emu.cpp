// `mpirun -np 2 / -np 3 qlora_emu train` on the CUDA backend under the host harness: the qlora
// command built on the harness (cmake/cuda_emu.cmake), whose GPU ranks bootstrap the real NCCL
// DeviceReducer (rank 0's ncclUniqueId over MPI, one emulated device per local rank) and sum
// their LoRA gradients with the harness's NCCL (emu_nccl.cpp). Against one process with the same
// global batch on the same backend: the same loss curve, grad norms and adapter within fp32
// summation-order tolerance, bit-identical reruns.
#include "mpi_util.h"

using namespace qlora::mpi_test;

namespace {

// The gradient sum's order is the only difference between one process (micro-batches accumulated
// into one buffer) and N ranks (each rank's micro-batches, then NCCL's sum in rank order); each
// micro-batch's forward and backward is the same computation on either side. Measured on these
// runs: training losses and grad norms within 2.9e-9 relative, adapter tensors within 1.7e-7
// (fsdp on 2 ranks: equal), eval losses within 3.3e-6 (the forward reads the updated LoRA
// weights in bf16, where a last-bit difference of the fp32 master can round to a different bf16).
// The loss bound is the eval loss's with 3x room (the CPU ranks' bound, tests/dist/mpi); the adapter's
// leaves 30x room.
constexpr double kLossRtol = 1e-5;
constexpr double kAdapterRtol = 5e-6;

std::string emu_train_command(int np, const std::string& overrides) {
  const std::string train = std::string(QLORA_BIN) + " train " + QLORA_SOURCE_DIR + "/examples/tiny.yaml " +
                            "device=cuda threads=1 logging_steps=1 max_length=64 save_steps=0 per_device_train_batch_size=2 " +
                            overrides;
  if (np == 0) return train;
  return mpi_env() + QLORA_MPIEXEC + " --oversubscribe -np " + std::to_string(np) + " " + train;
}

RunResult emu_train(int np, const std::string& overrides) { return run_command(emu_train_command(np, overrides) + " 2>&1"); }

void ranks_equal_one_process(int np) {
  const std::string tag = "nccl_emu_np" + std::to_string(np);
  const std::string one = temp_dir(tag + "_one"), many = temp_dir(tag + "_many");
  // Ranks sum the gradients in another order than one process does.
  const std::string common = "max_steps=3 eval_steps=3" + kOptimizerLipschitzInGradient;
  RunResult r1 = emu_train(0, common + "gradient_accumulation_steps=" + std::to_string(2 * np) + " output_dir=" + one);
  ASSERT_EQ(r1.code, 0) << r1.output;
  RunResult rn = emu_train(np, common + "gradient_accumulation_steps=2 output_dir=" + many);
  ASSERT_EQ(rn.code, 0) << rn.output;
  // The ranks ran the CUDA backend and summed through NCCL, not through host memory over MPI.
  EXPECT_NE(rn.output.find("backend cuda"), std::string::npos) << rn.output;
  EXPECT_NE(rn.output.find("fp32 LoRA gradients per step (NCCL, in device memory)"), std::string::npos) << rn.output;
  EXPECT_NE(rn.output.find("| " + std::to_string(np) + " ranks |"), std::string::npos) << rn.output;
  expect_same_curves(one, many, kLossRtol);
  expect_same_adapter(many, one, kAdapterRtol);
  // Training moved the adapter: the comparison above is not between two initial adapters.
  const auto m = metrics(many);
  ASSERT_TRUE(m.count(3));
  EXPECT_NE(m.at(1).loss, m.at(3).loss);
}

}  // namespace

TEST(NcclEmuTrain, TwoGpuRanksEqualOneProcessAndRerunsRepeatEveryBit) {
  ranks_equal_one_process(2);
  // Deterministic for a given world size: NCCL's sum gives every rank the same bits, run to run.
  const std::string a = temp_dir("nccl_emu_rerun_a"), b = temp_dir("nccl_emu_rerun_b");
  RunResult ra = emu_train(2, "max_steps=2 eval_steps=0 gradient_accumulation_steps=1 output_dir=" + a);
  ASSERT_EQ(ra.code, 0) << ra.output;
  RunResult rb = emu_train(2, "max_steps=2 eval_steps=0 gradient_accumulation_steps=1 output_dir=" + b);
  ASSERT_EQ(rb.code, 0) << rb.output;
  EXPECT_EQ(read_file(a + "/adapter_model.safetensors"), read_file(b + "/adapter_model.safetensors"));
  const auto ma = metrics(a), mb = metrics(b);
  for (const auto& [step, rec] : ma) {
    if (std::isnan(rec.loss)) continue;
    EXPECT_EQ(rec.loss, mb.at(step).loss) << "step " << step;
    EXPECT_EQ(rec.grad_norm, mb.at(step).grad_norm) << "step " << step;
  }
}

TEST(NcclEmuTrain, ThreeGpuRanksEqualOneProcess) { ranks_equal_one_process(3); }

namespace {

// sharding fsdp on GPU ranks: every decoder layer's base is gathered by NCCL (one grouped
// ncclBroadcast per rank's uneven share) from the shard straight into the device fsdp.gather slot.
// The gathered bytes are the whole base's, so the run equals one process with the whole base
// within the same summation-order tolerance (ZeRO-1's gradient split is the only other change).
void fsdp_ranks_equal_one_process(int np, const std::string& base) {
  const std::string tag = "nccl_emu_fsdp_np" + std::to_string(np);
  const std::string one = temp_dir(tag + "_one"), many = temp_dir(tag + "_many");
  const std::string common = "max_steps=2 eval_steps=2 " + base + " ";
  RunResult r1 = emu_train(0, common + "gradient_accumulation_steps=" + std::to_string(np) + " output_dir=" + one);
  ASSERT_EQ(r1.code, 0) << r1.output;
  RunResult rn = emu_train(np, common + "sharding=fsdp gradient_accumulation_steps=1 output_dir=" + many);
  ASSERT_EQ(rn.code, 0) << rn.output;
  EXPECT_NE(rn.output.find("backend cuda"), std::string::npos) << rn.output;
  EXPECT_NE(rn.output.find("all-gathered a layer ahead of use (NCCL, into the device slot)"), std::string::npos) << rn.output;
  expect_same_curves(one, many, kLossRtol);
  expect_same_adapter(many, one, kAdapterRtol);
  // The ranks' shares as logged ("bytes per rank: a, b, c"): uneven ones go through the per-rank broadcasts.
  const size_t at = rn.output.find("bytes per rank: ");
  ASSERT_NE(at, std::string::npos) << rn.output;
  std::istringstream shares(rn.output.substr(at + 16, rn.output.find(')', at) - at - 16));
  std::vector<int64_t> per_rank;
  for (std::string v; std::getline(shares, v, ',');) per_rank.push_back(std::stoll(v));
  ASSERT_EQ(per_rank.size(), size_t(np));
  if (np == 3) {
    EXPECT_NE(per_rank.front(), per_rank.back()) << "the NF4 blob does not split evenly over 3 ranks";
  }
  // The engine gathered the layers the planner counts: every step moved whole layer blobs.
  const auto m = metrics(many);
  ASSERT_TRUE(m.count(2));
  std::istringstream in(read_file(many + "/metrics.jsonl"));
  int64_t gathered = 0;
  for (std::string l; std::getline(in, l);)
    if (!l.empty() && nlohmann::json::parse(l).contains("fsdp_allgather_bytes"))
      gathered += nlohmann::json::parse(l)["fsdp_allgather_bytes"].get<int64_t>();
  EXPECT_GT(gathered, 0);
}

}  // namespace

// bf16 base on 2 ranks (even shares); NF4 base on 3 ranks (101,632-byte layer blobs: uneven shares).
TEST(NcclEmuTrain, FsdpTwoGpuRanksGatherThroughNcclAndEqualOneProcess) { fsdp_ranks_equal_one_process(2, ""); }
TEST(NcclEmuTrain, FsdpThreeGpuRanksGatherThroughNcclAndEqualOneProcess) { fsdp_ranks_equal_one_process(3, "base_precision=nf4"); }

// A multi-rank launch whose ranks would share one device fails at NCCL's bootstrap with the
// rank and NCCL's reason, instead of training on one GPU twice (real NCCL refuses the same).
TEST(NcclEmuTrain, RanksOnOneDeviceAreRefusedAtTheBootstrap) {
  const std::string out = temp_dir("nccl_emu_dup");
  // One visible device entry per rank that names the same device: bind_local_gpu picks entry
  // local_rank of the list, so both ranks land on device 0.
  RunResult r = run_command("CUDA_VISIBLE_DEVICES=0,0 " + emu_train_command(2, "max_steps=1 eval_steps=0 output_dir=" + out) + " 2>&1");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("NCCL communicator"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Duplicate GPU detected : rank 0 and rank 1 both on CUDA device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("] io error: NCCL communicator: invalid usage"), std::string::npos) << r.output;  // names the rank
  EXPECT_NE(r.output.find("hint: every rank needs a GPU of its own"), std::string::npos) << r.output;
}
