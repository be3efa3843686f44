// The CUDA backend's own memory in `qlora plan`: GPU plans list it as planned workspace buffers
// (and no longer estimate a cuBLASLt line), CPU plans have none, and the report shows the lines
// with their total.
#include <gtest/gtest.h>

#include <set>

#include "backend/cuda_scratch.h"
#include "model/backend_plan.h"
#include "plan/report.h"

using namespace qlora;

namespace {

PlanRequest request(const std::string& gpu) {
  PlanRequest r;
  r.model = preset_config("llama3-8b");
  r.model_label = "llama3-8b";
  r.gpu = resolve_gpu(gpu);
  r.method = Method::Qlora;
  r.base_precision = BasePrecision::Nf4;
  return r;
}

std::set<std::string> backend_names(const MemoryPlan& p) {
  std::set<std::string> s;
  for (const auto& b : p.buffers)
    if (is_backend_buffer(b)) s.insert(b.name);
  return s;
}

}  // namespace

TEST(PlanBackend, GpuPlansListTheCudaBackendsBuffersCpuPlansNone) {
  const PlanResult gpu = make_plan(request("h100-sxm"));
  const std::set<std::string> want = {"cuda.lt_workspace", "cuda.error_record",   "cuda.upload_staging.0",
                                      "cuda.upload_staging.1", "cuda.matmul_cvt_a", "cuda.matmul_cvt_b",
                                      "cuda.attn_dq_acc",  "cuda.attn_delta",     "cuda.reduce_partials"};
  EXPECT_EQ(backend_names(gpu.plan), want);
  int64_t dev = 0, host = 0;
  for (const auto& b : gpu.plan.buffers) {
    if (!is_backend_buffer(b)) continue;
    EXPECT_EQ(b.category, MemCategory::Workspace) << b.name;
    EXPECT_EQ(b.host, b.name.rfind("cuda.upload_staging.", 0) == 0) << b.name;
    (b.host ? host : dev) += MemoryPlan::aligned(b.bytes);
  }
  EXPECT_EQ(host, 2 * cuda_plan::kStagingBytes);
  EXPECT_EQ(gpu.host_bytes, host);  // no offload: the staging is all the pinned host memory
  for (const auto& w : gpu.warnings) EXPECT_EQ(w.find("offload"), std::string::npos) << w;
  // The workspace is planned now, not estimated.
  for (const auto& [name, bytes] : gpu.plan.overhead) EXPECT_EQ(name.find("cuBLAS"), std::string::npos) << name;

  const std::string text = plan_text(gpu);
  for (const auto& n : want) EXPECT_NE(text.find(n), std::string::npos) << n << "\n" << text;
  EXPECT_NE(text.find("CUDA backend, device total"), std::string::npos) << text;
  const nlohmann::json j = plan_json(gpu);
  EXPECT_EQ(j["backend_buffers"].size(), want.size());
  EXPECT_EQ(j["backend_device_bytes"].get<int64_t>(), dev);

  const PlanResult cpu = make_plan(request("cpu"));
  EXPECT_TRUE(backend_names(cpu.plan).empty());
  EXPECT_EQ(plan_text(cpu).find("cuda."), std::string::npos);
  EXPECT_TRUE(plan_json(cpu)["backend_buffers"].empty());
  EXPECT_EQ(cpu.host_bytes, 0);
}

// The mixed-dtype conversions are sized from the model's matmuls: the LM head's dgrad reads the
// f32 logits chunk (ce_chunk x V), the LoRA matmuls their f32 A (r,in) and B (out,r); a bf16 or
// quantized base needs no copy of its weights.
TEST(PlanBackend, ScratchFollowsTheShape) {
  PlanRequest r = request("h100-sxm");
  r.ce_chunk = 512;
  r.lora.r = 8;
  r.lora.targets = {"q_proj", "v_proj"};  // widest: q_proj (4096, 4096)
  r.micro_batch = 2;
  r.seq_len = 1024;
  const PlanResult p = make_plan(r);
  const LlamaConfig& c = r.model;
  auto bytes = [&](const char* name) {
    const PlannedBuffer* b = p.plan.find(name);
    return b ? b->bytes : -1;
  };
  EXPECT_EQ(bytes("cuda.matmul_cvt_a"), 512 * c.vocab_size * 2);
  EXPECT_EQ(bytes("cuda.matmul_cvt_b"), 8 * 4096 * 2);
  EXPECT_EQ(bytes("cuda.attn_dq_acc"), 2048 * c.n_head * 128 * 4);
  EXPECT_EQ(bytes("cuda.attn_delta"), 2048 * c.n_head * 4);
  // q_proj A (8,4096) and B (4096,8), v_proj A (8,4096) and B (1024,8): 16 + 16 + 16 + 4 blocks per layer.
  EXPECT_EQ(bytes("cuda.reduce_partials"), (3 * 52 * c.n_layer + 1) * 8);
  EXPECT_EQ(bytes("cuda.lt_workspace"), int64_t(32) << 20);
  r.lora.targets = {"down_proj"};  // (4096, 14336)
  EXPECT_EQ(make_plan(r).plan.find("cuda.matmul_cvt_b")->bytes, 8 * 14336 * 2);
}

