// `qlora generate`'s work: greedy answers of a model (and adapter) to prompts, through the training
// forward with a KV cache (model/generate.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace qlora {

struct GenerateOptions {
  std::string model, adapter, file, chat_template, base_precision, device = "cpu";
  std::vector<std::string> prompts;  // non-empty, none empty
  bool chat = false, raw = false;    // the chat template required / not used
  int64_t max_new_tokens = 128;
  int threads = 0;
};

// Loads the model as training holds it on the backend `make_backend` returns, answers each prompt
// (stdout) and reports the load time and speed (stderr).
void generate_answers(const GenerateOptions& o, const std::function<std::unique_ptr<Backend>()>& make_backend);

}  // namespace qlora
