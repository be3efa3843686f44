// Generator: greedy decoding over a DecoderModel's KV cache. Every token goes through the model's own
// forward (DecoderModel::decode: the training layer code, on the training backend, with the base as
// held for training and the LoRA adapters applied unmerged); this file only chooses tokens.
#pragma once
#include <cstdint>
#include <vector>

#include "model/llama_config.h"
#include "model/decoder_model.h"

namespace qlora {

class Generator {
 public:
  // The model must be planned with a KV cache (ModelPlanOptions::kv_cache_tokens > 0); the cache
  // is the model's, emptied here. The generator answers with the model's weights as they are at
  // each call.
  explicit Generator(DecoderModel& model);
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  const LlamaConfig& config() const { return model_.config(); }
  // Empties the KV cache: the next feed starts a new sequence at position 0.
  void reset() { model_.kv_reset(); }
  // Appends tokens to the sequence and returns the logits (V) that follow the last of them.
  const std::vector<float>& feed(const std::vector<int32_t>& ids) { return model_.decode(ids); }
  // Tokens in the cache (the position the next token gets).
  int64_t position() const { return model_.kv_position(); }
  // Positions the cache holds: prompt plus answer.
  int64_t capacity() const { return model_.kv_capacity(); }

  // Greedy decoding of a fresh sequence: up to max_new_tokens argmax tokens after `prompt`,
  // stopping after the first one in stop_ids (which is returned as the last id), or when the KV
  // cache is full. Deterministic.
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                              const std::vector<int32_t>& stop_ids);

 private:
  DecoderModel& model_;
};

// Index of the largest logit; ties go to the lowest id. NaN never wins.
int32_t argmax_token(const std::vector<float>& logits);

}  // namespace qlora
