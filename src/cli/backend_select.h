// Picks the compute backend for `device: auto|cpu|cuda`.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace qlora {

std::unique_ptr<Backend> select_backend(const std::string& device, int threads);

}  // namespace qlora
