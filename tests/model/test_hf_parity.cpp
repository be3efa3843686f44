// Parity with Hugging Face transformers + peft on tiny random models of every supported family:
// logits, loss, LoRA gradients and 3 AdamW steps with accumulation, clipping and a cosine schedule.
#include <gtest/gtest.h>

#include <cstring>

#include "model/experts.h"
#include "model/mxfp4_experts.h"
#include "model/peft_io.h"
#include "model_test_util.h"
#include "train/step.h"

using namespace qlora;
using namespace qlora::testing_util;

class HfParity : public ::testing::TestWithParam<std::string> {};

// fp32 everywhere; bounds leave room for summation-order differences only.
// rel_err (max error over max |ref| of each tensor). fp32 against PyTorch's fp32 differs only in
// summation order: the largest seen is 2.3e-6 (AVX-512 and AVX2 OpenBLAS kernels), so 2e-5.
constexpr double kLogitTol = 2e-5;
constexpr double kGradTol = 2e-5;
constexpr double kTrainTol = 2e-5;

TEST_P(HfParity, BaseLogitsAndLoss) {
  const std::string v = GetParam();
  SafetensorsArchive fx(fixtures() + "/parity/" + v + ".safetensors");
  auto ids = ints(fx, "input_ids"), labels = ints(fx, "labels");
  TestModel t = make_model(v, fixture_lora(v), 2, 12);  // B = 0 after init: LoRA adds nothing
  Batch b = Batch::from_hf(2, 12, ids, labels);
  auto logits = t.model->logits(b);
  EXPECT_LT(rel_err(logits, floats(fx, "logits")), kLogitTol);
  const double loss = t.model->forward_loss(b) / double(b.n_trained());
  EXPECT_NEAR(loss, floats(fx, "loss")[0], kLogitTol * std::fabs(loss));
}

TEST_P(HfParity, LoraLogitsLossAndGradients) {
  const std::string v = GetParam();
  SafetensorsArchive fx(fixtures() + "/parity/" + v + ".safetensors");
  auto ids = ints(fx, "input_ids"), labels = ints(fx, "labels");
  TestModel t = make_model(v, fixture_lora(v), 2, 12);
  load_peft_adapter(fixtures() + "/parity/" + v + "_adapter", *t.model);
  Batch b = Batch::from_hf(2, 12, ids, labels);
  EXPECT_LT(rel_err(t.model->logits(b), floats(fx, "lora_logits")), kLogitTol);
  t.model->zero_grads();
  // With output_router_logits, transformers' loss adds router_aux_loss_coef times the load-balancing loss.
  const double coef = t.model->config().router_aux_loss_coef;
  const double loss = t.model->forward_backward(b, float(1.0 / double(b.n_trained())), 0) / double(b.n_trained()) +
                      coef * t.model->last_aux_loss();
  EXPECT_NEAR(loss, floats(fx, "lora_loss")[0], kLogitTol * std::fabs(loss));
  if (coef > 0) {
    const double aux = floats(fx, "lora_aux_loss")[0];
    EXPECT_NEAR(t.model->last_aux_loss(), aux, kLogitTol * aux);
  }
  int checked = 0;
  for (auto& p : t.model->trainable_params()) {
    std::vector<float> g(size_t(p.g.numel()));
    t.be->copy_to_host(g.data(), p.g.data, g.size() * 4);
    g = to_peft_layout(p, g);  // an expert stack's lora_B: PEFT's (out, r*E)
    auto ref = floats(fx, "grad." + p.peft_key);
    double norm = 0;
    for (float x : ref) norm += double(x) * x;
    ASSERT_GT(norm, 0) << p.peft_key << ": fixture gradient is zero, the check would be vacuous";
    EXPECT_LT(rel_err(g, ref), kGradTol) << p.peft_key;
    checked++;
  }
  const LoraSpec& ls = t.model->lora();
  EXPECT_EQ(checked, 2 * int64_t(ls.targets.size() + ls.expert_targets.size()) * t.model->config().n_layer);
}

