// Helpers to run the qlora binary from tests.
#pragma once
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <vector>

#include <nlohmann/json.hpp>

namespace qlora::cli_test {

struct RunResult {
  int code = -1;
  std::string output;  // stdout + stderr
};

// Runs a shell command line; output is what it writes to stdout.
inline RunResult run_command(const std::string& cmd) {
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// The override for tests that compare two paths through the optimizer (two bases, two reference
// passes, ranks against one process) whose gradients differ only by rounding (other GEMM shapes,
// other summation orders). With AdamW's default eps 1e-8 an update divides a near-zero gradient
// element by its own square root, so a last-bit difference becomes an O(lr) difference of the
// parameters, and the comparison measures the BLAS kernels' rounding amplified (OpenBLAS's Haswell
// kernels against the native ones: 9e-5 of an experts' B measured). With eps above the gradients'
// rounding each update is Lipschitz in the gradient (constant lr/eps), so the parameters differ by
// the gradients' relative rounding (2.6e-6 of that B under the Haswell kernels, 0 natively).
inline const std::string kOptimizerLipschitzInGradient = " adam_epsilon=1e-3 ";

inline RunResult run_qlora(const std::string& args) { return run_command(std::string(QLORA_BIN) + " " + args + " 2>&1"); }

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The records of a run's metrics.jsonl, in order (blank lines skipped).
inline std::vector<nlohmann::json> metrics_records(const std::string& run_dir) {
  std::vector<nlohmann::json> v;
  std::istringstream in(read_file(run_dir + "/metrics.jsonl"));
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) v.push_back(nlohmann::json::parse(l));
  return v;
}

inline std::string temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("qlora_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

}  // namespace qlora::cli_test
