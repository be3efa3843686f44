// The tests' main: the process settings `qlora` runs with (OpenMP wait policy, the BLAS kernels this
// CPU should run; backend/cpu/cpu_process.h), then GoogleTest.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_process.h"

int main(int argc, char** argv) {
  qlora::cpu::reexec_with_runtime_settings(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
