// `qlora bench` on the CPU backend: the JSON report's fields, its FLOP and planned-memory figures
// against the planner called directly, a loss near ln(vocab) on random tokens, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "core/memory_plan.h"
#include "model/llama_config.h"
#include "model/model_plan.h"
#include "plan/flops.h"

using namespace qlora;
using namespace qlora::cli_test;
using nlohmann::json;

namespace {

const char* kArgs = "bench --model smollm2-135m --seq-len 32 --micro-batch 1 --steps 2 --warmup-steps 1 --device cpu --json";

// The JSON object printed on stdout (progress lines on stderr come first in the merged output).
json bench_json(const std::string& extra) {
  RunResult r = run_qlora(std::string(kArgs) + extra);
  EXPECT_EQ(r.code, 0) << r.output;
  const size_t at = r.output.find("{\n  \"tool\"");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no JSON in output:\n" << r.output;
    return json::object();
  }
  return json::parse(r.output.substr(at));
}

int64_t planned_total(const std::string& base_precision, bool double_quant) {
  ModelPlanOptions o;  // what the CPU backend's model plans: f32 compute, r 16, all seven projections
  o.method = parse_method(base_precision == "fp32" ? "lora" : "qlora", "method");
  o.compute_dtype = DType::F32;
  o.base_precision = optional_base_precision(base_precision, "base_precision");
  o.double_quant = double_quant;
  o.lora.r = 16;
  o.lora.targets = all_linear_targets();
  o.micro_batch = 1;
  o.seq_len = 32;
  MemoryPlan p;
  plan_model_buffers(p, preset_config("smollm2-135m"), o);
  return p.total_bytes();
}

void check_report(const json& j, const std::string& precision) {
  for (const char* k : {"tool", "git_sha", "device", "model", "config", "tokens_per_second", "step_time_s",
                        "flops_per_token", "achieved_flops", "peak_flops", "mfu", "peak_memory_bytes", "peak_memory_kind",
                        "planned_peak_memory_bytes", "loss_first", "loss_last", "trainable_params", "base_params"})
    EXPECT_TRUE(j.contains(k)) << k;
  for (const char* k : {"method", "base_precision", "double_quant", "r", "lora_alpha", "target_modules", "seq_len",
                        "micro_batch", "gradient_checkpointing", "steps", "warmup_steps", "seed"})
    EXPECT_TRUE(j["config"].contains(k)) << k;
  for (const char* k : {"mean", "forward", "backward", "optimizer"}) EXPECT_TRUE(j["step_time_s"].contains(k)) << k;
  EXPECT_EQ(j["tool"], "qlora.cpp");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["model"], "smollm2-135m");
  EXPECT_EQ(j["config"]["base_precision"], precision);
  EXPECT_EQ(j["config"]["seq_len"], 32);
  EXPECT_EQ(j["config"]["steps"], 2);

  EXPECT_GT(j["tokens_per_second"].get<double>(), 0);
  const auto& t = j["step_time_s"];
  const double mean = t["mean"], parts = t["forward"].get<double>() + t["backward"].get<double>() + t["optimizer"].get<double>();
  EXPECT_GT(t["forward"].get<double>(), 0);
  EXPECT_GT(t["backward"].get<double>(), 0);
  EXPECT_NEAR(parts, mean, 0.2 * mean) << j["step_time_s"].dump();
  EXPECT_NEAR(j["tokens_per_second"].get<double>() * mean, 32.0, 1e-6);

  // FLOPs: the planner's counter for this exact shape (no checkpointing: no recompute term).
  const LlamaConfig c = preset_config("smollm2-135m");
  FlopOptions fo;
  fo.method = parse_method(precision == "fp32" ? "lora" : "qlora", "method");
  fo.lora_r = 16;
  fo.targets = all_linear_targets();
  fo.attn_len = 32;
  EXPECT_DOUBLE_EQ(j["flops_per_token"].get<double>(), flops_per_token(c, fo).total());
  EXPECT_NEAR(j["achieved_flops"].get<double>(), j["tokens_per_second"].get<double>() * j["flops_per_token"].get<double>(),
              1e-6 * j["achieved_flops"].get<double>());
  EXPECT_TRUE(j["peak_flops"].is_null());  // no catalogued CPU peak
  EXPECT_TRUE(j["mfu"].is_null());

  EXPECT_EQ(j["peak_memory_kind"], "host_rss");
  EXPECT_GT(j["peak_memory_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["planned_peak_memory_bytes"].get<int64_t>(), planned_total(precision, precision == "nf4"));

  // Random tokens on a random model: the loss is about ln(V) (logits are small but not zero).
  const double ln_v = std::log(49152.0);
  for (const char* k : {"loss_first", "loss_last"}) {
    const double l = j[k];
    EXPECT_TRUE(std::isfinite(l)) << k;
    EXPECT_NEAR(l, ln_v, 1.0) << k;
  }
  EXPECT_EQ(j["trainable_params"].get<int64_t>(), int64_t(16 * shape_sums(c, all_linear_targets()).p_l));
  EXPECT_EQ(j["base_params"].get<int64_t>(), c.n_params());
}

// --target-parameters: LoRA on a mixture of experts' stacked experts (PEFT's target_parameters) is
// what the benchmark trains and counts: r (in + out) per expert and stack, beside the attention's.
TEST(BenchCli, TargetParametersAdaptTheExperts) {
  const std::string model = std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe_experts";
  const std::string base = "bench --model " + model + " --seq-len 16 --micro-batch 1 --steps 1 --warmup-steps 0 "
                           "--device cpu --base-precision fp32 --target-modules q_proj --json";
  auto run_json = [](const std::string& args) {
    RunResult r = run_qlora(args);
    EXPECT_EQ(r.code, 0) << r.output;
    const size_t at = r.output.find("{\n  \"tool\"");
    return at == std::string::npos ? json::object() : json::parse(r.output.substr(at));
  };
  const json plain = run_json(base);
  const json experts = run_json(base + " --target-parameters mlp.experts.gate_up_proj,experts.down_proj");
  ASSERT_TRUE(experts.contains("trainable_params")) << experts.dump();
  // 2 layers x 16 experts x r: gate_up (in 64 + out 48), down (in 24 + out 64).
  const int64_t r = experts["config"]["r"], per_layer = 16 * r * ((64 + 48) + (24 + 64));
  EXPECT_EQ(experts["trainable_params"].get<int64_t>() - plain["trainable_params"].get<int64_t>(), 2 * per_layer);
  EXPECT_EQ(experts["config"]["target_parameters"], json::array({"mlp.experts.down_proj", "mlp.experts.gate_up_proj"}));
  RunResult bad = run_qlora(base + " --target-parameters mlp.experts.router");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("--target-parameters"), std::string::npos) << bad.output;
}

}  // namespace

