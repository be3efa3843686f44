// Plan reports in text and JSON.
#include "plan/report.h"

#include <algorithm>
#include <cstdio>

#include "model/backend_plan.h"
#include "plan/units.h"

namespace qlora {

namespace {

using json = nlohmann::json;

std::string pad(const std::string& s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

std::string label(const PlanRequest& r) { return r.model_label.empty() ? r.model.name : r.model_label; }

std::string method_text(const PlanRequest& r) {
  std::string m = r.method == Method::Full ? "full fine-tune" : r.method == Method::Lora ? "LoRA" : "QLoRA";
  m += std::string(", base ") + base_precision_name(r.base());
  if (r.double_quant.value_or(false)) m += " + double quant";
  if (r.expert_precision && *r.expert_precision != r.base())  // gpt-oss: its MXFP4 experts as shipped
    m += std::string(", experts ") + base_precision_name(*r.expert_precision);
  if (r.method != Method::Full) {
    m += ", r=" + std::to_string(r.lora.r) + " on ";
    const bool all = !r.model.moe() && r.lora.targets == lora_modules(r.model);  // a MoE model's are the attention's
    m += all ? std::string("all-linear") : "";
    if (!all)
      for (size_t i = 0; i < r.lora.targets.size(); i++) m += (i ? "," : "") + r.lora.targets[i];
    for (size_t i = 0; i < r.lora.expert_targets.size(); i++)
      m += (i ? "," : " + experts' ") + r.lora.expert_targets[i];
  }
  if (is_preference(r.objective))
    m += std::string(", ") + objective_name(r.objective) + " (rows of two documents" +
         (uses_reference(r.objective)
              ? (r.reference_precomputed ? ", reference log-probs computed before training"
                                         : ", a reference forward with the adapters off")
              : "") +
         ")";
  return m;
}

std::string shape_text(const PlanResult& p) {
  const PlanRequest& r = p.req;
  std::string s = "micro-batch " + std::to_string(r.micro_batch) + " x " + std::to_string(r.seq_len) +
                  " tokens, grad-accum " + std::to_string(r.grad_accum) + ", packing " + (r.packing ? "on" : "off");
  if (r.avg_doc_len > 0) s += " (examples ~" + std::to_string(r.avg_doc_len) + " tokens)";
  s += std::string(", checkpointing ") + checkpointing_name(r.checkpointing);
  if (const int64_t tile = p.options.mlp_tile; tile > 0)
    s += " (MLP in tiles of " + std::to_string(tile) + (r.mlp_tile > 0 ? " tokens)" : " tokens, auto)");
  s += ", CE chunk " + std::to_string(r.ce_chunk) + ", AdamW state " + optimizer_dtype_name(r.optimizer_dtype) + ", GEMMs " +
       gemm_dtype_name(r.gemm_dtype);
  if (p.options.attn_dq == AttnDq::Recompute)
    s += std::string(", attention dQ in its own pass (no f32 accumulator") + (r.attn_dq ? ")" : ", auto)");
  return s;
}

std::string topo_text(const PlanRequest& r) {
  std::string s = std::to_string(r.topo.world()) + " x " + r.gpu.display;
  if (r.topo.nodes > 1) s += " (" + std::to_string(r.topo.nodes) + " nodes x " + std::to_string(r.topo.gpus_per_node) + ")";
  if (r.topo.world() > 1) s += std::string(", sharding ") + sharding_name(r.sharding);
  return s;
}

std::string gpu_text(const GpuSpec& g) {
  if (g.is_cpu)
    return fmt_gib(double(g.mem_bytes)) + " RAM, measured: " + fmt_fixed(g.mem_bw / 1e9, 1) + " GB/s, f32 GEMM " +
           fmt_fixed(g.bf16_tflops * 1e3, 0) + " GFLOP/s, LoRA-rank GEMM " + fmt_fixed(g.lora_tflops * 1e3, 0) +
           ", attention " + fmt_fixed(g.attn_tflops * 1e3, 0) + " GFLOP/s";
  std::string s = fmt_gib(double(g.mem_bytes)) + ", " + fmt_fixed(g.mem_bw / 1e12, 2) + " TB/s, dense bf16 " +
                  fmt_fixed(g.bf16_tflops, 0);
  if (g.fp8_tflops > 0) s += " / fp8 " + fmt_fixed(g.fp8_tflops, 0);
  if (g.fp4_tflops > 0) s += " / fp4 " + fmt_fixed(g.fp4_tflops, 0);
  return s + " TFLOP/s";
}

std::string seconds(double s) {
  if (s == 0) return "0 s";
  if (s < 1e-3) return fmt_fixed(s * 1e6, 1) + " us";
  if (s < 1) return fmt_fixed(s * 1e3, 2) + " ms";
  return fmt_fixed(s, 3) + " s";
}

json request_json(const PlanResult& p) {
  const PlanRequest& r = p.req;
  return {{"model", label(r)},
          {"params", r.model.n_params()},
          {"method", method_name(r.method)},
          {"objective", objective_name(r.objective)},
          {"base_precision", base_precision_name(r.base())},
          {"expert_precision", r.expert_precision ? json(base_precision_name(*r.expert_precision)) : json(nullptr)},
          {"double_quant", r.double_quant.value_or(false)},
          {"lora_r", r.method == Method::Full ? 0 : r.lora.r},
          {"targets", r.lora.targets},
          {"target_parameters", peft_target_parameters(r.lora)},
          {"optimizer_dtype", optimizer_dtype_name(r.optimizer_dtype)},
          {"micro_batch", r.micro_batch},
          {"seq_len", r.seq_len},
          {"grad_accum", r.grad_accum},
          {"packing", r.packing},
          {"avg_doc_len", r.avg_doc_len},
          {"checkpointing", checkpointing_name(r.checkpointing)},
          {"ce_chunk", r.ce_chunk},
          {"mlp_tile", p.options.mlp_tile},  // resolved: 0 untiled
          {"attention_dq", attn_dq_name(p.options.attn_dq)},  // resolved
          {"sharding", sharding_name(r.sharding)},
          {"gpus_per_node", r.topo.gpus_per_node},
          {"nodes", r.topo.nodes},
          {"gemm_dtype", gemm_dtype_name(r.gemm_dtype)}};
}

json gpu_json(const GpuSpec& g) {
  return {{"name", g.name}, {"display", g.display}, {"mem_bytes", g.mem_bytes}, {"mem_bw_bytes_per_s", g.mem_bw},
          {"bf16_tflops", g.bf16_tflops}, {"fp8_tflops", g.fp8_tflops}, {"fp4_tflops", g.fp4_tflops},
          {"link_bw_bytes_per_s", g.link_bw}, {"net_bw_bytes_per_s", g.net_bw}, {"host_bw_bytes_per_s", g.host_bw},
          {"has_backend", g.has_backend}, {"source", g.source}};
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "(";
  for (size_t i = 0; i < s.size(); i++) o += (i ? "," : "") + std::to_string(s[i]);
  return o + ")";
}

const char* lifetime_name(Lifetime l) {
  return l == Lifetime::Persistent ? "persistent" : l == Lifetime::Step ? "step" : "layer";
}

}  // namespace

std::string plan_text(const PlanResult& p, const ReportOptions& o) {
  const PlanRequest& r = p.req;
  const SpeedEstimate& s = p.speed;
  std::string t;
  t += "qlora plan: " + label(r) + " (" + fmt_params(double(r.model.n_params())) + "), " + method_text(r) + "\n";
  t += "  device: " + topo_text(r) + " [" + gpu_text(r.gpu) + "]\n";
  t += "  shape:  " + shape_text(p) + "\n\n";

  t += "memory per GPU\n";
  for (const auto& [c, b] : p.categories) {
    t += "  " + pad(mem_category_name(c), 14) + pad(fmt_gib(double(b)), 14, true) +
         pad(fmt_fixed(p.total_bytes ? 100.0 * double(b) / double(p.total_bytes) : 0, 1) + "%", 8, true);
    if (c == MemCategory::Overhead) t += "   estimated, not planned:";
    t += "\n";
    if (c == MemCategory::Overhead)
      for (const auto& [name, bytes] : p.plan.overhead) t += "      " + pad(name, 52) + pad(fmt_gib(double(bytes)), 12, true) + "\n";
    if (c == MemCategory::Workspace) {  // the CUDA backend's own memory, planned (GPU plans only)
      int64_t dev = 0, host = 0;
      std::string lines;
      for (const auto& b : p.plan.buffers) {
        if (!is_backend_buffer(b)) continue;
        (b.host ? host : dev) += MemoryPlan::aligned(b.bytes);
        lines += "      " + pad(b.name, 24) + pad(backend_buffer_description(b.name), 30) +
                 pad(fmt_gib(double(MemoryPlan::aligned(b.bytes))), 10, true) + "\n";
      }
      if (!lines.empty())
        t += "    of which the CUDA backend's own (planned):\n" + lines + "      " +
             pad("CUDA backend, device total (+ " + fmt_gib(double(host)) + " pinned host)", 54) +
             pad(fmt_gib(double(dev)), 10, true) + "\n";
    }
  }
  t += "  " + pad("total", 14) + pad(fmt_gib(double(p.total_bytes)), 14, true) + "\n";
  t += "  " + pad("device", 14) + pad(fmt_gib(double(p.device_bytes)), 14, true) + "\n";
  t += "  " + pad("headroom", 14) + pad(fmt_gib(double(p.headroom_bytes)), 14, true) +
       pad(fmt_fixed(100.0 * double(p.headroom_bytes) / double(p.device_bytes), 1) + "%", 8, true) + "\n";
  if (p.host_bytes > 0) t += "  " + pad("host (pinned)", 14) + pad(fmt_gib(double(p.host_bytes)), 14, true) + "\n";
  if (!p.per_rank_bytes.empty()) {  // fsdp: the byte split's remainders go to the higher ranks
    const auto [lo, hi] = std::minmax_element(p.per_rank_bytes.begin(), p.per_rank_bytes.end());
    t += "  fsdp: each rank holds 1/" + std::to_string(p.per_rank_bytes.size()) +
         " of every decoder layer's base; ranks' buffers " + std::to_string(*lo) + " to " + std::to_string(*hi) +
         " bytes (the table shows the last rank's)\n";
  }
  t += std::string("fits: ") + (p.fits ? "yes" : "NO") + "\n";
  for (const auto& w : p.why) t += "  why: " + w + "\n";
  if (!p.fits && !o.suggestions.empty()) {
    t += "  what would fit:\n";
    for (const auto& sgg : o.suggestions) t += "    " + sgg + "\n";
  }

  t += std::string("\nspeed") + (p.fits ? "" : " (if it fit)") + " - an estimate: time = FLOPs/(peak x efficiency) + bytes/bandwidth + exposed communication\n";
  const FlopCounts& f = s.per_token;
  t += "  FLOPs per token   " + fmt_si(f.total(), "FLOP") + " (forward " + fmt_si(f.fwd.total(), "") + ", backward " +
       fmt_si(f.bwd.total(), "") + ", recompute " + fmt_si(f.recompute.total(), "") +
       (f.reference.total() > 0 ? ", reference " + fmt_si(f.reference.total(), "") : std::string()) + "; attention " +
       fmt_si(f.fwd.attn + f.bwd.attn + f.recompute.attn + f.reference.attn, "") + ")\n";
  t += "  FLOPs per step    " + fmt_si(s.flops_per_step, "FLOP") + " over " + fmt_si(s.tokens_per_step, "tokens") + " on " +
       std::to_string(r.topo.world()) + " GPU(s)\n";
  t += "  GEMMs             " + seconds(s.t_gemm) + "\n";
  t += "  attention         " + seconds(s.t_attn) + (s.attention_path.empty() ? "" : " (" + s.attention_path + ")") + "\n";
  double traffic = 0;
  for (const auto& [k, v] : s.memory_bytes) traffic += v;
  if (s.t_dequant > 0)
    t += "  base dequant      " + seconds(s.t_dequant) + " on a side stream, exposed " + seconds(s.t_dequant_exposed) +
         " (the next layer's, beside this layer's GEMMs)\n";
  t += "  memory-bound      " + seconds(s.t_memory) + " (" + fmt_gib(traffic) + " moved:";
  for (size_t i = 0; i < s.memory_bytes.size(); i++)
    if (s.memory_bytes[i].second > 0) t += " " + s.memory_bytes[i].first + " " + fmt_gib(s.memory_bytes[i].second) + ";";
  if (t.back() == ';') t.back() = ')';
  else t += ")";
  t += "\n";
  if (s.t_comm > 0) {
    t += "  communication     " + seconds(s.t_comm) + ", exposed " + seconds(s.t_comm_exposed) + " (";
    for (size_t i = 0; i < s.comm_bytes.size(); i++)
      t += std::string(i ? "; " : "") + s.comm_bytes[i].first + " " + fmt_gib(s.comm_bytes[i].second);
    t += ")\n";
  }
  if (s.t_offload > 0) t += "  offload (PCIe)    " + seconds(s.t_offload) + ", exposed " + seconds(s.t_offload_exposed) + "\n";
  t += "  step time         " + seconds(s.step_time_s) + "\n";
  t += "  throughput        " + fmt_si(s.tokens_per_second, "tok/s") + " (" + fmt_si(s.tokens_per_second_per_gpu, "tok/s") +
       " per GPU), MFU " + fmt_fixed(100 * s.mfu, 1) + "% of bf16 peak\n";
  if (r.gpu.is_cpu) {
    t += "rates: " + r.gpu.source + "\n";
  } else {
    t += "assumptions (speed and overhead; in src/plan/assumptions.h):\n";
    for (const auto& a : describe_assumptions(plan_assumptions())) t += "  - " + a + "\n";
  }
  if (!p.warnings.empty()) {
    t += "warnings:\n";
    for (const auto& w : p.warnings) t += "  - " + w + "\n";
  }
  if (o.buffers) {
    t += "\nbuffers (" + std::to_string(p.plan.buffers.size()) + "; bytes before 256-byte alignment):\n";
    for (const auto& b : p.plan.buffers)
      t += "  " + pad(b.name, 44) + " " + pad(mem_category_name(b.category), 12) + pad(dtype_name(b.dtype), 6) +
           pad(shape_str(b.shape), 22) + pad(lifetime_name(b.lifetime), 11) + pad(std::to_string(b.bytes) + " B", 16, true) +
           (b.host ? " host" : "") + "\n";
  }
  return t;
}

json plan_json(const PlanResult& p, const ReportOptions& o) {
  const SpeedEstimate& s = p.speed;
  json cats = json::object();
  for (const auto& [c, b] : p.categories) cats[mem_category_name(c)] = b;
  json over = json::array();
  for (const auto& [n, b] : p.plan.overhead) over.push_back({{"name", n}, {"bytes", b}});
  json traffic = json::object(), comm = json::object();
  for (const auto& [k, v] : s.memory_bytes) traffic[k] = v;
  for (const auto& [k, v] : s.comm_bytes) comm[k] = v;
  json j = {{"fits", p.fits},
            {"total_bytes", p.total_bytes},
            {"device_bytes", p.device_bytes},
            {"headroom_bytes", p.headroom_bytes},
            {"host_bytes", p.host_bytes},
            {"categories", cats},
            {"overhead", over},
            {"step_time_s", s.step_time_s},
            {"tokens_per_second", s.tokens_per_second},
            {"tokens_per_second_per_gpu", s.tokens_per_second_per_gpu},
            {"mfu", s.mfu},
            {"attention_path", s.attention_path},
            {"flops_per_step", s.flops_per_step},
            {"tokens_per_step", s.useful_tokens_per_step},
            {"flops_per_token", {{"forward", s.per_token.fwd.total()}, {"backward", s.per_token.bwd.total()},
                                 {"recompute", s.per_token.recompute.total()},
                                 {"reference", s.per_token.reference.total()}, {"total", s.per_token.total()}}},
            {"time_s", {{"gemm", s.t_gemm}, {"attention", s.t_attn}, {"memory_bound", s.t_memory},
                        {"communication", s.t_comm}, {"communication_exposed", s.t_comm_exposed},
                        {"offload", s.t_offload}, {"offload_exposed", s.t_offload_exposed},
                        {"dequant", s.t_dequant}, {"dequant_exposed", s.t_dequant_exposed}}},
            {"memory_traffic_bytes", traffic},
            {"comm_bytes", comm},
            {"per_rank_bytes", p.per_rank_bytes},
            {"request", request_json(p)},
            {"gpu", gpu_json(p.req.gpu)},
            {"assumptions", {{"measured", plan_assumptions().measured}, {"notes", describe_assumptions(plan_assumptions())}}},
            {"warnings", p.warnings},
            {"why", p.why},
            {"suggestions", o.suggestions}};
  json backend = json::array();
  int64_t backend_dev = 0;
  for (const auto& b : p.plan.buffers)
    if (is_backend_buffer(b)) {
      backend.push_back({{"name", b.name}, {"bytes", MemoryPlan::aligned(b.bytes)}, {"host", b.host}});
      if (!b.host) backend_dev += MemoryPlan::aligned(b.bytes);
    }
  j["backend_buffers"] = backend;
  j["backend_device_bytes"] = backend_dev;
  if (o.buffers) {
    json bufs = json::array();
    for (const auto& b : p.plan.buffers)
      bufs.push_back({{"name", b.name}, {"bytes", b.bytes}, {"category", mem_category_name(b.category)},
                      {"dtype", dtype_name(b.dtype)}, {"shape", b.shape}, {"lifetime", lifetime_name(b.lifetime)},
                      {"host", b.host}});
    j["buffers"] = bufs;
  }
  return j;
}

std::string fit_text(const FitReport& f, const PlanRequest& in) {
  const PlanRequest r = normalize_request(in);
  std::string t = "qlora plan --fit: " + label(r) + ", " + method_text(r) + " on " + topo_text(r) + "\n";
  t += "  longest sequence at micro-batch " + std::to_string(r.micro_batch) + ": " +
       (f.max_seq_len > 0 ? std::to_string(f.max_seq_len) + " tokens (multiple of 128)" : std::string("none fits")) + "\n";
  if (f.max_seq_len > r.model.max_position_embeddings)
    t += "    (beyond max_position_embeddings " + std::to_string(r.model.max_position_embeddings) + ": needs RoPE scaling)\n";
  if (!f.max_seq_len_by_checkpointing.empty()) {
    t += "  longest sequence by checkpointing:";
    for (const auto& [ck, T] : f.max_seq_len_by_checkpointing)
      t += std::string(ck == f.max_seq_len_by_checkpointing.front().first ? " " : ", ") + checkpointing_name(ck) + " " +
           (T > 0 ? std::to_string(T) : std::string("none fits"));
    t += "\n";
  }
  t += "  largest micro-batch at " + std::to_string(r.seq_len) + " tokens (checkpointing " + checkpointing_name(r.checkpointing) + "): " +
       (f.max_micro_batch > 0 ? std::to_string(f.max_micro_batch) : std::string("none fits")) + "\n";
  t += "  fastest configuration (" + std::to_string(f.fitting) + " of " + std::to_string(f.candidates) +
       " candidates fit; searched " + f.space + "):\n";
  if (!f.has_fastest) return t + "    none fits\n";
  const PlanRequest& b = f.fastest.req;
  const PlanResult& p = f.fastest.result;
  t += "    --micro-batch " + std::to_string(b.micro_batch) + " --grad-accum " + std::to_string(b.grad_accum) +
       " --checkpointing " + checkpointing_name(b.checkpointing) + (b.topo.world() > 1 ? std::string(" --sharding ") + sharding_name(b.sharding) : "") +
       ": " + fmt_gib(double(p.total_bytes)) + " of " + fmt_gib(double(p.device_bytes)) + ", step " +
       fmt_fixed(p.speed.step_time_s, 3) + " s, " + fmt_si(p.speed.tokens_per_second, "tok/s") + " (estimate)\n";
  return t;
}

json fit_json(const FitReport& f) {
  json j = {{"max_seq_len", f.max_seq_len}, {"max_micro_batch", f.max_micro_batch},
            {"candidates", f.candidates}, {"fitting", f.fitting}, {"searched", f.space}};
  json by_ckpt = json::object();
  for (const auto& [ck, T] : f.max_seq_len_by_checkpointing) by_ckpt[checkpointing_name(ck)] = T;
  j["max_seq_len_by_checkpointing"] = by_ckpt;
  j["fastest"] = f.has_fastest ? plan_json(f.fastest.result) : json(nullptr);
  return j;
}

std::string compare_text(const std::vector<PlanResult>& plans) {
  if (plans.empty()) return "";
  const PlanRequest& r0 = plans[0].req;
  std::string t = "qlora plan --compare: " + label(r0) + ", " + method_text(r0) + "\n  " + shape_text(plans[0]) + "\n\n";
  const size_t w = 16;
  auto row = [&](const std::string& name, auto cell) {
    std::string line = "  " + pad(name, 22);
    for (const auto& p : plans) line += pad(cell(p), w, true);
    t += line + "\n";
  };
  row("", [](const PlanResult& p) { return p.req.topo.world() > 1 ? std::to_string(p.req.topo.world()) + "x" + p.req.gpu.name : p.req.gpu.name; });
  row("device memory", [](const PlanResult& p) { return fmt_gib(double(p.device_bytes)); });
  row("needed per GPU", [](const PlanResult& p) { return fmt_gib(double(p.total_bytes)); });
  row("fits", [](const PlanResult& p) { return std::string(p.fits ? "yes" : "NO"); });
  row("headroom", [](const PlanResult& p) { return fmt_gib(double(p.headroom_bytes)); });
  row("step time", [](const PlanResult& p) { return seconds(p.speed.step_time_s); });
  row("tokens/s (all GPUs)", [](const PlanResult& p) { return fmt_si(p.speed.tokens_per_second, ""); });
  row("tokens/s per GPU", [](const PlanResult& p) { return fmt_si(p.speed.tokens_per_second_per_gpu, ""); });
  row("MFU (bf16 peak)", [](const PlanResult& p) { return fmt_fixed(100 * p.speed.mfu, 1) + "%"; });
  row("dense bf16 TFLOP/s", [](const PlanResult& p) { return fmt_fixed(p.req.gpu.bf16_tflops, 0); });
  row("memory TB/s", [](const PlanResult& p) { return fmt_fixed(p.req.gpu.mem_bw / 1e12, 2); });
  t += "speed figures are estimates resting on placeholder efficiencies (src/plan/assumptions.h); no measurements yet\n";
  return t;
}

json compare_json(const std::vector<PlanResult>& plans) {
  json a = json::array();
  for (const auto& p : plans) a.push_back(plan_json(p));
  return {{"compare", a}};
}

}  // namespace qlora
