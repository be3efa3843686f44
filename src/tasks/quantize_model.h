// `qlora quantize`'s work: a pre-quantized checkpoint of a model (tasks/quantize_model.cpp says how).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace qlora {

struct QuantizeOptions {
  std::string model, quant, out, eval_text, dtype = "auto";
  bool double_quant = false;
  int blocksize = 0;  // nf4/fp4; 0: 64
  int threads = 0;
  int64_t eval_seq_len = 256, eval_max_tokens = 8192;
};

// Checks the options before any work, quantizes every projection (size and error per layer on
// stdout, with progress and ETA), writes `out` atomically and, with eval_text, prints the
// perplexity before and after on a backend from `eval_backend` (called only then).
void quantize_model(const QuantizeOptions& o, const std::function<std::unique_ptr<Backend>()>& eval_backend);

}  // namespace qlora