// A model the CUDA backend refuses (a head dim above 256 or not a multiple of 8) is still planned
// on a GPU, and the plan says so; Gemma's head dims (256: Gemma 3 1B-12B, Gemma 2 2B/9B; 128: the
// 27Bs) and the CPU plan carry no such warning.
TEST(PlanBackend, HeadDimsTheCudaAttentionRefusesAreNamed) {
  auto warned = [](const std::string& model, const std::string& gpu, int64_t head_dim = 0) {
    PlanRequest r = request(gpu);
    r.model = preset_config(model);
    if (head_dim) r.model.head_dim = head_dim;
    r.model_label = model;
    for (const auto& w : make_plan(r).warnings)
      if (w.find("head dims") != std::string::npos) return true;
    return false;
  };
  for (const char* m : {"gemma-3-4b", "gemma-3-12b", "gemma-3-27b", "gemma-2-9b", "gemma-2-27b"})
    EXPECT_FALSE(warned(m, "h100-sxm")) << m;
  EXPECT_TRUE(warned("gemma-3-4b", "h100-sxm", 288));
  EXPECT_TRUE(warned("gemma-3-4b", "h100-sxm", 100));
  EXPECT_FALSE(warned("gemma-3-4b", "cpu", 288));
}

// Head dims over 128 run on the own flash kernels with dq in its own pass on every GPU (cuDNN's
// graphs are taken up to 128), so the plan holds no dq accumulator for them and names that path;
// Gemma 3 27B (head dim 128) on an H100 takes cuDNN with the accumulator.
TEST(PlanBackend, HeadDim256IsPlannedOnTheOwnKernels) {
  auto plan_of = [](const std::string& model) {
    PlanRequest r = request("h100-sxm");
    r.model = preset_config(model);
    r.model_label = model;
    return make_plan(r);
  };
  const PlanResult wide = plan_of("gemma-3-4b"), narrow = plan_of("gemma-3-27b");
  EXPECT_EQ(wide.plan.find("cuda.attn_dq_acc")->bytes, 0);
  EXPECT_GT(narrow.plan.find("cuda.attn_dq_acc")->bytes, 0);
  EXPECT_NE(wide.speed.attention_path.find("own flash-attention kernels (mma.sync), dq in its own pass"), std::string::npos)
      << wide.speed.attention_path;
  EXPECT_NE(narrow.speed.attention_path.find("cuDNN"), std::string::npos) << narrow.speed.attention_path;
}

// --targets in the model's LoRA modules: Phi-4's all-linear is its four fused modules (the LoRA
// FLOPs count one A per fused module), qkv_proj is accepted there and refused on Llama, and naming
// only part of a fused module is refused.
TEST(PlanBackend, TargetsAreTheModelsLoraModules) {
  PlanRequest r = request("h100-sxm");
  r.model = preset_config("phi-4");
  r.model_label = "phi-4";
  r.lora.targets = {"all-linear"};
  const PlanResult all = make_plan(r);
  EXPECT_EQ(all.req.lora.targets, (std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
  EXPECT_NE(plan_text(all).find("on all-linear"), std::string::npos);
  r.lora.targets = {"qkv_proj"};
  EXPECT_EQ(make_plan(r).req.lora.targets, (std::vector<std::string>{"qkv_proj"}));
  r.lora.targets = {"q_proj"};
  EXPECT_THROW(make_plan(r), Error);
  PlanRequest l = request("h100-sxm");
  l.lora.targets = {"qkv_proj"};
  try {
    make_plan(l);
    ADD_FAILURE() << "qkv_proj accepted on llama3-8b";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("--targets"), std::string::npos) << e.what();
  }
}
