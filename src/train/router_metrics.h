// Router statistics of a mixture-of-experts run, for metrics.jsonl.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qlora {

// From the tokens each expert received over a step ((layers x experts) row-major, summed over the
// ranks; DecoderModel::routed_tokens):
//   router/load_max_over_mean: the largest expert's share over an even share, worst layer
//     (1 = balanced; experts / experts_per_tok: one expert takes every choice);
//   router/idle_expert_fraction: (layer, expert) pairs that received no token;
//   router/dropped_tokens: 0, as the engine has no expert capacity and drops no token.
// Empty when no token was routed.
std::map<std::string, double> router_metrics(const std::vector<double>& counts, int64_t layers, int64_t experts);

}  // namespace qlora
