// Building and running one cuDNN SDPA graph (cudnn_sdpa_graph.h): the part that needs libcudnn's
// engines and a device. cudnn_sdpa_exec.cpp implements it with cuDNN; the host harness
// implements the same functions by the operation's documented semantics (emu/emu_cudnn.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "backend/cuda/cudnn_sdpa_graph.h"

namespace qlora::cuda::sdpa {

// A described graph, built for the handle's device: execution plan chosen, workspace known.
struct Plan {
  Shape shape;
  std::shared_ptr<cudnn_frontend::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

// cudnnCreate + cudnnSetStream; destroy_handle(nullptr) does nothing.
void* create_handle(cudaStream_t stream);
void destroy_handle(void* handle) noexcept;
// Validates, builds the operation graph, picks an engine (heuristics A, then the fallback list),
// builds its plan and reads the workspace size. Throws Unsupported naming the shape and cuDNN's
// message when no engine of this cuDNN runs the graph on this device.
void build(void* handle, Plan& plan);
// Runs the plan on the handle's stream: `pack` maps every Uid of the graph to device memory.
void execute(void* handle, const Plan& plan, std::unordered_map<int64_t, void*>& pack, void* workspace);

}  // namespace qlora::cuda::sdpa
