// cuDNN SDPA plans on the device (cudnn_sdpa_exec.h). Not part of the host harness, whose
// emu/emu_cudnn.cpp implements the same functions.
#if QLORA_HAVE_CUDNN  // built only with cuDNN and the frontend headers (cmake/cudnn_frontend.cmake)
#include "backend/cuda/cudnn_sdpa_exec.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <string>

#include "core/error.h"

namespace qlora::cuda::sdpa {

namespace fe = cudnn_frontend;

void* create_handle(cudaStream_t stream) {
  cudnnHandle_t h = nullptr;
  if (cudnnStatus_t s = cudnnCreate(&h); s != CUDNN_STATUS_SUCCESS)
    fail(ErrorKind::Internal, "cuda backend, cuDNN", std::string("cudnnCreate failed: ") + cudnnGetErrorString(s),
         "check the cuDNN install (libcudnn 9) or set QLORA_ATTENTION_KERNEL=own");
  if (cudnnStatus_t s = cudnnSetStream(h, stream); s != CUDNN_STATUS_SUCCESS) {
    cudnnDestroy(h);
    fail(ErrorKind::Internal, "cuda backend, cuDNN", std::string("cudnnSetStream failed: ") + cudnnGetErrorString(s));
  }
  return h;
}

void destroy_handle(void* handle) noexcept {
  if (handle) cudnnDestroy(static_cast<cudnnHandle_t>(handle));
}

void build(void* handle, Plan& p) {
  auto h = static_cast<cudnnHandle_t>(handle);
  fe::graph::Graph& g = *p.graph;
  auto check = [&](const char* step, fe::error_t e) {
    if (e.is_good()) return;
    fail(ErrorKind::Unsupported, "cuda op attention (cuDNN SDPA " + describe_shape(p.shape) + ")",
         std::string(step) + ": " + e.get_message(), "set QLORA_ATTENTION_KERNEL=own to use the own kernel");
  };
  check("validate", g.validate());
  check("build_operation_graph", g.build_operation_graph(h));
  check("create_execution_plans", g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
  check("check_support", g.check_support(h));
  check("build_plans", g.build_plans(h, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE));
  int64_t ws = 0;
  check("get_workspace_size", g.get_workspace_size(ws));
  p.workspace_bytes = ws;
}

void execute(void* handle, const Plan& p, std::unordered_map<int64_t, void*>& pack, void* workspace) {
  fe::error_t e = p.graph->execute(static_cast<cudnnHandle_t>(handle), pack, workspace);
  if (!e.is_good())
    fail(ErrorKind::Internal, "attention (cuDNN SDPA " + describe_shape(p.shape) + ")",
         "graph.execute failed: " + e.get_message());
}

}  // namespace qlora::cuda::sdpa

#endif  // QLORA_HAVE_CUDNN