TEST_P(HfParity, ThreeAdamWStepsWithAccumulationAndClipping) {
  const std::string v = GetParam();
  SafetensorsArchive fx(fixtures() + "/parity/" + v + ".safetensors");
  auto ids = ints(fx, "train_input_ids"), labels = ints(fx, "train_labels");
  auto ref_loss = floats(fx, "train_loss"), ref_norm = floats(fx, "train_grad_norm"), ref_lr = floats(fx, "train_lr");
  TestModel t = make_model(v, fixture_lora(v), 2, 12);
  load_peft_adapter(fixtures() + "/parity/" + v + "_adapter", *t.model);
  OptimHyper h;
  h.weight_decay = 0.01;
  h.max_grad_norm = 0.5;
  const size_t mb = 2 * 12;
  bool clipped = false;
  for (int s = 0; s < 3; s++) {
    std::vector<Batch> mbs;
    for (int j = 0; j < 2; j++) {
      const size_t off = size_t(s * 2 + j) * mb;
      std::vector<int32_t> i(ids.begin() + long(off), ids.begin() + long(off + mb));
      std::vector<int32_t> l(labels.begin() + long(off), labels.begin() + long(off + mb));
      mbs.push_back(Batch::from_hf(2, 12, i, l));
    }
    StepResult r = train_step(*t.model, mbs, h, ref_lr[size_t(s)], s, 0);
    EXPECT_NEAR(r.loss, ref_loss[size_t(s)], kTrainTol * std::fabs(ref_loss[size_t(s)])) << "step " << s;
    EXPECT_NEAR(r.grad_norm, ref_norm[size_t(s)], kTrainTol * ref_norm[size_t(s)]) << "step " << s;
    clipped |= r.grad_norm > h.max_grad_norm;
  }
  EXPECT_TRUE(clipped) << "fixture should exercise gradient clipping";
  for (auto& p : t.model->trainable_params()) {
    std::vector<float> w(size_t(p.w.numel()));
    t.be->copy_to_host(w.data(), p.w.data, w.size() * 4);
    EXPECT_LT(rel_err(to_peft_layout(p, w), floats(fx, "final." + p.peft_key)), kTrainTol) << p.peft_key;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfParity, ::testing::Values("llama_gqa", "mistral", "qwen2", "llama_tied", "qwen3",
                                                                   "mistral_sw", "qwen3_sw", "gemma3", "phi3", "gemma2", "mixtral",
                                                                   "qwen3_moe", "gemma3_mm", "phi3_longrope", "qwen3_yarn",
                                                                   "mixtral_aux", "qwen3_moe_norm", "qwen3_moe_experts",
                                                                   "gpt_oss"));

// gpt-oss ships its experts as MXFP4 blocks: the engine keeps those bytes (its expert stacks are
// packed MXFP4, the gate/up rows de-interleaved), and each expert it dequantizes for its GEMMs
// equals transformers' own dequantization of the checkpoint (convert_moe_packed_tensors) bit for bit.
TEST(HfParity, GptOssMxfp4ExpertsAreTransformersDequantization) {
  SafetensorsArchive fx(fixtures() + "/parity/gpt_oss.safetensors");
  TestModel t = make_model("gpt_oss", fixture_lora("gpt_oss"), 2, 12);
  const LlamaConfig& c = t.model->config();
  const int64_t E = c.n_experts, F = c.expert_intermediate_size, C = c.hidden_size;
  const QuantParams q = mxfp4_expert_params();
  int64_t compared = 0, nonzero = 0;
  for (int64_t l = 0; l < c.n_layer; l++) {
    const std::string lp = "layers." + std::to_string(l) + ".";
    const std::vector<float> gate_up = floats(fx, "mxfp4." + lp + "gate_up_proj");  // (E, C, 2F)
    const std::vector<float> down = floats(fx, "mxfp4." + lp + "down_proj");         // (E, F, C)
    ASSERT_EQ(gate_up.size(), size_t(E * C * 2 * F));
    for (int k = 0; k < 3; k++) {
      const std::string kind = expert_kinds()[size_t(k)];
      const auto [out, in] = expert_shape(c, kind);
      const PlannedBuffer* buf = t.model->plan().find(lp + "experts." + kind);
      ASSERT_TRUE(buf != nullptr && buf->dtype == DType::U8) << "the experts are held quantized";
      const auto* stack = static_cast<const uint8_t*>(t.model->arena().raw(lp + "experts." + kind));
      std::vector<float> w(size_t(out * in));
      for (int64_t e = 0; e < E; e++) {
        t.be->dequantize({Tensor(w.data(), DType::F32, {out, in}), stack + e * expert_stride_bytes(c, kind, q), q, out, in});
        for (int64_t o = 0; o < out; o++)
          for (int64_t i = 0; i < in; i++) {
            const float ref = k == 2 ? down[size_t((e * F + i) * C + o)]                      // down_proj[e][i][o]
                                     : gate_up[size_t((e * C + i) * 2 * F + 2 * o + k)];      // gate 2o, up 2o + 1
            const float got = w[size_t(o * in + i)];
            ASSERT_EQ(std::memcmp(&got, &ref, 4), 0) << lp << kind << " expert " << e << " (" << o << ", " << i << "): "
                                                     << got << " vs transformers' " << ref;
            compared++;
            nonzero += ref != 0;
          }
      }
    }
  }
  EXPECT_EQ(compared, c.n_layer * E * 3 * F * C);
  EXPECT_GT(nonzero, compared / 2);
}

// LongRoPE picks its factors per forward by the largest position (transformers: max(position_ids)
// + 1 > original_max_position_embeddings): on one model, 8-token rows (within the original 8)
// give transformers' logits with the short factors, 12-token rows with the long, and back again.
TEST(HfParity, LongRopeSwitchesFactorsWithTheLargestPosition) {
  SafetensorsArchive fx(fixtures() + "/parity/phi3_longrope.safetensors");
  const auto ids = ints(fx, "input_ids"), labels = ints(fx, "labels");
  TestModel t = make_model("phi3_longrope", fixture_lora("phi3_longrope"), 2, 12);
  ASSERT_EQ(t.model->config().rope_scaling.type, "longrope");
  ASSERT_EQ(t.model->config().rope_dim(), 8);
  std::vector<int32_t> short_ids;
  for (int64_t b = 0; b < 2; b++) short_ids.insert(short_ids.end(), ids.begin() + b * 12, ids.begin() + b * 12 + 8);
  const Batch s = Batch::from_hf(2, 8, short_ids, short_ids);
  const Batch l = Batch::from_hf(2, 12, ids, labels);
  const auto ref_short = floats(fx, "short_logits"), ref_long = floats(fx, "logits");
  EXPECT_LT(rel_err(t.model->logits(s), ref_short), kLogitTol);
  EXPECT_LT(rel_err(t.model->logits(l), ref_long), kLogitTol);
  EXPECT_LT(rel_err(t.model->logits(s), ref_short), kLogitTol) << "back to the short factors";
  std::vector<float> long_prefix;  // the long rows' first 8 positions differ from the short rows'
  const int64_t V = t.model->config().vocab_size;
  for (int64_t b = 0; b < 2; b++)
    long_prefix.insert(long_prefix.end(), ref_long.begin() + b * 12 * V, ref_long.begin() + (b * 12 + 8) * V);
  EXPECT_GT(rel_err(long_prefix, ref_short), 1e-3) << "the fixture's two factor sets give different logits";
}

// YaRN's frequencies and cos/sin factor are transformers' own (modeling_rope_utils): the ramp's
// ends floored and ceiled (Qwen's setting) and, with truncate false, not (gpt-oss's).
TEST(HfParity, YarnFrequenciesAndAttentionFactorAreTransformers) {
  SafetensorsArchive fx(fixtures() + "/parity/qwen3_yarn.safetensors");
  LlamaConfig c = load_hf_config(fixtures() + "/models/qwen3_yarn/config.json");
  ASSERT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_FLOAT_EQ(rope_attention_scale(c), floats(fx, "rope_attention_scaling")[0]);
  EXPECT_LT(rel_err(rope_inv_freq(c), floats(fx, "rope_inv_freq")), 1e-6);
  c.rope_scaling.truncate = false;
  const auto untruncated = floats(fx, "rope_inv_freq_untruncated");
  EXPECT_LT(rel_err(rope_inv_freq(c), untruncated), 1e-6);
  EXPECT_GT(rel_err(floats(fx, "rope_inv_freq"), untruncated), 1e-3) << "the two ramps differ";
}

TEST(HfParity, ShardedCheckpointLoadsTheSameWeights) {
  SafetensorsArchive fx(fixtures() + "/parity/llama_gqa.safetensors");
  Batch b = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
  TestModel a = make_model("llama_gqa", fixture_lora(), 2, 12);
  TestModel s = make_model("llama_gqa_sharded", fixture_lora(), 2, 12);
  EXPECT_EQ(a.model->logits(b), s.model->logits(b));
}

// An adapter the engine trained (`qlora train`), loaded by PEFT in Python onto the fixture model
// (tools/make_parity_fixtures.py --check-engine-adapter): PEFT's logits equal the engine's.
void expect_engine_adapter_gives_peft_logits(const std::string& variant, size_t n_targets) {
  const std::string dir = fixtures() + "/parity/engine_adapter_" + variant;
  LoraSpec lora = read_peft_adapter_config(dir + "/adapter_config.json");
  ASSERT_TRUE(lora.use_rslora);
  ASSERT_EQ(lora.targets.size(), n_targets);
  SafetensorsArchive fx(fixtures() + "/parity/" + variant + ".safetensors");
  SafetensorsArchive peft(dir + "/peft_logits.safetensors");
  Batch b = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
  TestModel t = make_model(variant, lora, 2, 12);
  load_peft_adapter(dir, *t.model);
  auto ours = t.model->logits(b);
  auto ref = floats(peft, "peft_logits");
  EXPECT_LT(rel_err(ours, ref), kLogitTol);
  EXPECT_GT(rel_err(floats(fx, "logits"), ref), 100 * kLogitTol) << "the trained adapter should change the logits";
}

// r=8, rsLoRA, dropout, 3 targets.
TEST(HfParity, EngineTrainedAdapterGivesPeftLogits) { expect_engine_adapter_gives_peft_logits("llama_gqa", 3); }
// Gemma 3: r=8, rsLoRA, dropout 0.1, all-linear, 12 steps of `qlora train` on token ids.
TEST(HfParity, EngineTrainedGemma3AdapterGivesPeftLogits) { expect_engine_adapter_gives_peft_logits("gemma3", 7); }
// Gemma 3's multimodal checkpoint (Gemma3ForConditionalGeneration): the same run on its text model;
// the adapter's keys sit under model.language_model and its target_modules regex keeps PEFT off the
// vision tower, so PEFT loads it onto the multimodal model as it is.
TEST(HfParity, EngineTrainedGemma3MultimodalAdapterGivesPeftLogits) {
  expect_engine_adapter_gives_peft_logits("gemma3_mm", 7);
}
// Phi-3: the same run; the adapter holds PEFT's four fused modules (qkv_proj, o_proj,
// gate_up_proj, down_proj), which PEFT loads onto Phi3ForCausalLM as they are.
TEST(HfParity, EngineTrainedPhi3AdapterGivesPeftLogits) { expect_engine_adapter_gives_peft_logits("phi3", 4); }
// Mixtral and Qwen3-MoE: the same run (12 steps on token ids); the adapter holds the attention's
// four modules, which PEFT loads onto MixtralForCausalLM / Qwen3MoeForCausalLM over routed experts.
TEST(HfParity, EngineTrainedMixtralAdapterGivesPeftLogits) { expect_engine_adapter_gives_peft_logits("mixtral", 4); }
TEST(HfParity, EngineTrainedQwen3MoeAdapterGivesPeftLogits) { expect_engine_adapter_gives_peft_logits("qwen3_moe", 4); }
// LoRA on the experts: 12 steps of `qlora train` (r 8, rsLoRA, q_proj and v_proj, and
// target_parameters on both expert stacks); PEFT loads the adapter's ParamWrapper tensors onto
// Qwen3MoeForCausalLM's stacked experts and gives the engine's logits.
// gpt-oss: the same run (12 steps, r 8, rsLoRA) on q, v, o and both expert stacks over the MXFP4
// experts as shipped; PEFT loads gate_up_proj's B with gate's and up's rows interleaved as
// GptOssExperts holds them and gives the engine's logits.
TEST(HfParity, EngineTrainedGptOssAdapterGivesPeftLogits) {
  expect_engine_adapter_gives_peft_logits("gpt_oss", 3);
  EXPECT_EQ(read_peft_adapter_config(fixtures() + "/parity/engine_adapter_gpt_oss/adapter_config.json").expert_targets.size(), 2u);
}
TEST(HfParity, EngineTrainedExpertAdapterGivesPeftLogits) {
  expect_engine_adapter_gives_peft_logits("qwen3_moe_experts", 2);
  EXPECT_EQ(read_peft_adapter_config(fixtures() + "/parity/engine_adapter_qwen3_moe_experts/adapter_config.json").expert_targets,
            (std::vector<std::string>{"gate_up_proj", "down_proj"}));
}
