// Backend selection: CUDA when built in and a device is present (auto) or demanded (cuda), else CPU.
#include "cli/backend_select.h"

#include <cstdio>

#include <omp.h>

#include "core/error.h"
#ifdef QLORA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qlora {

std::unique_ptr<Backend> select_backend(const std::string& device, int threads, bool quiet) {
  if (threads > 0) omp_set_num_threads(threads);
  if (device == "cpu") return make_cpu_backend();
  std::string why = "this qlora was built without CUDA";
#ifdef QLORA_HAVE_CUDA
  if (auto be = make_cuda_backend(&why)) return be;
#endif
  if (device == "cuda") fail(ErrorKind::Unsupported, "device", "cuda requested but unavailable: " + why, "use device=cpu");
  if (!quiet) std::fprintf(stderr, "device: cpu (%s)\n", why.c_str());
  return make_cpu_backend();
}

}  // namespace qlora
