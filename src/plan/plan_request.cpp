// Request validation: option values, method/precision combinations, device capabilities.
#include "plan/plan_request.h"

#include <algorithm>

#include "core/error.h"
#include "io/json_util.h"
#include "model/model_plan.h"

namespace qlora {

namespace {

[[noreturn]] void bad_choice(const std::string& option, const std::string& value,
                             const std::vector<std::string>& choices, const std::string& extra = "") {
  std::string close = closest_name(choices, value, 3);
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  fail(ErrorKind::Config, option + " " + value, "unknown value '" + value + "'",
       (close.empty() ? std::string() : "did you mean '" + close + "'? ") + "choose one of " + list + extra);
}

void require_positive(const std::string& option, int64_t v) {
  if (v < 1) fail(ErrorKind::Config, option + " " + std::to_string(v), "must be at least 1");
}

}  // namespace

PlanRequest normalize_request(const PlanRequest& in) {
  PlanRequest r = in;
  // The CPU computes in f32 (the reference precision), GPUs in bf16.
  static_cast<EngineSpec&>(r) = normalize_engine_spec(r, r.compute_dtype());

  if (r.method != Method::Full) {
    require_positive("--lora-r", r.lora.r);
    // The seven projections, and this model's fused modules (Phi-3's qkv_proj, gate_up_proj).
    std::vector<std::string> known = all_linear_targets();
    for (const auto& m : lora_modules(r.model))
      if (std::find(known.begin(), known.end(), m) == known.end()) known.push_back(m);
    std::vector<std::string> t;
    for (const auto& name : r.lora.targets) {
      if (name == "all-linear" || name == "all") {
        t = all_linear_targets();
        break;
      }
      if (std::find(known.begin(), known.end(), name) == known.end()) {
        std::vector<std::string> choices = known;
        choices.push_back("all-linear");
        bad_choice("--targets", name, choices);
      }
      if (std::find(t.begin(), t.end(), name) == t.end()) t.push_back(name);
    }
    if (t.empty()) t = lora_modules(r.model);  // unset: every module the engine adapts in this model
    // The model's LoRA modules in layer order, so plans and names are stable whatever order the
    // user wrote (a fused model's q/k/v become qkv_proj; a part of a fused module alone is refused).
    r.lora.targets = lora_targets_for(r.model, t);
    check_expert_targets(r.model, r.lora.expert_targets, r.lora.dropout);
  }

  if (r.router_aux_loss_coef) override_router_aux_loss_coef(r.model, *r.router_aux_loss_coef, "router_aux_loss_coef");
  // Experts as the checkpoint ships them (gpt-oss: MXFP4) unless asked otherwise.
  if (!r.expert_precision && r.model.experts_stored == "mxfp4") r.expert_precision = BasePrecision::Mxfp4;
  if (r.expert_precision && !r.model.moe())
    fail(ErrorKind::Config, "--expert-precision", "model '" + r.model.name + "' has no experts");
  require_positive("--micro-batch", r.micro_batch);
  require_positive("--seq-len", r.seq_len);
  require_positive("--grad-accum", r.grad_accum);
  require_positive("--ce-chunk", r.ce_chunk);
  require_positive("--gpus-per-node", r.topo.gpus_per_node);
  require_positive("--nodes", r.topo.nodes);
  if (r.avg_doc_len < 0) fail(ErrorKind::Config, "--avg-doc-len", "must be >= 0 (0 = one example fills a sequence)");
  if (r.avg_doc_len > r.seq_len)
    fail(ErrorKind::Config, "--avg-doc-len " + std::to_string(r.avg_doc_len),
         "mean example length exceeds --seq-len " + std::to_string(r.seq_len),
         "longer examples are truncated to the sequence length: raise --seq-len or lower --avg-doc-len");
  // The CPU backend computes FP8/FP4 GEMMs' arithmetic in f32 (at its calibrated f32 rate).
  if (!r.gpu.is_cpu && r.gpu.peak_tflops(r.gemm_dtype) <= 0)
    fail(ErrorKind::Config, std::string("--gemm-dtype ") + gemm_dtype_name(r.gemm_dtype),
         r.gpu.display + " has no " + gemm_dtype_name(r.gemm_dtype) + " tensor cores",
         "use --gemm-dtype bf16" + std::string(r.gpu.fp8_tflops > 0 ? " or fp8" : ""));
  if (r.gpu.mem_bytes <= 0 || r.gpu.bf16_tflops <= 0 || r.gpu.mem_bw <= 0)
    fail(ErrorKind::Config, "--gpu " + r.gpu.name, "device needs positive memory, bandwidth and bf16 peak");
  r.model.validate(r.model_label.empty() ? r.model.name : r.model_label);
  return r;
}

}  // namespace qlora
