// OMP_WAIT_POLICY and OPENBLAS_CORETYPE, chosen before the libraries that read them are used.
#include "backend/cpu/cpu_process.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace qlora::cpu {
namespace {

// OpenBLAS's x86-64 kernel cores by the widest vector unit their sgemm uses: 2 AVX-512, 1 AVX2 + FMA,
// 0 anything older or unknown.
int core_level(const std::string& core) {
  for (const char* c : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == c) return 2;
  for (const char* c : {"Haswell", "Zen", "Excavator", "Steamroller"})
    if (core == c) return 1;
  return 0;
}

constexpr const char* kReplacedVar = "QLORA_BLAS_CORE_REPLACED";

}  // namespace

std::string fitting_blas_core() {
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE")) return "";
  __builtin_cpu_init();  // the feature checks include the OS's support (XSAVE state) for the registers
  std::string want;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    want = __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    want = "Haswell";
  if (want.empty()) return "";
  const char* have = openblas_get_corename();
  return have && core_level(have) < core_level(want) ? want : "";
#else
  return "";
#endif
}

void reexec_with_runtime_settings(char** argv) {
  bool changed = false;
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", /*overwrite=*/1);
    changed = true;
  }
  if (const std::string core = fitting_blas_core(); !core.empty()) {
    setenv(kReplacedVar, openblas_get_corename(), 1);
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
    changed = true;
  }
  if (!changed) return;
  execv("/proc/self/exe", argv);  // returns only on failure: the libraries keep what they chose
  unsetenv(kReplacedVar);
}

std::string blas_core_replaced() {
  const char* v = std::getenv(kReplacedVar);
  return v ? v : "";
}

}  // namespace qlora::cpu
