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

const std::vector<std::string>& plan_base_precisions() {
  static const std::vector<std::string> p = {"bf16", "fp16", "fp32", "fp8", "nf4", "fp4", "nvfp4", "mxfp4"};
  return p;
}

bool is_quantized_precision(const std::string& p) {
  return p == "fp8" || p == "nf4" || p == "fp4" || p == "nvfp4" || p == "mxfp4";
}

bool is_bnb_4bit(const std::string& p) { return p == "nf4" || p == "fp4"; }

PlanRequest normalize_request(const PlanRequest& in) {
  PlanRequest r = in;
  const std::vector<std::string> methods = {"full", "lora", "qlora"};
  if (std::find(methods.begin(), methods.end(), r.method) == methods.end()) bad_choice("--method", r.method, methods);

  // The CPU computes in f32 (the reference precision), GPUs in bf16.
  if (r.base_precision.empty()) r.base_precision = r.method == "qlora" ? "nf4" : r.gpu.is_cpu ? "fp32" : "bf16";
  const auto& precs = plan_base_precisions();
  if (std::find(precs.begin(), precs.end(), r.base_precision) == precs.end())
    bad_choice("--base-precision", r.base_precision, precs);
  const bool quant = is_quantized_precision(r.base_precision);
  const std::string combo = "--method " + r.method + " --base-precision " + r.base_precision;
  if (r.method == "qlora" && !quant)
    fail(ErrorKind::Config, combo, "QLoRA needs a quantized frozen base, not " + r.base_precision,
         "use --base-precision nf4 (or fp4, nvfp4, mxfp4, fp8), or --method lora for a " + r.base_precision + " base");
  if (r.method == "lora" && quant)
    fail(ErrorKind::Config, combo, "a " + r.base_precision + " base is QLoRA, not LoRA",
         "use --method qlora --base-precision " + r.base_precision + ", or --base-precision bf16 for LoRA");
  if (r.method == "full" && r.base_precision != "bf16")
    fail(ErrorKind::Config, combo, "full fine-tuning trains bf16 weights (with fp32 master copies and AdamW state)",
         quant ? "quantized weights cannot be trained directly: use --method qlora to train adapters on a " + r.base_precision + " base"
               : "drop --base-precision or set it to bf16");

  if (r.double_quant.has_value() && *r.double_quant && !is_bnb_4bit(r.base_precision))
    fail(ErrorKind::Config, "--double-quant", "double quantization applies to the bitsandbytes formats nf4 and fp4 only",
         r.base_precision + " stores its own block scales; drop --double-quant");
  if (!r.double_quant.has_value()) r.double_quant = is_bnb_4bit(r.base_precision);
  if (is_bnb_4bit(r.base_precision)) {
    const int64_t b = r.quant_blocksize;
    if (b < 32 || b > 4096 || (b & (b - 1)) != 0)
      fail(ErrorKind::Config, "--quant-blocksize " + std::to_string(b), "nf4/fp4 block size must be a power of two in [32, 4096]",
           "bitsandbytes uses 64 by default");
  }

  if (r.method != "full") {
    require_positive("--lora-r", r.lora_r);
    std::vector<std::string> t;
    for (const auto& name : r.targets) {
      if (name == "all-linear" || name == "all") {
        t = all_linear_targets();
        break;
      }
      const auto& all = all_linear_targets();
      if (std::find(all.begin(), all.end(), name) == all.end()) {
        std::vector<std::string> choices = all;
        choices.push_back("all-linear");
        bad_choice("--targets", name, choices);
      }
      if (std::find(t.begin(), t.end(), name) == t.end()) t.push_back(name);
    }
    if (t.empty()) t = all_linear_targets();
    // Keep layer order so plans and names are stable whatever order the user wrote.
    std::vector<std::string> ordered;
    for (const auto& a : all_linear_targets())
      if (std::find(t.begin(), t.end(), a) != t.end()) ordered.push_back(a);
    r.targets = ordered;
  } else {
    r.targets.clear();
  }

  if (r.optimizer_dtype == "f32") r.optimizer_dtype = "fp32";
  if (r.optimizer_dtype != "fp32" && r.optimizer_dtype != "bf16")
    bad_choice("--optimizer-dtype", r.optimizer_dtype, {"fp32", "bf16"});
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
