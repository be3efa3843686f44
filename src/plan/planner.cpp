// Planner: builds one GPU's plan from the engine's buffer list and judges whether it fits.
#include "plan/planner.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/backend_plan.h"
#include "model/engine_limits.h"
#include "model/gemm_dtype.h"
#include "plan/units.h"

namespace qlora {

namespace {

std::string model_name(const PlanRequest& r) { return r.model_label.empty() ? r.model.name : r.model_label; }

// Non-fatal findings the user should read next to the numbers.
std::vector<std::string> plan_warnings(const PlanRequest& r, const ModelPlanOptions& opts, int64_t host_bytes) {
  std::vector<std::string> w;
  const LlamaConfig& c = r.model;
  if (r.seq_len > c.max_position_embeddings) {
    std::string s = "--seq-len " + std::to_string(r.seq_len) + " exceeds " + model_name(r) +
                    "'s max_position_embeddings " + std::to_string(c.max_position_embeddings) +
                    ": positions past it were not seen in pre-training. ";
    const RopeScaling& rs = c.rope_scaling;
    const double need = double(r.seq_len) / double(c.max_position_embeddings);
    if (rs.type == "none" || rs.type.empty())
      s += "RoPE scaling stretches the rotary frequencies so longer positions map into the trained range; this "
           "model has none: set rope_scaling {\"rope_type\": \"yarn\", \"factor\": " + fmt_fixed(std::ceil(need * 10) / 10, 1) +
           ", \"original_max_position_embeddings\": " + std::to_string(c.max_position_embeddings) +
           "} (or linear) in config.json and fine-tune at the new length. ";
    else
      s += "The model already applies " + rs.type + " RoPE scaling (factor " + fmt_fixed(rs.factor, 1) +
           ") to reach " + std::to_string(c.max_position_embeddings) + " positions; going further needs a factor about " +
           fmt_fixed(rs.factor * need, 1) + " in config.json. ";
    s += "Memory and speed figures do not depend on RoPE scaling.";
    w.push_back(s);
  }
  if (r.sharding != Sharding::None && r.topo.world() == 1)
    w.push_back(std::string("--sharding ") + sharding_name(r.sharding) + " has no effect on one GPU");
  if (r.topo.gpus_per_node > r.gpu.max_gpus_per_node)
    w.push_back(std::to_string(r.topo.gpus_per_node) + " GPUs per node exceed the " + r.gpu.display +
                " fast-interconnect domain of " + std::to_string(r.gpu.max_gpus_per_node) +
                "; intra-node bandwidth beyond it is lower than assumed");
  if (r.gpu.name == "h100-nvl" && r.topo.gpus_per_node > 2)
    w.push_back("H100 NVL cards are bridged in pairs; traffic between pairs goes over PCIe, slower than assumed");
  // What DecoderModel's constructor would refuse for this plan (model/engine_limits.h).
  if (r.gpu.is_cpu || r.gpu.has_backend)
    for (const EngineLimit& l : engine_limits(c, opts, r.gpu.is_cpu ? DeviceKind::Cpu : DeviceKind::Cuda))
      w.push_back("the engine refuses this run: " + l.where + ": " + l.what + " (" + l.hint +
                  "); this is the plan an equivalent runtime would need");
  if (c.moe()) {
    w.push_back("mixture of experts: " + std::to_string(c.experts_per_tok) + " of " + std::to_string(c.n_experts) +
                " experts per token, " + fmt_params(double(c.active_params())) + " of the " + fmt_params(double(c.n_params())) +
                " active; the expert GEMMs' efficiency is the dense GEMMs' (a placeholder: grouped GEMMs over "
                "few rows per expert run slower)");
  }
  if (!r.gpu.has_backend)
    w.push_back("qlora has no backend for " + r.gpu.display + " yet: this is the plan an equivalent runtime would need");
  if (host_bytes > 0)  // offloaded activations only (not the backend's upload staging)
    w.push_back("activation offload keeps " + fmt_gib(double(host_bytes)) + " of pinned host memory per GPU (" +
                fmt_gib(double(host_bytes) * r.topo.gpus_per_node) + " per node)");
  if (!r.packing && r.avg_doc_len > 0)
    w.push_back("without packing each sequence holds one example of ~" + std::to_string(r.avg_doc_len) +
                " tokens padded to " + std::to_string(r.seq_len) + ": " +
                fmt_fixed(100.0 * (1.0 - double(r.avg_doc_len) / double(r.seq_len)), 0) + "% of the compute is padding");
  if (r.method != Method::Full)
    for (const auto& t : r.lora.targets) {
      auto [out, in] = projection_shape(c, t);
      if (r.lora.r > std::min(out, in)) {
        w.push_back("--lora-r " + std::to_string(r.lora.r) + " exceeds the rank of " + t + " (" +
                    std::to_string(std::min(out, in)) + ")");
        break;
      }
    }
  return w;
}

std::vector<std::string> explain_no_fit(const PlanResult& res) {
  std::vector<std::string> why;
  const PlanRequest& r = res.req;
  why.push_back("needs " + fmt_gib(double(res.total_bytes)) + " per GPU but " + r.gpu.display + " has " +
                fmt_gib(double(res.device_bytes)) + " (short by " + fmt_gib(double(-res.headroom_bytes)) + ")");
  std::vector<std::pair<int64_t, MemCategory>> order;
  for (const auto& [c, b] : res.categories) order.push_back({b, c});
  std::sort(order.rbegin(), order.rend());
  std::string top = "largest: ";
  for (size_t i = 0; i < 3 && i < order.size(); i++)
    top += std::string(i ? ", " : "") + mem_category_name(order[i].second) + " " + fmt_gib(double(order[i].first));
  why.push_back(top);
  auto cat = [&](MemCategory c) { return double(res.categories.at(c)); };
  const double dev = double(res.device_bytes);
  if (r.method == Method::Full) {
    int64_t n = 0;
    for (const auto& b : res.replica.buffers)
      if (b.category == MemCategory::Weights) n += b.bytes / dtype_size(b.dtype);
    const double state = cat(MemCategory::Weights) + cat(MemCategory::Grads) + cat(MemCategory::Optimizer);
    const bool master = r.compute_dtype() != DType::F32;  // the plan's fp32 master copy of bf16 weights
    const int64_t per = (master ? 2 + 4 : 4) + 4 + 2 * int64_t(dtype_size(r.optimizer_dtype));
    why.push_back("full fine-tuning holds " + std::to_string(per) + " bytes per parameter (" +
                  (master ? "bf16 weight, fp32 master" : "fp32 weight") + ", fp32 grad, AdamW m+v " +
                  (dtype_size(r.optimizer_dtype) == 4 ? "fp32" : "bf16") + ") x " + fmt_params(double(n)) +
                  (r.sharding == Sharding::None ? " on every GPU" : "") + " = " + fmt_gib(state));
  }
  if (cat(MemCategory::Weights) > dev)
    why.push_back("the weights alone (" + fmt_gib(cat(MemCategory::Weights)) + ") exceed the device: quantize the base (--method qlora) or shard them (--sharding zero3 over more GPUs)");
  if (cat(MemCategory::Activations) > 0.3 * double(res.total_bytes) && r.checkpointing == Checkpointing::None)
    why.push_back("activations (" + fmt_gib(cat(MemCategory::Activations)) + ") are saved for every layer: --checkpointing full keeps only each layer's input");
  return why;
}

}  // namespace

int64_t plan_memory_budget(const PlanRequest& r, const PlanAssumptions& a) {
  int64_t over = 0;
  for (const auto& [name, bytes] : overhead_lines(r, 0, a)) over += bytes;  // the parts that do not scale with the plan
  const double frac = r.gpu.is_cpu ? 0.0 : a.fragmentation_fraction;
  return std::max<int64_t>(0, int64_t(double(r.gpu.mem_bytes - over) / (1.0 + frac)));
}

ModelPlanOptions model_plan_options(const PlanRequest& r, int rank) {
  // ZeRO-1/2/3 are planned over the replica by shard_plan; fsdp is the engine's own buffer list.
  EngineSpec spec = r;
  if (spec.sharding != Sharding::Fsdp) spec.sharding = Sharding::None;
  const int w = r.topo.world();
  ModelPlanOptions o = resolve_engine(spec, {r.compute_dtype(), w, rank < 0 ? w - 1 : rank});
  // The engine's own rule (model/gemm_dtype.h), against this GPU: the plan prices the GEMMs it runs.
  GemmCaps caps;
  if (!r.gpu.is_cpu) caps = {r.gpu.fp8_tflops > 0, r.gpu.fp4_tflops > 0 && r.gpu.sm100, r.gpu.display};
  o.gemm_dtype = resolve_gemm_dtype(o, r.model, caps);
  o.expert_precision = r.expert_precision;
  // The auto MLP tile and attention dQ, as the engine chooses them against the device's memory (the
  // replica's plan; ZeRO sharding then only makes it smaller).
  fit_to_budget(r, r.model, o, r.gpu.is_cpu ? DeviceKind::Cpu : DeviceKind::Cuda, plan_memory_budget(r));
  return o;
}

std::vector<std::pair<std::string, int64_t>> overhead_lines(const PlanRequest& r, int64_t planned, const PlanAssumptions& a) {
  std::vector<std::pair<std::string, int64_t>> o;
  if (r.gpu.is_cpu) {  // host memory: no device context; the process itself beside the arena
    if (r.gpu.program_bytes > 0)
      o.push_back({"program and libraries (this process's resident memory)", r.gpu.program_bytes});
    return o;
  }
  // The cuBLASLt workspace and the op scratch are planned buffers (cuda.*), not overhead.
  o.push_back({"runtime context (CUDA context + kernel modules)", a.cuda_context_bytes});
  if (r.topo.world() > 1) o.push_back({"NCCL communicator buffers", a.nccl_bytes});
  o.push_back({"allocator fragmentation (" + fmt_fixed(100 * a.fragmentation_fraction, 0) + "% of planned buffers)",
               int64_t(std::llround(a.fragmentation_fraction * double(planned)))});
  o.push_back({"driver/ECC reserve (" + fmt_fixed(100 * a.driver_reserve_fraction, 1) + "% of device memory)",
               int64_t(std::llround(a.driver_reserve_fraction * double(r.gpu.mem_bytes)))});
  return o;
}

PlanResult make_plan(const PlanRequest& in) {
  PlanResult res;
  res.req = normalize_request(in);
  const PlanRequest& r = res.req;
  // On a GPU: the CUDA backend's own memory too (workspace, op scratch, upload staging).
  res.options = model_plan_options(r);
  plan_engine_buffers(res.replica, r.model, res.options, r.gpu.is_cpu ? DeviceKind::Cpu : DeviceKind::Cuda);
  if (r.sharding == Sharding::Fsdp && r.method == Method::Full)
    fail(ErrorKind::Config, "--sharding fsdp", "shards the frozen base of LoRA/QLoRA; full fine-tuning trains the base",
         "plan full fine-tuning with --sharding zero3");
  res.plan = shard_plan(res.replica, r.sharding, r.topo.world());  // fsdp: the replica is already rank N-1's
  if (r.sharding == Sharding::Fsdp)
    for (int q = 0; q < r.topo.world(); q++) {
      MemoryPlan p;
      plan_engine_buffers(p, r.model, q == r.topo.world() - 1 ? res.options : model_plan_options(r, q),
                          r.gpu.is_cpu ? DeviceKind::Cpu : DeviceKind::Cuda);
      res.per_rank_bytes.push_back(p.total_bytes());
    }
  res.plan.overhead = overhead_lines(r, res.plan.total_bytes());
  for (int c = 0; c < kNumMemCategories; c++) res.categories[MemCategory(c)] = 0;
  for (const auto& [c, b] : res.plan.bytes_by_category()) res.categories[c] = b;
  res.total_bytes = res.plan.total_bytes();
  res.device_bytes = r.gpu.mem_bytes;
  res.headroom_bytes = res.device_bytes - res.total_bytes;
  res.host_bytes = res.plan.host_bytes();
  res.fits = res.total_bytes <= res.device_bytes;
  int64_t offload_bytes = 0;
  for (const auto& b : res.plan.buffers)
    if (b.host && !is_backend_buffer(b)) offload_bytes += MemoryPlan::aligned(b.bytes);
  res.warnings = plan_warnings(r, res.options, offload_bytes);
  if (!res.fits) res.why = explain_no_fit(res);
  res.speed = estimate_speed(r, res.options, res.replica);
  return res;
}

}  // namespace qlora
