// Which launcher started this process, from the variables each sets in its ranks' environment.
#include <cstdlib>

#include "dist/comm.h"

namespace qlora {

static const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

std::string detect_launcher() {
  if (env("OMPI_COMM_WORLD_SIZE")) return "mpirun (Open MPI)";
  if (env("PMIX_RANK")) return "PMIx";
  if (env("PMI_RANK") || env("PMI_SIZE")) return "PMI (mpiexec of MPICH / Intel MPI, or srun --mpi=pmi2)";
  // srun without an MPI plugin still sets the step's task count; one task alone is a plain process.
  if (const char* n = env("SLURM_STEP_NUM_TASKS"); n && std::atoi(n) > 1) return "srun";
  return "";
}

}  // namespace qlora
