// Faults in a multi-rank run: SIGTERM to one rank checkpoints every rank at the same step and
// exits 130 (and resuming gives the uninterrupted run's result bit for bit); a killed rank or a
// hung one ends the whole job with an error in bounded time, never a hang.
#include "mpi_util.h"

using namespace qlora::mpi_test;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> checkpoints(const std::string& out) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) v.push_back(e.path().filename().string());
  return v;
}

// Whether pid has ended (gone, or a zombie nobody reaped) within `seconds`.
bool gone_within(pid_t pid, double seconds) {
  for (int i = 0; i < int(seconds * 50); i++) {
    const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    const size_t paren = stat.rfind(')');
    if (stat.empty() || (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z')) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace

TEST(MpiFaults, SigtermToOneRankStopsAllRanksAtOneStepAndResumes) {
  const std::string args = "max_steps=40 eval_steps=0 save_steps=0 gradient_accumulation_steps=1 ";
  const std::string full = temp_dir("sig_full"), cut = temp_dir("sig_cut");
  RunResult ref = train(2, args + "output_dir=" + full);
  ASSERT_EQ(ref.code, 0) << ref.output;

  const pid_t launcher = spawn(train_command(2, args + "output_dir=" + cut), cut + "/first.log");
  ASSERT_TRUE(wait_for_metric_lines(cut, 2, 60)) << read_file(cut + "/first.log");
  const pid_t rank1 = rank_pid(launcher, 1);
  ASSERT_GT(rank1, 0);
  kill(rank1, SIGTERM);  // one rank only, as a node-local preemption would
  const int code = wait_exit(launcher, 60);
  const std::string log = read_file(cut + "/first.log");
  ASSERT_EQ(code, 130) << log;  // 40 steps leave ~37 to go when the signal lands
  const auto cps = checkpoints(cut);
  ASSERT_EQ(cps.size(), 1u) << log;
  const int64_t step = std::stoll(cps[0].substr(11));
  EXPECT_NE(log.find("stopped at step " + std::to_string(step) + " on all 2 ranks"), std::string::npos) << log;
  const auto st = nlohmann::json::parse(read_file(cut + "/" + cps[0] + "/trainer_state.json"));
  EXPECT_EQ(st["global_step"].get<int64_t>(), step);
  EXPECT_EQ(metrics(cut).rbegin()->first, step);

  RunResult resumed = train(2, args + "output_dir=" + cut + " resume_from_checkpoint=latest");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  // Deterministic at a fixed world size, and the checkpoint holds the exact state: bit-identical.
  EXPECT_EQ(read_file(cut + "/adapter_model.safetensors"), read_file(full + "/adapter_model.safetensors"));
  const auto mf = metrics(full), mc = metrics(cut);
  for (const auto& [s, rec] : mf) {
    if (!std::isnan(rec.loss)) {
      EXPECT_EQ(rec.loss, mc.at(s).loss) << "step " << s;
    }
  }
}

TEST(MpiFaults, KilledRankEndsTheJobWithAnError) {
  const std::string out = temp_dir("killed");
  const pid_t launcher = spawn(train_command(2, "max_steps=400 eval_steps=0 output_dir=" + out), out + "/run.log");
  ASSERT_TRUE(wait_for_metric_lines(out, 2, 60)) << read_file(out + "/run.log");
  const pid_t rank0 = rank_pid(launcher, 0), rank1 = rank_pid(launcher, 1);
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  kill(rank1, SIGKILL);
  double took = 0;
  const int code = wait_exit(launcher, 30, &took);
  const std::string log = read_file(out + "/run.log");
  ASSERT_NE(code, -1) << "the job still ran 30 s after a rank died\n" << log;
  EXPECT_NE(code, 0) << log;
  EXPECT_NE(log.find("rank 1"), std::string::npos) << log;
  EXPECT_NE(log.find("signal 9"), std::string::npos) << log;
  EXPECT_TRUE(gone_within(rank0, 10)) << "rank 0 outlived the job";
}

TEST(MpiFaults, HungRankEndsTheJobAfterDdpTimeout) {
  // A rank that stops answering without dying (stopped, deadlocked, a lost node under a launcher
  // that does not notice): the others give up after ddp_timeout with an error and end the job.
  const std::string out = temp_dir("hung");
  const pid_t launcher =
      // No eval: rank 0 alone evaluating must not look like a hang to a 2 s deadline on a loaded machine.
      spawn(train_command(2, "max_steps=400 eval_strategy=no ddp_timeout=2 output_dir=" + out), out + "/run.log");
  ASSERT_TRUE(wait_for_metric_lines(out, 2, 60)) << read_file(out + "/run.log");
  const pid_t rank1 = rank_pid(launcher, 1);
  ASSERT_GT(rank1, 0);
  kill(rank1, SIGSTOP);
  double took = 0;
  const int code = wait_exit(launcher, 30, &took);
  kill(rank1, SIGKILL);  // in case it is still there, stopped
  const std::string log = read_file(out + "/run.log");
  ASSERT_NE(code, -1) << "the job still ran 30 s after a rank hung\n" << log;
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("[rank 0 of 2]"), std::string::npos) << log;
  EXPECT_NE(log.find("no answer from the other ranks in 2 s: a rank has died or hangs"), std::string::npos) << log;
  EXPECT_LT(took, 20) << log;
}

TEST(MpiLaunch, PlainProcessNeverStartsTheMpiRuntime) {
  // An MCA setting that makes MPI_Init fail: under mpirun the run dies in MPI_Init (the control),
  // as a plain process it trains, so a plain `qlora train` never called MPI_Init.
  const std::string plain = temp_dir("no_mpi"), launched = temp_dir("no_mpi_ctl");
  const std::string broken = "OMPI_MCA_pml=does_not_exist ";
  RunResult a = run_command(broken + train_command(0, "max_steps=1 eval_strategy=no output_dir=" + plain) + " 2>&1");
  EXPECT_EQ(a.code, 0) << a.output;
  EXPECT_TRUE(fs::exists(plain + "/adapter_model.safetensors"));
  RunResult b = run_command(broken + train_command(1, "max_steps=1 eval_strategy=no output_dir=" + launched) + " 2>&1");
  EXPECT_NE(b.code, 0) << b.output;
  EXPECT_FALSE(fs::exists(launched + "/adapter_model.safetensors"));
}
