// Helpers for tests that run `mpirun -np N qlora train` on the tiny fixture model: the command
// line, metrics, adapter comparison with a relative tolerance, and the ranks' process ids.
#pragma once
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "io/safetensors.h"

namespace qlora::mpi_test {

using cli_test::read_file;
using cli_test::RunResult;
using cli_test::run_command;
using cli_test::temp_dir;
using cli_test::kOptimizerLipschitzInGradient;

// Running as root needs Open MPI's consent; shared-memory single copy is off (containers deny the
// ptrace it needs). Under AddressSanitizer, Open MPI's runtime leaks at MPI_Finalize from
// components it has already unloaded (no suppression can name them): no leak check for ranks;
// the same trainer code is leak-checked by the single-process tests.
inline std::string mpi_env() {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
         "ASAN_OPTIONS=\"${ASAN_OPTIONS}:detect_leaks=0\" ";
}

// `qlora train` of the tiny example with the given overrides: under mpirun with np ranks, or as a
// plain process (np == 0).
inline std::string train_command(int np, const std::string& overrides) {
  const std::string train = std::string(QLORA_BIN) + " train " + QLORA_SOURCE_DIR + "/examples/tiny.yaml " +
                            "threads=1 device=cpu logging_steps=1 " + overrides;
  if (np == 0) return train;
  return mpi_env() + QLORA_MPIEXEC + " --oversubscribe -np " + std::to_string(np) + " " + train;
}

inline RunResult train(int np, const std::string& overrides) { return run_command(train_command(np, overrides) + " 2>&1"); }

struct StepRecord {
  double loss = NAN, grad_norm = NAN, lr = NAN, eval_loss = NAN;
  int64_t trained_tokens = -1;
};

// metrics.jsonl by step.
inline std::map<int64_t, StepRecord> metrics(const std::string& out) {
  std::map<int64_t, StepRecord> m;
  std::istringstream in(read_file(out + "/metrics.jsonl"));
  for (std::string l; std::getline(in, l);) {
    if (l.empty()) continue;
    const auto j = nlohmann::json::parse(l);
    StepRecord& r = m[j["step"].get<int64_t>()];
    if (j.contains("loss") && j["loss"].is_number()) r.loss = j["loss"].get<double>();
    if (j.contains("grad_norm") && j["grad_norm"].is_number()) r.grad_norm = j["grad_norm"].get<double>();
    if (j.contains("learning_rate")) r.lr = j["learning_rate"].get<double>();
    if (j.contains("eval_loss")) r.eval_loss = j["eval_loss"].get<double>();
    if (j.contains("trained_tokens")) r.trained_tokens = j["trained_tokens"].get<int64_t>();
  }
  return m;
}

inline double rel_diff(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(a), std::fabs(b)); }

// Every step's loss, grad norm and eval loss agree within rtol (relative), learning rates and
// trained-token counts exactly; the same steps are logged.
// With only_a_steps, b may hold more steps (a resumed run logs only the steps after its checkpoint).
// The bounds of the rank-against-one-process tests. Summation order is the only difference (ranks
// add their micro-batches' gradients apart, then in rank order in double), and the runs compared
// use kOptimizerLipschitzInGradient, so AdamW does not magnify that rounding in near-zero gradient
// entries (at its default eps 1e-8 the adapters of MpiTrain.ThreeRanksAcrossEpochEndsEqualOneProcess
// differed by 6.4e-5 under OpenBLAS's Haswell kernels). Measured with the native and the Haswell
// kernels: losses and grad norms within 3.5e-7 relative, adapter tensors within 6.7e-7. A lost or
// doubled micro-batch or a wrong normalizer moves the loss by 1e-2 and the adapter by more.
inline constexpr double kRanksLossRtol = 1e-5, kRanksAdapterRtol = 1e-5;

