// NCCL all-reduce of device buffers for data-parallel GPU ranks, bootstrapped over an MPI Comm.
#pragma once
#include <memory>

#include "core/comm.h"

namespace qlora {

// Rank 0 makes an ncclUniqueId, the Comm broadcasts it, every rank joins one NCCL communicator on
// its (already selected) CUDA device. timeout_s as Comm: the longest a reduction may take.
std::unique_ptr<DeviceReducer> make_nccl_reducer(Comm& comm, double timeout_s);

}  // namespace qlora
