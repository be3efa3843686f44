// End to end: checkpoints survive a failed save and an interrupted one. A save that hits the file
// size limit (RLIMIT_FSIZE, as a full disk would) fails with the file and the errno text and
// leaves the earlier checkpoint and adapter as they were; the temporary directories of a save
// that never finished are removed by the next run and never resumed from.
// The SIGKILL trials are tests/crash/kill9_trials.sh (ctest label crash).
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <map>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli_util.h"

using namespace qlora::cli_test;
namespace fs = std::filesystem;

namespace {

std::string base_args(const std::string& out) {
  return std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml output_dir=" + out +
         " save_steps=2 logging_steps=1 eval_steps=4 threads=1 device=cpu";
}

// Runs `qlora train ARGS` with RLIMIT_FSIZE = limit_bytes and SIGXFSZ at its default action (as
// from a shell), like `ulimit -f`. Returns the exit status as from waitpid.
int run_train_with_file_size_limit(const std::string& args, rlim_t limit_bytes, const std::string& log) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) _exit(126);
    dup2(fd, 1);
    dup2(fd, 2);
    std::signal(SIGXFSZ, SIG_DFL);
    struct rlimit rl {limit_bytes, limit_bytes};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(126);
    execl("/bin/sh", "sh", "-c", (std::string("exec ") + QLORA_BIN + " train " + args).c_str(), (char*)nullptr);
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return st;
}

// Names of the entries in `dir` (recursively) that contain ".tmp-".
std::vector<std::string> temp_leftovers(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) v.push_back(e.path().string());
  return v;
}

// Every file under `dir`, by relative path, with its bytes.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) m[fs::relative(e.path(), dir).string()] = read_file(e.path().string());
  return m;
}

}  // namespace

// Checkpoint files of the tiny model: adapter_model.safetensors ~300 KB, optimizer.safetensors
// ~600 KB; every other output stays under 10 KB. A 400 KB limit lets the adapter through and
// stops the optimizer state part-way. (The limit is per file and every checkpoint has the same
// size, so the earlier checkpoint comes from a run without the limit.)
TEST(TrainCrashSafety, SaveHittingTheFileSizeLimitFailsCleanlyAndKeepsTheEarlierCheckpoint) {
  const std::string d = temp_dir("fsize");
  RunResult first = run_qlora("train " + base_args(d) + " max_steps=4");
  ASSERT_EQ(first.code, 0) << first.output;
  ASSERT_TRUE(fs::exists(d + "/checkpoint-2/optimizer.safetensors"));
  const rlim_t limit = 400 * 1024;
  ASSERT_GT(fs::file_size(d + "/checkpoint-2/optimizer.safetensors"), limit);
  ASSERT_LT(fs::file_size(d + "/checkpoint-2/adapter_model.safetensors"), limit);
  const auto ckpt_before = snapshot(d + "/checkpoint-2");
  const auto adapter_before = read_file(d + "/adapter_model.safetensors");
  const auto adapter_dir_before = snapshot(d + "/adapter");

  // Resume and go on to step 8: the save at step 4 cannot write its optimizer state.
  const std::string log = d + "/../" + fs::path(d).filename().string() + "_limited.log";
  const int st = run_train_with_file_size_limit(base_args(d) + " max_steps=8 resume_from_checkpoint=latest", limit, log);
  const std::string out = read_file(log);
  fs::remove(log);
  ASSERT_TRUE(WIFEXITED(st)) << "killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0)
                             << " (SIGXFSZ is " << SIGXFSZ << "; qlora must ignore it)\n" << out;
  EXPECT_EQ(WEXITSTATUS(st), 1) << out;
  EXPECT_NE(out.find("resumed from " + d + "/checkpoint-2"), std::string::npos) << out;
  EXPECT_NE(out.find("checkpoint-4.tmp-"), std::string::npos) << out;  // where the save was being built
  EXPECT_NE(out.find("/optimizer.safetensors: write failed"), std::string::npos) << out;
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  EXPECT_NE(out.find("checkpoint-4 was not saved"), std::string::npos) << out;
  EXPECT_NE(out.find("ulimit -f"), std::string::npos) << out;  // the hint

  EXPECT_EQ(temp_leftovers(d), std::vector<std::string>{});
  EXPECT_FALSE(fs::exists(d + "/checkpoint-4"));
  EXPECT_TRUE(snapshot(d + "/checkpoint-2") == ckpt_before) << "checkpoint-2 changed";
  EXPECT_EQ(read_file(d + "/adapter_model.safetensors"), adapter_before);
  EXPECT_TRUE(snapshot(d + "/adapter") == adapter_dir_before) << "adapter/ changed";

  // Without the limit the same command resumes from checkpoint-2 and finishes.
  RunResult again = run_qlora("train " + base_args(d) + " max_steps=8 resume_from_checkpoint=latest");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("resumed from " + d + "/checkpoint-2 at step 2"), std::string::npos) << again.output;
  EXPECT_TRUE(fs::exists(d + "/checkpoint-6/optimizer.safetensors"));
  EXPECT_EQ(temp_leftovers(d), std::vector<std::string>{});
  fs::remove_all(d);
}

