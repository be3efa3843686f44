// `qlora eval`'s work: the loss of a model (and adapter) on a training config's eval data.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "train/train_config.h"

namespace qlora {

struct EvalReport {
  double loss = 0;                // the trainer's eval_loss: mean loss per scored token (SFT), or the
                                  // preference objective's mean over the eval batches
  std::string objective = "sft";  // the config's rl
  std::map<std::string, double> metrics;  // preference objectives: rewards/..., logps/... (TRL's names)
  int64_t tokens = 0;             // tokens scored (those training puts loss on)
  int64_t examples = 0, rows = 0, batches = 0;
  std::string data;               // where the eval data came from
};

// The eval data built as training builds its eval batches, the model as training holds it (in one
// process, with the adapter's LoRA when `adapter` is given), on the backend `make_backend` returns;
// progress on stderr. No scored token is an Error(Data).
EvalReport evaluate_model(const TrainConfig& cfg, const std::string& adapter,
                          const std::function<std::unique_ptr<Backend>()>& make_backend);

}  // namespace qlora
