// Searches over plans: the longest sequence and largest micro-batch that fit, the fastest fitting
// configuration for the same training, and concrete fixes when a request does not fit.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "plan/planner.h"

namespace qlora {

// Largest seq_len (a multiple of `granularity`, at most `limit`) whose plan fits; 0 when not even
// `granularity` tokens fit. Relies on memory never shrinking as sequences grow (tested).
int64_t max_seq_len_that_fits(const PlanRequest& req, int64_t granularity = 128, int64_t limit = int64_t(1) << 22);
// Largest micro_batch (at most `limit`) whose plan fits at the request's seq_len; 0 when none.
int64_t max_micro_batch_that_fits(const PlanRequest& req, int64_t limit = 4096);

struct FitCandidate {
  PlanRequest req;
  PlanResult result;
};

struct FitReport {
  int64_t max_seq_len = 0;       // at the request's micro-batch
  // The same with each checkpointing mode ("none", "full", "offload"), at the request's micro-batch:
  // what offload (the layer inputs in pinned host memory) buys in context length.
  std::vector<std::pair<Checkpointing, int64_t>> max_seq_len_by_checkpointing;
  int64_t max_micro_batch = 0;   // at the request's seq_len
  bool has_fastest = false;
  FitCandidate fastest;          // highest tokens/s among fitting candidates
  int candidates = 0, fitting = 0;
  std::string space;             // what was searched, in words
};

// The fastest search keeps the training the same: sequence length, global batch (micro_batch x
// grad_accum per GPU is split as micro-batch x accumulation in every way), method, precisions and
// topology; it varies micro-batch, checkpointing (none/full/offload) and, on several GPUs, sharding.
FitReport fit_search(const PlanRequest& req);

// When `req` does not fit: alternatives that do, each as the options to change and its result.
std::vector<std::string> suggest_fixes(const PlanRequest& req);

}  // namespace qlora