// A limit below every checkpoint file: the first save of a fresh run fails on the adapter weights
// and leaves no checkpoint directory, whole or partial.
TEST(TrainCrashSafety, FirstSaveFailingLeavesNoCheckpointAndNoTemporaryDirectory) {
  const std::string d = temp_dir("fsize_first");
  const std::string log = d + "/../" + fs::path(d).filename().string() + "_limited.log";
  const int st = run_train_with_file_size_limit(base_args(d) + " max_steps=4", 100 * 1024, log);
  const std::string out = read_file(log);
  fs::remove(log);
  ASSERT_TRUE(WIFEXITED(st)) << "killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0) << "\n" << out;
  EXPECT_EQ(WEXITSTATUS(st), 1) << out;
  EXPECT_NE(out.find("adapter_model.safetensors: write failed"), std::string::npos) << out;
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  EXPECT_EQ(temp_leftovers(d), std::vector<std::string>{});
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_NE(e.path().filename().string().rfind("checkpoint-", 0), 0u) << e.path();
  fs::remove_all(d);
}

// What a SIGKILL inside a save leaves (see kill9_trials.sh): a temporary checkpoint-N.tmp-XXXXXX
// directory, possibly with a higher N than any whole checkpoint, and temporary files of the final
// adapter. The next run removes them with a one-line note and resumes from the newest whole
// checkpoint; names that only start like a checkpoint (a ".old-PID" copy, "checkpoint-9-backup")
// are neither resumed from nor deleted.
TEST(TrainCrashSafety, LeftoversOfAnInterruptedSaveAreRemovedAndNeverResumedFrom) {
  const std::string d = temp_dir("leftovers");
  RunResult first = run_qlora("train " + base_args(d) + " max_steps=4");
  ASSERT_EQ(first.code, 0) << first.output;
  ASSERT_TRUE(fs::is_directory(d + "/checkpoint-2"));
  // A half-written save of step 3 and an empty one of step 9.
  fs::create_directories(d + "/checkpoint-3.tmp-Ab3dEf");
  std::ofstream(d + "/checkpoint-3.tmp-Ab3dEf/adapter_model.safetensors") << "partial";
  fs::create_directories(d + "/checkpoint-9.tmp-Zz9Yy8");
  std::ofstream(d + "/adapter_model.safetensors.tmp-Qq1Ww2") << "partial";
  fs::create_directories(d + "/checkpoint-7.old-4242");
  fs::create_directories(d + "/checkpoint-9-backup");
  std::ofstream(d + "/notes.tmp-mine") << "not qlora's";

  RunResult r = run_qlora("train " + base_args(d) + " max_steps=6 resume_from_checkpoint=latest");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + d + "/checkpoint-2 at step 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("removed 3 unfinished output(s) of an interrupted run in " + d + ": "
                          "adapter_model.safetensors.tmp-Qq1Ww2, checkpoint-3.tmp-Ab3dEf, checkpoint-9.tmp-Zz9Yy8"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(d + "/checkpoint-3.tmp-Ab3dEf"));
  EXPECT_FALSE(fs::exists(d + "/checkpoint-9.tmp-Zz9Yy8"));
  EXPECT_FALSE(fs::exists(d + "/adapter_model.safetensors.tmp-Qq1Ww2"));
  EXPECT_TRUE(fs::exists(d + "/checkpoint-7.old-4242"));
  EXPECT_TRUE(fs::exists(d + "/checkpoint-9-backup"));
  EXPECT_TRUE(fs::exists(d + "/notes.tmp-mine"));
  EXPECT_TRUE(fs::exists(d + "/checkpoint-4/trainer_state.json"));

  // A fresh run in the same directory cleans up the same way; with nothing left over, no note.
  fs::create_directories(d + "/checkpoint-5.tmp-Cc5Dd6");
  RunResult fresh = run_qlora("train " + base_args(d) + " max_steps=2");
  ASSERT_EQ(fresh.code, 0) << fresh.output;
  EXPECT_NE(fresh.output.find("removed 1 unfinished output(s)"), std::string::npos) << fresh.output;
  EXPECT_FALSE(fs::exists(d + "/checkpoint-5.tmp-Cc5Dd6"));
  RunResult clean = run_qlora("train " + base_args(d) + " max_steps=2");
  ASSERT_EQ(clean.code, 0) << clean.output;
  EXPECT_EQ(clean.output.find("unfinished output"), std::string::npos) << clean.output;
  fs::remove_all(d);
}

// save_total_limit keeps the newest checkpoints and leaves no temporary names behind (an old
// checkpoint is renamed to "checkpoint-N.tmp-rmPID" before it is deleted, so that a kill part-way
// through the deletion cannot leave a checkpoint-N with some of its files gone).
TEST(TrainCrashSafety, RotationKeepsOnlyWholeCheckpoints) {
  const std::string d = temp_dir("rotation");
  RunResult r = run_qlora("train " + base_args(d) + " max_steps=12 save_steps=1 save_total_limit=2");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<std::string> ckpts;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) ckpts.push_back(e.path().filename().string());
  std::sort(ckpts.begin(), ckpts.end());
  EXPECT_EQ(ckpts, (std::vector<std::string>{"checkpoint-10", "checkpoint-11"}));
  EXPECT_EQ(temp_leftovers(d), std::vector<std::string>{});
  fs::remove_all(d);
}
