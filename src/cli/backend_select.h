// Picks the compute backend for `device: auto|cpu|cuda`.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace qlora {

// quiet: no note when auto falls back to the CPU (ranks other than 0 of a multi-rank run).
std::unique_ptr<Backend> select_backend(const std::string& device, int threads, bool quiet = false);

}  // namespace qlora
