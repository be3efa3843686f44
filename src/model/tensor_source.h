// TensorSource: where the engine reads a checkpoint's weights from, by Hugging Face tensor name,
// and sources derived from another by renaming.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "quant/quantize.h"

namespace qlora {

// Fills dst (row-major f32, `shape`) with the Hugging Face tensor `hf_name`; errors name the tensor.
// A checkpoint that stores projections quantized (bitsandbytes 4-bit, `qlora quantize` output)
// dequantizes them in read_f32 and also offers them as they are stored through read_quantized.
struct TensorSource {
  std::function<bool(const std::string& hf_name)> has;
  std::function<void(const std::string& hf_name, const std::vector<int64_t>& shape, float* dst)> read_f32;
  std::string description;  // "model dir /path", for messages
  // How the checkpoint's projections are stored, when quantized (nullopt: plain floats).
  std::optional<QuantParams> stored_quant;
  // The stored quantized weight `hf_name` of shape (rows, cols) into q (blocksize resolved); false
  // when that tensor is stored as plain floats (a module the quantizer skipped). Null when
  // stored_quant is nullopt.
  std::function<bool(const std::string& hf_name, int64_t rows, int64_t cols, QuantizedTensor& q)> read_quantized;
  // A mixture of experts whose checkpoint ships the experts quantized and the rest as floats
  // (gpt-oss's MXFP4, model/mxfp4_experts.h): how the experts are stored (read_quantized hands
  // them over); nullopt otherwise.
  std::optional<QuantParams> stored_expert_quant;
  // A source over a memory-mapped file drops each tensor's pages from the process once a read has
  // copied them (a later read faults them in again), so loading never holds the checkpoint twice.
};

// A source whose tensor `n` is src's tensor `name(n)` (a checkpoint that keeps the engine's
// tensors under another prefix); `description` names it in messages.
TensorSource renamed_source(const TensorSource& src, std::function<std::string(const std::string&)> name,
                            const std::string& description);

}  // namespace qlora
