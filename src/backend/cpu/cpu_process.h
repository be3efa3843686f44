// Process-wide settings that the OpenMP runtime and OpenBLAS read when they load, before main.
#pragma once
#include <string>

namespace qlora::cpu {

// The OpenBLAS kernel core this CPU should run ("Cooperlake", "SkylakeX", "Haswell"), or "" when
// OpenBLAS's own choice is at least as good or OPENBLAS_CORETYPE is set. An OpenBLAS older than
// the CPU does not recognise it and falls back to its generic SSE3 kernels ("Prescott"): Debian 12's
// OpenBLAS 0.3.21 does so on 5th-generation Xeons, with sgemm at half the speed or less.
std::string fitting_blas_core();

// Chooses OMP_WAIT_POLICY=passive (unless set: spinning workers starve everything else on a small
// or shared machine) and the fitting BLAS core, and re-executes this process once (same pid, same
// arguments) so that the libraries read them. Returns when nothing had to change, or when the
// exec failed (the process then goes on with the libraries' defaults).
void reexec_with_runtime_settings(char** argv);

// The core OpenBLAS had chosen by itself before reexec_with_runtime_settings replaced it ("" when
// it did not).
std::string blas_core_replaced();

}  // namespace qlora::cpu
