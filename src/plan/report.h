// Plan reports: the human table per category with the speed estimate, the --json form, the
// --fit summary and the --compare side-by-side table.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/fit.h"
#include "plan/planner.h"

namespace qlora {

struct ReportOptions {
  bool buffers = false;                  // list every planned buffer
  std::vector<std::string> suggestions;  // from suggest_fixes, shown when it does not fit
};

std::string plan_text(const PlanResult& p, const ReportOptions& o = {});
// Fields: fits, total_bytes, device_bytes, headroom_bytes, host_bytes, categories{name: bytes},
// overhead[{name, bytes}], step_time_s, tokens_per_second, tokens_per_second_per_gpu, mfu,
// flops_per_step, flops_per_token{forward, backward, recompute}, time_s{...}, memory_traffic_bytes{...},
// comm_bytes{...}, request{...}, gpu{...}, assumptions{measured, notes[]}, warnings[], why[],
// suggestions[], backend_buffers[{name, bytes, host}] (the CUDA backend's own planned memory, part
// of workspace; empty for CPU plans) with backend_device_bytes, and buffers[] when asked.
nlohmann::json plan_json(const PlanResult& p, const ReportOptions& o = {});

std::string fit_text(const FitReport& f, const PlanRequest& req);
nlohmann::json fit_json(const FitReport& f);

std::string compare_text(const std::vector<PlanResult>& plans);
nlohmann::json compare_json(const std::vector<PlanResult>& plans);

}  // namespace qlora
