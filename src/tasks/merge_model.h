// `qlora merge`'s work: the base with a PEFT adapter folded in, written as a Hugging Face model
// directory (tasks/merge_model.cpp says how).
#pragma once
#include <string>

namespace qlora {

struct MergeOptions {
  std::string model, adapter, out;
  std::string dtype;                   // bf16 | fp16 | fp32; "": the base's float dtype (bf16 for a quantized base)
  std::string max_shard_size = "5GB";  // largest safetensors file before sharding
  bool force = false;                  // replace a non-empty `out`
};

// Checks the options before any work, writes `out` atomically (it appears complete or not at all),
// reports progress on stderr and the summary on stdout. Stops at the next tensor, removing the
// temporary output, once g_stop_requested is set (train/trainer.h).
void merge_model(const MergeOptions& o);

}  // namespace qlora
