// Greedy decoding: argmax over the logits DecoderModel::decode returns, one token at a time.
#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"

namespace qlora {

Generator::Generator(DecoderModel& model) : model_(model) {
  if (model.kv_capacity() <= 0)
    fail(ErrorKind::Internal, "generate", "the model was planned without a KV cache",
         "set ModelPlanOptions::kv_cache_tokens to the longest prompt plus answer");
  model.kv_reset();  // a new generator starts a new sequence
}

std::vector<int32_t> Generator::greedy(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                       const std::vector<int32_t>& stop_ids) {
  reset();
  std::vector<int32_t> out;
  if (max_new_tokens <= 0) return out;
  if (int64_t(prompt.size()) >= capacity())
    fail(ErrorKind::Config, "generate",
         "the prompt of " + std::to_string(prompt.size()) + " tokens leaves no room in the KV cache of " +
             std::to_string(capacity()) + " positions",
         "shorten the prompt");
  const std::vector<float>* logits = &feed(prompt);
  for (;;) {
    const int32_t next = argmax_token(*logits);
    out.push_back(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
    if (int64_t(out.size()) >= max_new_tokens || position() >= capacity()) break;
    logits = &feed({next});
  }
  return out;
}

int32_t argmax_token(const std::vector<float>& logits) {
  int32_t best = 0;
  float bv = -std::numeric_limits<float>::infinity();
  bool found = false;
  for (size_t i = 0; i < logits.size(); i++)
    if (!found ? !std::isnan(logits[i]) : logits[i] > bv) {  // strict >: the lowest id keeps a tie
      best = int32_t(i);
      bv = logits[i];
      found = true;
    }
  return best;
}

}  // namespace qlora
