// Ctrl-C (SIGINT) during `qlora merge` and `qlora export` stops at the next tensor and removes the
// temporary output: nothing under the output name, no .tmp- leftovers. Uses the real SmolLM2 GGUF
// (hundreds of MB to write, so the signal lands mid-way); skips without it.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "real_models.h"
#include "cli_util.h"

namespace fs = std::filesystem;
using namespace qlora::cli_test;

namespace {

// Runs `qlora ARGS` with output to log, sends SIGINT once `dir` holds a ".tmp-" entry, and returns
// the exit code (-1 when the run finished before the signal could be sent).
int interrupt_when_writing(const std::string& args, const std::string& dir, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + std::string(QLORA_BIN) + " " + args + " > " + log + " 2>&1").c_str(),
          (char*)nullptr);
    _exit(127);
  }
  bool sent = false;
  for (int i = 0; i < 2000 && !sent; i++) {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().find(".tmp-") != std::string::npos) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // mid-way through the tensors
        kill(pid, SIGINT);
        sent = true;
        break;
      }
    if (!sent) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  return v;
}

}  // namespace

TEST(InterruptedOutputs, MergeAndExportLeaveNothingBehind) {
  const std::string base = qlora::testing_paths::smollm2_gguf();
  if (base.empty()) GTEST_SKIP() << qlora::testing_paths::smollm2_skip_reason();
  const std::string adapter = std::string(QLORA_FIXTURES) + "/export/smollm2_adapter";
  const std::string dir = temp_dir("interrupted");
  struct Case {
    std::string args, out;
  } cases[] = {
      {"merge --model " + base + " --adapter " + adapter + " --dtype fp32 --out " + dir + "/merged", dir + "/merged"},
      {"export --format gguf --model " + base + " --adapter " + adapter + " --outtype f32 --out " + dir + "/m.gguf",
       dir + "/m.gguf"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const std::string log = dir + "/../interrupted.log";
    const int code = interrupt_when_writing(c.args, dir, log);
    ASSERT_NE(code, -1) << "finished before the signal; nothing was tested";
    EXPECT_EQ(code, 1) << read_file(log);
    EXPECT_NE(read_file(log).find("interrupted"), std::string::npos) << read_file(log);
    EXPECT_FALSE(fs::exists(c.out));
    EXPECT_TRUE(entries(dir).empty()) << "left behind: " << entries(dir).front();
  }
  fs::remove_all(dir);
}
