// One GPU per local rank: which device a rank of a multi-rank job uses, chosen before CUDA starts.
#pragma once
#include <string>

namespace qlora {

// With several ranks on a node, narrows CUDA_VISIBLE_DEVICES to one device for this rank: entry
// local_rank (mod count) of the list the launcher set (srun --gpus-per-node, a scheduler's
// cgroup list), or device local_rank when it is unset. A list of one (srun --gpus-per-task=1) is
// already this rank's and is kept. Must run before the first CUDA call. Returns the value set
// ("" when nothing changed).
std::string bind_local_gpu(int local_rank, int local_size);

}  // namespace qlora
