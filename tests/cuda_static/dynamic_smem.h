// Dynamic shared memory of the attention kernels, for the cuda-static gates: the sizes come from
// the tile traits the launchers use (attention_mma.cuh), read by nvcc in dynamic_smem.cu because
// that header needs CUDA device syntax; the gate test itself is plain C++.
#pragma once
#include <string>
#include <vector>

namespace qlora::cuda_static {

struct DynamicSmem {
  std::string kernel;  // a substring of the demangled kernel name
  long bytes;          // the most dynamic shared memory any launch of it asks for
};

std::vector<DynamicSmem> attention_dynamic_smem();

}  // namespace qlora::cuda_static