inline void expect_same_curves(const std::string& a, const std::string& b, double rtol, bool only_a_steps = false) {
  const auto ma = metrics(a), mb = metrics(b);
  double worst = 0;
  for (const auto& [step, ra] : ma)
    if (mb.count(step) && !std::isnan(ra.loss))
      worst = std::max({worst, rel_diff(ra.loss, mb.at(step).loss), rel_diff(ra.grad_norm, mb.at(step).grad_norm)});
  std::printf("largest relative difference of loss / grad norm: %.3g\n", worst);
  if (!only_a_steps) {
    ASSERT_EQ(ma.size(), mb.size()) << a << " vs " << b;
  }
  ASSERT_FALSE(ma.empty());
  for (const auto& [step, ra] : ma) {
    ASSERT_TRUE(mb.count(step)) << "step " << step;
    const StepRecord& rb = mb.at(step);
    EXPECT_EQ(std::isnan(ra.loss), std::isnan(rb.loss)) << "step " << step;
    if (!std::isnan(ra.loss)) {
      EXPECT_LE(rel_diff(ra.loss, rb.loss), rtol) << "loss at step " << step << ": " << ra.loss << " vs " << rb.loss;
      EXPECT_LE(rel_diff(ra.grad_norm, rb.grad_norm), rtol) << "grad_norm at step " << step;
      EXPECT_EQ(ra.lr, rb.lr) << "learning rate at step " << step;
      EXPECT_EQ(ra.trained_tokens, rb.trained_tokens) << "trained tokens at step " << step;
    }
    EXPECT_EQ(std::isnan(ra.eval_loss), std::isnan(rb.eval_loss)) << "step " << step;
    if (!std::isnan(ra.eval_loss)) {
      EXPECT_LE(rel_diff(ra.eval_loss, rb.eval_loss), rtol) << "eval_loss at step " << step;
    }
  }
}

// Each adapter tensor of a and b: ||a - b|| <= rtol * ||b|| (b nonzero), same names and shapes.
inline void expect_same_adapter(const std::string& a_dir, const std::string& b_dir, double rtol) {
  SafetensorsArchive a(a_dir + "/adapter_model.safetensors"), b(b_dir + "/adapter_model.safetensors");
  ASSERT_EQ(a.names(), b.names());
  ASSERT_FALSE(a.names().empty());
  double worst = 0;
  for (const auto& name : a.names()) {
    const auto& shape = a.get(name).shape;
    ASSERT_EQ(shape, b.get(name).shape) << name;
    const std::vector<float> x = a.read_f32(name, shape), y = b.read_f32(name, shape);
    double d2 = 0, y2 = 0;
    for (size_t i = 0; i < x.size(); i++) {
      d2 += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      y2 += double(y[i]) * y[i];
    }
    ASSERT_GT(y2, 0) << name << " is all zeros: nothing was trained";
    worst = std::max(worst, std::sqrt(d2 / y2));
    EXPECT_LE(std::sqrt(d2 / y2), rtol) << name;
  }
  std::printf("largest relative difference of an adapter tensor: %.3g\n", worst);
}

inline size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
  return n;
}

// Starts a command in the background (its own process group); output to `log`.
inline pid_t spawn(const std::string& cmd, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    // `exec env`: the command may start with VAR=value assignments; the pid stays the launcher's.
    execl("/bin/sh", "sh", "-c", ("exec env " + cmd + " > " + log + " 2>&1").c_str(), (char*)nullptr);
    _exit(127);
  }
  return pid;
}

// The process id of MPI rank `rank` among the children of mpirun `launcher` (-1 if not found).
inline pid_t rank_pid(pid_t launcher, int rank) {
  DIR* d = opendir("/proc");
  if (!d) return -1;
  pid_t found = -1;
  while (dirent* e = readdir(d)) {
    const pid_t pid = pid_t(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::istringstream stat(read_file("/proc/" + std::string(e->d_name) + "/stat"));
    std::string tok;
    int ppid = -1;
    for (int i = 0; i < 4 && stat >> tok; i++)
      if (i == 3) ppid = std::atoi(tok.c_str());
    if (ppid != launcher) continue;
    const std::string env = read_file("/proc/" + std::string(e->d_name) + "/environ");
    if (env.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') != std::string::npos) found = pid;
  }
  closedir(d);
  return found;
}

// Waits until metrics.jsonl of `out` has at least n lines (false after `seconds`).
inline bool wait_for_metric_lines(const std::string& out, size_t n, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    if (count_of(read_file(out + "/metrics.jsonl"), "\n") >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// waitpid with a deadline: the exit status, or -1 if the process still runs after `seconds`
// (then it is killed, with its process group).
inline int wait_exit(pid_t pid, double seconds, double* took = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  int st = 0;
  for (;;) {
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waitpid(pid, &st, WNOHANG) == pid) {
      if (took) *took = dt;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (dt > seconds) {
      kill(-pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace qlora::mpi_test
