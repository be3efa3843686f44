// End to end: `qlora train` on a small Mixtral whose config.json sets output_router_logits, on
// pre-tokenized rows: the run trains, metrics.jsonl carries the routing and the micro-batches' mean
// load-balancing loss, and `loss` includes it times router_aux_loss_coef. LoRA on the experts writes
// PEFT's target_parameters layout. A mixture of experts read from its GGUF trains as its checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/peft_io.h"

using namespace qlora::cli_test;
namespace fs = std::filesystem;

namespace {

const std::string kModel = std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/models/mixtral_aux";

// Rows of token ids below the fixture's vocabulary (96), of lengths 10..17, so that padding occurs
// (or all of `fixed_length`).
std::string write_rows(const std::string& dir, int fixed_length = 0) {
  const std::string path = dir + "/train.jsonl";
  std::ofstream f(path);
  uint32_t x = 12345;
  for (int r = 0; r < 8; r++) {
    nlohmann::json ids = nlohmann::json::array();
    for (int t = 0; t < (fixed_length > 0 ? fixed_length : 10 + r); t++) {
      x = x * 1103515245u + 12345u;
      ids.push_back(int((x >> 16) % 96));
    }
    f << nlohmann::json{{"input_ids", ids}}.dump() << "\n";
  }
  return path;
}

TEST(TrainMoe, LoadBalancingLossIsLoggedBesideTheRouting) {
  const std::string out = temp_dir("moe_aux");
  fs::create_directories(out);
  const std::string cfg = out + "/cfg.yaml";
  std::ofstream(cfg) << "model_name_or_path: " << kModel << "\ntrain_file: " << write_rows(out) << "\n"
                     << "per_device_train_batch_size: 2\ngradient_accumulation_steps: 2\nmax_steps: 2\n"
                     << "learning_rate: 1.0e-3\nr: 4\nlora_alpha: 8\n"
                     << "target_modules: [q_proj, k_proj, v_proj, o_proj]\nlogging_steps: 1\nthreads: 1\n"
                     << "device: cpu\nseed: 5\n";
  const RunResult r = run_qlora("train " + cfg + " output_dir=" + out + "/run");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto recs = metrics_records(out + "/run");
  int steps = 0;
  for (const auto& rec : recs) {
    if (!rec.contains("step") || !rec.contains("loss")) continue;
    steps++;
    ASSERT_TRUE(rec.contains("router/aux_loss")) << rec.dump();
    // E sum_e f_e P_e: 1 for a perfectly even routing, at most E (16) for all on one expert.
    const double aux = rec["router/aux_loss"];
    EXPECT_GT(aux, 0.5) << rec.dump();
    EXPECT_LT(aux, 16.0) << rec.dump();
    EXPECT_TRUE(rec.contains("router/load_max_over_mean")) << rec.dump();
    EXPECT_GT(rec["loss"].get<double>(), 0.1 * aux) << "the loss includes 0.1 x the aux loss";
  }
  EXPECT_EQ(steps, 2) << read_file(out + "/run/metrics.jsonl");
  EXPECT_TRUE(fs::exists(out + "/run/adapter/adapter_model.safetensors")) << r.output;
  fs::remove_all(out);
}

// router_aux_loss_coef in the training config replaces the model's own coefficient: 0 turns off the
// loss mixtral_aux's config.json asks for (no router/aux_loss logged, the loss the language model's
// alone), 0.5 adds half the load-balancing loss to it (the first step's loss, before any update,
// is the language-model loss plus 0.5 x the logged aux loss); a GGUF mixture of experts, which
// has no setting, gets one; a dense model is refused, naming the key.
TEST(TrainMoe, RouterAuxLossCoefFromTheTrainingConfig) {
  const std::string out = temp_dir("moe_aux_coef");
  fs::create_directories(out);
  const std::string cfg = out + "/cfg.yaml";
  std::ofstream(cfg) << "model_name_or_path: " << kModel << "\ntrain_file: " << write_rows(out) << "\n"
                     << "per_device_train_batch_size: 2\nmax_steps: 1\nlearning_rate: 1.0e-3\nr: 4\nlora_alpha: 8\n"
                     << "target_modules: [q_proj, v_proj]\nlogging_steps: 1\nthreads: 1\ndevice: cpu\nseed: 5\n";
  auto first_step = [&](const std::string& args, const std::string& run) {
    const RunResult r = run_qlora("train " + cfg + " output_dir=" + out + "/" + run + args);
    EXPECT_EQ(r.code, 0) << r.output;
    for (const auto& rec : metrics_records(out + "/" + run))
      if (rec.contains("step") && rec.contains("loss")) return rec;
    ADD_FAILURE() << "no step record for " << run;
    return nlohmann::json();
  };
  const nlohmann::json off = first_step(" router_aux_loss_coef=0", "off");
  const nlohmann::json half = first_step(" router_aux_loss_coef=0.5", "half");
  const nlohmann::json own = first_step("", "own");  // config.json: 0.1
  ASSERT_FALSE(off.is_null() || half.is_null() || own.is_null());
  EXPECT_FALSE(off.contains("router/aux_loss")) << off.dump();
  ASSERT_TRUE(half.contains("router/aux_loss")) << half.dump();
  const double lm = off["loss"], aux = half["router/aux_loss"];
  EXPECT_GT(aux, 0.5);
  EXPECT_NEAR(half["loss"].get<double>(), lm + 0.5 * aux, 1e-6 * lm);
  EXPECT_NEAR(own["loss"].get<double>(), lm + 0.1 * own["router/aux_loss"].get<double>(), 1e-6 * lm);
  // A GGUF mixture of experts has no load-balancing setting: the key gives it one.
  const std::string gguf = out + "/moe.gguf";
  const std::string qwen = std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe_experts";
  ASSERT_EQ(run_qlora("export --format gguf --outtype f32 --model " + qwen + " --out " + gguf).code, 0);
  EXPECT_FALSE(first_step(" model_name_or_path=" + gguf, "gguf").contains("router/aux_loss"));
  EXPECT_TRUE(first_step(" model_name_or_path=" + gguf + " router_aux_loss_coef=0.001", "gguf_aux").contains("router/aux_loss"));
  // A dense model: refused before anything runs, naming the key.
  const RunResult dense = run_qlora("train " + cfg + " output_dir=" + out + "/dense router_aux_loss_coef=0.01 model_name_or_path=" +
                                    std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/models/llama_gqa");
  EXPECT_NE(dense.code, 0);
  EXPECT_NE(dense.output.find("router_aux_loss_coef"), std::string::npos) << dense.output;
  EXPECT_NE(dense.output.find("has no experts"), std::string::npos) << dense.output;
  fs::remove_all(out);
}

// LoRA on the experts from a training config (PEFT's target_parameters): the run trains and writes
// the adapter in PEFT's ParamWrapper layout (gate_up_proj's wrapper nested in down_proj's), with
// target_parameters in its config; lora_dropout beside it is refused before the first step.
TEST(TrainMoe, ExpertLoraWritesPeftTargetParameters) {
  const std::string out = temp_dir("moe_experts");
  fs::create_directories(out);
  const std::string model = std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe_experts";
  const std::string cfg = out + "/cfg.yaml";
  std::ofstream(cfg) << "model_name_or_path: " << model << "\ntrain_file: " << write_rows(out) << "\n"
                     << "per_device_train_batch_size: 2\nmax_steps: 2\nlearning_rate: 1.0e-3\nr: 4\nlora_alpha: 8\n"
                     << "lora_dropout: 0\ntarget_modules: [q_proj, v_proj]\n"
                     << "target_parameters: [mlp.experts.down_proj, mlp.experts.gate_up_proj]\n"
                     << "logging_steps: 1\nthreads: 1\ndevice: cpu\nseed: 5\n";
  const RunResult r = run_qlora("train " + cfg + " output_dir=" + out + "/run");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json ac = nlohmann::json::parse(read_file(out + "/run/adapter/adapter_config.json"));
  EXPECT_EQ(ac["target_parameters"], nlohmann::json::array({"mlp.experts.down_proj", "mlp.experts.gate_up_proj"}));
  qlora::SafetensorsArchive ad(out + "/run/adapter/adapter_model.safetensors");
  const std::string l1 = "base_model.model.model.layers.1.mlp.experts.";
  // 16 experts of 24 (gate_up: 48 rows), hidden 64, r 4: A (r*E, in), B (out, r*E).
  EXPECT_EQ(ad.get(l1 + "base_layer.lora_A.weight").shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(ad.get(l1 + "base_layer.lora_B.weight").shape, (std::vector<int64_t>{48, 64}));
  EXPECT_EQ(ad.get(l1 + "lora_A.weight").shape, (std::vector<int64_t>{64, 24}));
  EXPECT_EQ(ad.get(l1 + "lora_B.weight").shape, (std::vector<int64_t>{64, 64}));
  const std::vector<float> b = ad.read_f32(l1 + "lora_B.weight", {64, 64});
  double moved = 0;
  for (float x : b) moved = std::max(moved, double(std::fabs(x)));
  EXPECT_GT(moved, 0.0) << "two steps move the experts' B away from zero";
  // The experts alone (target_modules empty): PEFT's target_modules null beside target_parameters,
  // which the engine reads back as no projection and both stacks.
  const RunResult only = run_qlora("train " + cfg + " output_dir=" + out + "/only target_modules=[] max_steps=1");
  ASSERT_EQ(only.code, 0) << only.output;
  const nlohmann::json oc = nlohmann::json::parse(read_file(out + "/only/adapter/adapter_config.json"));
  EXPECT_TRUE(oc["target_modules"].is_null()) << oc.dump();
  const qlora::LoraSpec back = qlora::read_peft_adapter_config(out + "/only/adapter/adapter_config.json");
  EXPECT_TRUE(back.targets.empty());
  EXPECT_EQ(back.expert_targets, (std::vector<std::string>{"gate_up_proj", "down_proj"}));
  EXPECT_EQ(qlora::SafetensorsArchive(out + "/only/adapter/adapter_model.safetensors").names().size(), 2u * 2 * 2);
  // lora_dropout with the experts adapted: refused, naming both.
  const RunResult bad = run_qlora("train " + cfg + " output_dir=" + out + "/bad lora_dropout=0.05");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("lora_dropout"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("target_parameters"), std::string::npos) << bad.output;
  fs::remove_all(out);
}

// Writes model's f32 GGUF export to out/base.gguf and a 3-step training config with LoRA on q/v
// and on both expert stacks (rows from write_rows); returns the config's path.
std::string gguf_training_setup(const std::string& model, const std::string& out, int fixed_length = 0) {
  fs::create_directories(out);
  const RunResult ex = run_qlora("export --format gguf --outtype f32 --model " + model + " --out " + out + "/base.gguf");
  EXPECT_EQ(ex.code, 0) << ex.output;
  const std::string cfg = out + "/cfg.yaml";
  std::ofstream(cfg) << "train_file: " << write_rows(out, fixed_length) << "\n"
                     << "per_device_train_batch_size: 2\nmax_steps: 3\nlearning_rate: 2.0e-3\nr: 4\nlora_alpha: 8\n"
                     << "lora_dropout: 0\ntarget_modules: [q_proj, v_proj]\n"
                     << "target_parameters: [mlp.experts.down_proj, mlp.experts.gate_up_proj]\n"
                     << "logging_steps: 1\nthreads: 1\ndevice: cpu\nseed: 5\n";
  return cfg;
}

// A Qwen3-MoE read from a GGUF (`qlora export --outtype f32` of the checkpoint: llama.cpp's qwen3moe
// layout, each layer's experts in three 3-D stacks) trains exactly as the checkpoint it was written
// from: the same loss at every step and the same adapter, with LoRA on the attention and on every
// expert (each expert's weights are a slice of a stack), on the f32 base and on an NF4 base
// quantized on load.
TEST(TrainMoe, AGgufMixtureOfExpertsTrainsAsItsCheckpoint) {
  const std::string out = temp_dir("moe_gguf");
  const std::string model = std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe_experts";
  const std::string cfg = gguf_training_setup(model, out);
  for (const std::string quant : {"", " load_in_4bit=true"}) {
    SCOPED_TRACE(quant.empty() ? "f32 base" : "nf4 base");
    std::vector<std::vector<double>> losses;
    std::vector<std::vector<float>> b;
    for (const std::string& base : {model, out + "/base.gguf"}) {
      const std::string run = out + "/run" + std::to_string(losses.size());
      // The two bases run the experts' GEMMs over other shapes (a GGUF stack's slices).
      const RunResult r = run_qlora("train " + cfg + " model_name_or_path=" + base + " output_dir=" + run + quant +
                                    kOptimizerLipschitzInGradient);
      ASSERT_EQ(r.code, 0) << r.output;
      losses.emplace_back();
      for (const auto& rec : metrics_records(run))
        if (rec.contains("step") && rec.contains("loss")) losses.back().push_back(rec["loss"].get<double>());
      const std::string l1 = "base_model.model.model.layers.1.mlp.experts.lora_B.weight";
      b.push_back(qlora::SafetensorsArchive(run + "/adapter/adapter_model.safetensors").read_f32(l1, {64, 64}));
      fs::remove_all(run);
    }
    ASSERT_EQ(losses[0].size(), 3u);
    ASSERT_EQ(losses[1].size(), 3u);
    for (size_t i = 0; i < 3; i++) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-6 * losses[0][i]) << "step " << i + 1;
    double moved = 0, diff = 0;
    for (size_t i = 0; i < b[0].size(); i++) {
      moved = std::max(moved, double(std::fabs(b[0][i])));
      diff = std::max(diff, double(std::fabs(b[1][i] - b[0][i])));
    }
    EXPECT_GT(moved, 0.0) << "three steps move the experts' B away from zero";
    EXPECT_LE(diff, 1e-5 * moved) << "the experts' adapter trained from the GGUF differs";
  }
  fs::remove_all(out);
}

// gpt-oss read from its GGUF (llama.cpp's gpt-oss layout: the fused experts split into stacks, the
// ramp of its YaRN truncated as llama.cpp computes it) trains exactly as the checkpoint with
// truncate true: the same loss at every step and the same adapter, with LoRA on the attention and
// on both expert stacks. The export of the checkpoint alone writes its experts in MXFP4 as shipped,
// and both runs hold them so (the GGUF's blocks moved back into the checkpoint's layout): on rows
// of one length the two runs are the same computation, bit for bit. (With padding they are not:
// padding takes the eos id, 2 from the GGUF and none (0) from the directory, whose tokenizer.json
// names none; the padding positions are routed through the experts, which changes how many rows
// each expert's GEMM has and with it the order of some sums, about 1e-8.)
TEST(TrainMoe, AGptOssGgufTrainsAsItsCheckpointWithTheRampTruncated) {
  const std::string out = temp_dir("gpt_oss_gguf");
  const std::string model = std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/export/gpt_oss";
  const std::string cfg = gguf_training_setup(model, out, 12);
  ASSERT_EQ(qlora::GgufFile(out + "/base.gguf").tensor("blk.0.ffn_down_exps.weight").type, qlora::GgmlType::MXFP4);
  const std::string truncated = out + "/truncated";  // the checkpoint with truncate true
  fs::create_directories(truncated);
  fs::copy_file(model + "/model.safetensors", truncated + "/model.safetensors");
  fs::copy_file(model + "/tokenizer.json", truncated + "/tokenizer.json");
  nlohmann::json c = nlohmann::json::parse(read_file(model + "/config.json"));
  ASSERT_FALSE(c["rope_scaling"]["truncate"].get<bool>());
  c["rope_scaling"]["truncate"] = true;
  c["output_router_logits"] = false;  // a GGUF has no load-balancing setting: none is added
  std::ofstream(truncated + "/config.json") << c.dump();
  std::vector<std::vector<double>> losses;
  std::vector<std::string> runs;
  for (const std::string& base : {truncated, out + "/base.gguf"}) {
    runs.push_back(out + "/run" + std::to_string(runs.size()));
    const RunResult r = run_qlora("train " + cfg + " model_name_or_path=" + base + " output_dir=" + runs.back());
    ASSERT_EQ(r.code, 0) << r.output;
    losses.emplace_back();
    for (const auto& rec : metrics_records(runs.back()))
      if (rec.contains("step") && rec.contains("loss")) losses.back().push_back(rec["loss"].get<double>());
  }
  ASSERT_EQ(losses[0].size(), 3u);
  ASSERT_EQ(losses[1].size(), 3u);
  EXPECT_EQ(losses[1], losses[0]);
  const qlora::SafetensorsArchive a(runs[0] + "/adapter/adapter_model.safetensors"), b(runs[1] + "/adapter/adapter_model.safetensors");
  ASSERT_EQ(a.names(), b.names());
  int expert_tensors = 0;
  for (const std::string& n : a.names()) {
    SCOPED_TRACE(n);
    const std::vector<float> x = a.read_f32(n, a.get(n).shape), y = b.read_f32(n, b.get(n).shape);
    double moved = 0, diff = 0;
    for (size_t i = 0; i < x.size(); i++) {
      moved = std::max(moved, double(std::fabs(x[i])));
      diff = std::max(diff, double(std::fabs(y[i] - x[i])));
    }
    EXPECT_GT(moved, 0.0);
    EXPECT_EQ(diff, 0.0);
    expert_tensors += n.find("mlp.experts") != std::string::npos;
  }
  EXPECT_EQ(expert_tensors, 3 * 2 * 2) << "A and B of both stacks in every layer";
  fs::remove_all(out);
}

}  // namespace
