// Generator: fp32 CPU text generation with a KV cache over a snapshot of a LlamaModel's effective
// weights (quantized base dequantized, LoRA merged), for sample answers and `qlora generate`.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/llama_config.h"
#include "model/llama_model.h"

namespace qlora {

class Generator {
 public:
  // Copies every weight to the host in f32 (one dequantization pass over a quantized base): the
  // generator answers as the model is now and does not follow later training. Works whatever
  // backend the model lives on.
  explicit Generator(LlamaModel& model);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  const LlamaConfig& config() const { return cfg_; }
  // Empties the KV cache: the next feed starts a new sequence at position 0.
  void reset();
  // Appends tokens to the sequence and returns the logits (V) that follow the last of them. Several
  // tokens (a prompt) go through each projection as one GEMM; one token as a GEMV over the cache.
  const std::vector<float>& feed(const std::vector<int32_t>& ids);
  // The logits of the last feed.
  const std::vector<float>& logits() const { return logits_; }
  // Tokens in the cache (the position the next token gets).
  int64_t position() const { return n_past_; }

  // Greedy decoding of a fresh sequence: up to max_new_tokens argmax tokens after `prompt`,
  // stopping after the first one in stop_ids (which is returned as the last id). Deterministic.
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                              const std::vector<int32_t>& stop_ids);

 private:
  struct Layer;
  void ensure_capacity(int64_t tokens);
  void layer_fwd(Layer& L, int64_t n);
  void attend(const Layer& L, int64_t n);

  LlamaConfig cfg_;
  std::unique_ptr<Backend> cpu_;  // the CPU reference ops (rmsnorm, rope, swiglu, sgemm)
  std::vector<Layer> layers_;
  std::vector<float> embed_, norm_, head_;  // head_ empty: tied to embed_
  std::vector<float> inv_freq_;             // (D/2), rope scaling included
  int64_t n_past_ = 0, capacity_ = 0;       // tokens cached / cache rows allocated per layer
  std::vector<float> logits_;               // (V)
  // Scratch for one feed of n tokens.
  std::vector<float> x_, ln_, rstd_, q_, k_, v_, att_, tmp_, gate_, up_;
  std::vector<int32_t> pos_;
};

// Index of the largest logit; ties go to the lowest id. NaN never wins.
int32_t argmax_token(const std::vector<float>& logits);

}  // namespace qlora
