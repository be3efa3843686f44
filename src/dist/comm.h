// Ranks over MPI: which launcher started this process, and the Comm it calls for.
#pragma once
#include <memory>
#include <string>

#include "core/comm.h"

namespace qlora {

// The launcher that started this process, read from its environment (mpirun/mpiexec of Open MPI,
// MPICH or Intel MPI, PMIx, srun); "" when none, i.e. a plain command line.
std::string detect_launcher();

// An MPI Comm when a launcher started the process, else the single-process one; MPI_Init runs
// only in the first case, so a plain `qlora train` never starts an MPI runtime.
// timeout_s: the longest any collective waits for the other ranks before failing (a rank died
// or hangs); <= 0 waits forever.
std::unique_ptr<Comm> make_comm(double timeout_s);

}  // namespace qlora