TEST(BenchCli, Smollm2Fp32ReportsEveryField) {
  const json j = bench_json("");
  check_report(j, "fp32");
  // A float base moves no dequantization bytes.
  EXPECT_EQ(j["data_movement"]["dequant_layers_per_step"].get<double>(), 0.0);
  EXPECT_TRUE(j["data_movement"]["planned_dequant_bytes_per_step"].is_null());
}

TEST(BenchCli, Smollm2Nf4ReportsEveryField) {
  const json j = bench_json(" --base-precision nf4");
  check_report(j, "nf4");
  EXPECT_EQ(j["config"]["method"], "qlora");
  EXPECT_EQ(j["config"]["double_quant"], true);
  // The timed step (after a warm-up step) dequantized 2L - 4 = 56 of SmolLM2's 30 layers, the
  // layer count the planner's dequant term uses, and the bytes agree.
  const json& dm = j["data_movement"];
  EXPECT_EQ(dm["dequant_layers_per_step"].get<double>(), 56.0);
  EXPECT_GT(dm["dequant_bytes_per_step"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(dm["planned_dequant_bytes_per_step"].get<double>(), dm["dequant_bytes_per_step"].get<double>());
}

// --gemm-dtype reaches the model and its plan: with FP4 base GEMMs on an NVFP4 base the forward
// reads the stored codes, so a step dequantizes only for the backward, L = 30 layers instead of
// 2L - 4 = 56, as the planner counts; a combination the engine refuses is an error naming it.
TEST(BenchCli, GemmDtypeReachesTheModelAndThePlan) {
  const json j = bench_json(" --base-precision nvfp4 --gemm-dtype fp4");
  EXPECT_EQ(j["config"]["gemm_dtype"], "fp4");
  const json& dm = j["data_movement"];
  EXPECT_EQ(dm["dequant_layers_per_step"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(dm["planned_dequant_bytes_per_step"].get<double>(), dm["dequant_bytes_per_step"].get<double>());
  EXPECT_TRUE(std::isfinite(j["loss_last"].get<double>()));
  RunResult r = run_qlora(std::string(kArgs) + " --base-precision nf4 --gemm-dtype fp4");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("gemm_dtype fp4: reads an NVFP4 or MXFP4 base as stored, but base_precision is 'nf4'"),
            std::string::npos)
      << r.output;
  r = run_qlora(std::string(kArgs) + " --gemm-dtype fp16");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--gemm-dtype"), std::string::npos) << r.output;
}

TEST(BenchCli, TextSummaryWithoutJson) {
  RunResult r = run_qlora("bench --model smollm2-135m --seq-len 8 --micro-batch 1 --steps 1 --warmup-steps 0 --device cpu"
                          " --gradient-checkpointing full");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(fwd + bwd + recompute)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no catalogued peak for CPU"), std::string::npos) << r.output;
}

TEST(BenchCli, BadInputExitsOneNamingTheProblem) {
  RunResult r = run_qlora("bench --model smollm2-135n --device cpu --json");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("smollm2-135n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did you mean 'smollm2-135m'"), std::string::npos) << r.output;

  r = run_qlora("bench --model smollm2-135m --seq-len 0 --device cpu");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--seq-len"), std::string::npos) << r.output;

  r = run_qlora("bench --model smollm2-135m --micro-batch 0 --device cpu");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--micro-batch"), std::string::npos) << r.output;

  r = run_qlora("bench --model smollm2-135m --base-precision nf5 --device cpu");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("did you mean 'nf4'"), std::string::npos) << r.output;
}
