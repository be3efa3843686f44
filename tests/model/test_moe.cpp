// Mixture-of-experts models (Mixtral, Qwen3-MoE) beyond the parity and finite-difference checks:
// what their config.json may say, what the engine refuses for them, the presets and planner sums,
// and gradient checkpointing's recompute of the routed layer.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_util.h"
#include "model/llama_config.h"
#include "model_test_util.h"
#include "plan/flops.h"
#include "plan/gpu_catalog.h"
#include "plan/planner.h"
#include "plan/report.h"
#include "quant/quantize.h"

using namespace qlora;
using namespace qlora::testing_util;

namespace {

std::string fixture_config(const std::string& variant, const std::string& patch) {
  nlohmann::json j = read_json_file(fixtures() + "/models/" + variant + "/config.json");
  j.merge_patch(nlohmann::json::parse(patch));
  return j.dump();
}

Error config_error_of(const std::string& text) {
  try {
    parse_hf_config(text, "m.json");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "parse_hf_config accepted " << text;
  return Error(ErrorKind::Internal, "", "");
}

}  // namespace

TEST(Moe, ConfigReadsTheExpertsOfBothFamilies) {
  const LlamaConfig m = parse_hf_config(fixture_config("mixtral", "{}"), "m.json");
  EXPECT_EQ(m.n_experts, 16);
  EXPECT_EQ(m.experts_per_tok, 2);
  EXPECT_EQ(m.expert_intermediate_size, 32);
  EXPECT_TRUE(m.norm_topk_prob);  // Mixtral always renormalises
  const LlamaConfig q = parse_hf_config(fixture_config("qwen3_moe", "{}"), "q.json");
  EXPECT_EQ(q.n_experts, 32);  // transformers 5 writes num_local_experts
  EXPECT_EQ(q.experts_per_tok, 4);
  EXPECT_EQ(q.expert_intermediate_size, 24);
  EXPECT_FALSE(q.norm_topk_prob);
  EXPECT_TRUE(q.qk_norm);
  // Hub files name it num_experts.
  const LlamaConfig h = parse_hf_config(
      fixture_config("qwen3_moe", R"({"num_local_experts":null,"num_experts":12,"norm_topk_prob":true})"), "q.json");
  EXPECT_EQ(h.n_experts, 12);
  EXPECT_TRUE(h.norm_topk_prob);
  // Every expert counts in the parameters, only the chosen ones in the active parameters.
  EXPECT_EQ(m.n_params() - m.active_params(), m.n_layer * (16 - 2) * 3 * 64 * 32);
}

TEST(Moe, ConfigReadsTheLoadBalancingLoss) {
  // output_router_logits adds router_aux_loss_coef times the loss; without the key, the config
  // class's default coefficient (Mixtral 0.02, Qwen3-MoE 0.001); without output_router_logits, none.
  EXPECT_EQ(parse_hf_config(fixture_config("mixtral", R"({"output_router_logits":true,"router_aux_loss_coef":0.3})"), "m.json")
                .router_aux_loss_coef, 0.3);
  json m = json::parse(fixture_config("mixtral", R"({"output_router_logits":true})"));
  m.erase("router_aux_loss_coef");
  EXPECT_EQ(parse_hf_config(m.dump(), "m.json").router_aux_loss_coef, 0.02);
  json q = json::parse(fixture_config("qwen3_moe", R"({"output_router_logits":true})"));
  q.erase("router_aux_loss_coef");
  EXPECT_EQ(parse_hf_config(q.dump(), "q.json").router_aux_loss_coef, 0.001);
  EXPECT_EQ(parse_hf_config(fixture_config("mixtral", "{}"), "m.json").router_aux_loss_coef, 0.0);
  Error e = config_error_of(fixture_config("mixtral", R"({"output_router_logits":true,"router_aux_loss_coef":-1})"));
  EXPECT_EQ(e.where(), "m.json: key 'router_aux_loss_coef'");
}

TEST(Moe, ConfigRefusesWhatTheEngineDoesNotImplement) {
  Error e = config_error_of(fixture_config("mixtral", R"({"router_jitter_noise":0.1})"));
  EXPECT_EQ(e.where(), "m.json: key 'router_jitter_noise'");
  e = config_error_of(fixture_config("qwen3_moe", R"({"mlp_only_layers":[1]})"));
  EXPECT_EQ(e.where(), "m.json: key 'mlp_only_layers'");
  e = config_error_of(fixture_config("qwen3_moe", R"({"decoder_sparse_step":2})"));
  EXPECT_EQ(e.where(), "m.json: key 'decoder_sparse_step'");
  e = config_error_of(fixture_config("qwen3_moe", R"({"num_experts_per_tok":40})"));
  EXPECT_EQ(e.kind(), ErrorKind::Config);
  EXPECT_EQ(e.where(), "m.json: key 'num_experts_per_tok'");
}

TEST(Moe, LoraIsOnTheAttentionAndTheExpertsAreRefused) {
  const LlamaConfig c = parse_hf_config(fixture_config("mixtral", "{}"), "m.json");
  EXPECT_EQ(lora_modules(c), (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}));
  EXPECT_EQ(lora_targets_for(c, {"v_proj", "q_proj"}), (std::vector<std::string>{"q_proj", "v_proj"}));
  // A MLP projection, and all-linear (which in PEFT adapts the stacked experts and the router).
  for (const std::vector<std::string>& t : {std::vector<std::string>{"q_proj", "down_proj"},
                                            LoraSpec::resolve_targets({"all-linear"})}) {
    try {
      lora_targets_for(c, t);
      FAIL() << "LoRA on the experts was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
      EXPECT_EQ(e.where(), "target_modules");
      EXPECT_NE(e.message().find("experts"), std::string::npos) << e.message();
      EXPECT_NE(e.hint().find("q_proj, k_proj, v_proj, o_proj"), std::string::npos) << e.hint();
    }
  }
}

TEST(Moe, RefusedBaseModesBeforeAllocating) {
  for (const char* what : {"fsdp", "tile"}) {
    SCOPED_TRACE(what);
    ModelPlanOptions po;
    po.micro_batch = 2;
    po.seq_len = 12;
    if (std::string(what) == "fsdp") po.base_shards = 1;
    if (std::string(what) == "tile") po.checkpointing = Checkpointing::Full, po.mlp_tile = 4;
    try {
      make_model_on(make_cpu_backend(), "qwen3_moe", po, fixture_lora("qwen3_moe"));
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
      EXPECT_NE(e.where().find("mixture of experts"), std::string::npos) << e.where();
    }
  }
}

// One forward_backward of the parity fixture's batch on `variant` with its adapter, checkpointing
// `ckpt`: the summed token loss, the load-balancing loss and every LoRA gradient.
struct RoutedRun {
  double loss = 0, aux = 0;
  std::vector<std::vector<float>> grads;
};
RoutedRun routed_run(const std::string& variant, const char* ckpt) {
  SafetensorsArchive fx(fixtures() + "/parity/" + variant + ".safetensors");
  const Batch b = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
  TestModel t = make_model(variant, fixture_lora(variant), 2, 12, ckpt);
  load_peft_adapter(fixtures() + "/parity/" + variant + "_adapter", *t.model);
  t.model->zero_grads();
  RoutedRun r;
  r.loss = t.model->forward_backward(b, 1.0f, 0);
  r.aux = t.model->last_aux_loss();
  for (auto& p : t.model->trainable_params()) {
    std::vector<float> g(size_t(p.g.numel()));
    t.be->copy_to_host(g.data(), p.g.data, g.size() * 4);
    r.grads.push_back(g);
  }
  return r;
}

// The recompute of a checkpointed MoE layer routes the same tokens to the same experts: the
// gradients equal those of the run that saved every activation.
TEST(Moe, CheckpointingRecomputesTheRoutedLayerExactly) {
  const RoutedRun saved = routed_run("mixtral", "none"), recomputed = routed_run("mixtral", "full");
  EXPECT_EQ(saved.loss, recomputed.loss);
  ASSERT_EQ(saved.grads.size(), recomputed.grads.size());
  for (size_t i = 0; i < saved.grads.size(); i++) EXPECT_EQ(saved.grads[i], recomputed.grads[i]) << i;
}

// With the load-balancing loss: the recompute adds no second set of router statistics (the loss
// and the gradients equal those of the run that saved every activation), right padding is left
// out of it as transformers' attention mask leaves it out (a padded row's aux loss equals that of
// the same tokens without the padding), and a preference objective beside it is refused.
TEST(Moe, LoadBalancingLossCountsEachRealTokenOnce) {
  const RoutedRun saved = routed_run("mixtral_aux", "none"), recomputed = routed_run("mixtral_aux", "full");
  EXPECT_GT(saved.aux, 0.0);
  EXPECT_EQ(saved.aux, recomputed.aux);
  ASSERT_EQ(saved.grads.size(), recomputed.grads.size());
  for (size_t i = 0; i < saved.grads.size(); i++) EXPECT_EQ(saved.grads[i], recomputed.grads[i]) << i;
  SafetensorsArchive fx(fixtures() + "/parity/mixtral_aux.safetensors");
  const Batch b = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));

  // Row 0's first 7 tokens, alone, and padded to 12 with token 0 (the padding routes somewhere).
  const std::vector<int32_t> ids = ints(fx, "input_ids");
  std::vector<int32_t> seven(ids.begin(), ids.begin() + 7), padded = seven;
  padded.resize(12, 0);
  TestModel t = make_model("mixtral_aux", fixture_lora("mixtral_aux"), 1, 12);
  load_peft_adapter(fixtures() + "/parity/mixtral_aux_adapter", *t.model);
  Batch alone = Batch::from_hf(1, 7, seven, seven), pad = Batch::from_hf(1, 12, padded, padded);
  t.model->forward_backward(alone, 1.0f, 0);
  const double want = t.model->last_aux_loss();
  t.model->forward_backward(pad, 1.0f, 0);
  const double with_pad_counted = t.model->last_aux_loss();
  pad.lens = {7};
  t.model->forward_backward(pad, 1.0f, 0);
  EXPECT_NEAR(t.model->last_aux_loss(), want, 1e-6 * want);
  EXPECT_GT(std::fabs(with_pad_counted - want), 1e-3 * want) << "the padding's routing changes the loss when counted";
  const DecoderModel::RowWeightFn weigh = [](const std::vector<float>& r) { return std::vector<float>(r.size(), 1.0f); };
  try {
    t.model->forward_backward_weighted(b, weigh, 0);
    ADD_FAILURE() << "a preference objective beside the load-balancing loss must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_EQ(e.where(), "output_router_logits");
  }
}

TEST(Moe, PresetsAndFlopsCountTheChosenExperts) {
  const LlamaConfig q = preset_config("qwen3-30b-a3b");
  EXPECT_EQ(q.n_experts, 128);
  EXPECT_EQ(q.experts_per_tok, 8);
  // Qwen3-30B-A3B: 30.5B parameters, 3.3B active (the model card).
  EXPECT_NEAR(double(q.n_params()) / 1e9, 30.5, 0.1);
  EXPECT_NEAR(double(q.active_params()) / 1e9, 3.3, 0.06);  // 3.35 counted here; the card rounds down
  const LlamaConfig m = preset_config("mixtral-8x7b");
  EXPECT_NEAR(double(m.n_params()) / 1e9, 46.7, 0.1);  // Mixtral 8x7B: 46.7B, 12.9B active
  EXPECT_NEAR(double(m.active_params()) / 1e9, 12.9, 0.05);
  // The forward's base GEMM FLOPs per token: 2 x the active linear weights (not the embeddings).
  FlopOptions o;
  o.method = Method::Lora;
  o.lora_r = 16;
  o.targets = lora_modules(m);
  o.attn_len = 1;
  const FlopCounts f = flops_per_token(m, o);
  const double linear = double(m.active_params() - 2 * m.vocab_size * m.hidden_size) -
                        double(m.n_layer) * (2.0 * double(m.hidden_size)) - double(m.hidden_size);
  EXPECT_NEAR(f.fwd.base / (2 * linear), 1.0, 1e-9);
}

// LoRA on the experts in the plan (the buffers the engine allocates) and the FLOP count: per layer
// and adapted stack an A (E*r, in) and B (E*out, r) with gradients and two AdamW moments, the
// intermediates per routed row; per token each chosen expert applies its pair.
TEST(Moe, ExpertLoraIsPlannedAndCounted) {
  const LlamaConfig q = preset_config("qwen3-30b-a3b");
  ModelPlanOptions o;
  o.lora.r = 16;
  o.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
  o.micro_batch = 1;
  o.seq_len = 4096;
  auto lora_bytes = [&](const ModelPlanOptions& opts) {
    MemoryPlan p;
    plan_model_buffers(p, q, opts);
    return p.bytes_by_category().at(MemCategory::Lora);
  };
  ModelPlanOptions e = o;
  e.lora.expert_targets = {"gate_up_proj", "down_proj"};
  const int64_t C = q.hidden_size, F = q.expert_intermediate_size, E = q.n_experts, r = 16;
  const int64_t per_layer = E * r * (C + 2 * F) + E * r * (F + C);  // gate_up: A (E r, C), B (E 2F, r); down
  EXPECT_EQ(lora_bytes(e) - lora_bytes(o), q.n_layer * per_layer * 4);
  MemoryPlan p;
  plan_model_buffers(p, q, e);
  EXPECT_EQ(p.find("layers.3.experts.gate_up_proj.lora_B")->shape, (std::vector<int64_t>{E * 2 * F, r}));
  EXPECT_EQ(p.find("act.layers.0.experts.down_proj.lora_h")->shape, (std::vector<int64_t>{4096 * q.experts_per_tok, r}));
  FlopOptions f;
  f.lora_r = r;
  f.targets = o.lora.targets;
  f.attn_len = 1;
  const double dense = flops_per_token(q, f).fwd.lora;
  f.expert_targets = e.lora.expert_targets;
  // Forward: 2 r (in + out) per adapted matrix and token, for each of the token's experts.
  EXPECT_NEAR(flops_per_token(q, f).fwd.lora - dense,
              2.0 * r * double(q.n_layer * q.experts_per_tok * ((C + 2 * F) + (F + C))), 1.0);
  // Not on a dense model, nor with dropout (PEFT's ParamWrapper has none).
  ModelPlanOptions dense_model = e;
  const LlamaConfig d = preset_config("qwen3-8b");
  EXPECT_THROW(plan_model_buffers(p, d, dense_model), Error);
  e.lora.dropout = 0.05;
  try {
    plan_model_buffers(p, q, e);
    ADD_FAILURE() << "dropout on the experts' adapters was accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(err.what()).find("target_parameters"), std::string::npos) << err.what();
  }
}

// An adapter on the experts goes to PEFT's layout and back: a model that loads what another wrote
// holds the same parameters, bit for bit (the experts' B permuted both ways), and the file holds
// PEFT's shapes.
TEST(Moe, ExpertAdapterRoundTripsThroughPeftLayout) {
  TestModel a = make_model("qwen3_moe_experts", fixture_lora("qwen3_moe_experts"), 2, 12);
  Rng rng(3);
  for (auto& p : a.model->trainable_params()) {
    std::vector<float> h(size_t(p.w.numel()));
    for (auto& x : h) x = rng.uniform(-1.0f, 1.0f);
    a.be->copy_to_device(p.w.data, h.data(), h.size() * 4);
  }
  const std::string dir = (std::filesystem::temp_directory_path() / "qlora-expert-adapter-rt").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_peft_adapter(dir, *a.model, "base");
  TestModel b = make_model("qwen3_moe_experts", fixture_lora("qwen3_moe_experts"), 2, 12);
  load_peft_adapter(dir, *b.model);
  SafetensorsArchive ar(dir + "/adapter_model.safetensors");
  int experts_b = 0;
  for (size_t i = 0; i < a.model->trainable_params().size(); i++) {
    const TrainParam &pa = a.model->trainable_params()[i], &pb = b.model->trainable_params()[i];
    EXPECT_EQ(host_copy(*a.model, pa.w), host_copy(*b.model, pb.w)) << pa.peft_key;
    EXPECT_EQ(ar.get(pa.peft_key).shape, peft_shape(pa)) << pa.peft_key;
    if (pa.experts == 0) continue;
    experts_b++;
    // Expert 5's column 2 of its rows: PEFT's column 2 * E + 5.
    const std::vector<float> w = host_copy(*a.model, pa.w), f = ar.read_f32(pa.peft_key, peft_shape(pa));
    const int64_t E = pa.experts, out = pa.w.dim(0) / E, r = pa.w.dim(1);
    for (int64_t o = 0; o < out; o += 7) EXPECT_EQ(f[size_t(o * r * E + 2 * E + 5)], w[size_t((5 * out + o) * r + 2)]);
  }
  EXPECT_EQ(experts_b, 2 * 2);  // two stacks in each of two layers
  std::filesystem::remove_all(dir);
}

// QLoRA on a MoE model: the attention's projections and every expert stored as NF4 (each expert
// dequantized before its GEMMs). The run equals a float run on the weights each quantization
// gives back, to f32 summation order: the loss, and every LoRA gradient.
TEST(Moe, Nf4ExpertsEqualTheFloatModelOnTheirDequantizedWeights) {
  for (const char* variant : {"mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(variant);
    SafetensorsArchive fx(fixtures() + "/parity/" + std::string(variant) + ".safetensors");
    const Batch b = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
    ModelPlanOptions po;
    po.micro_batch = 2;
    po.seq_len = 12;
    po.checkpointing = Checkpointing::Full;
    po.base_precision = BasePrecision::Nf4;
    TestModel q = make_model_on(make_cpu_backend(), variant, po, fixture_lora(variant), std::string("parity/") + variant + "_adapter");
    EXPECT_TRUE(q.model->quantized_base());
    // The float model reads every weight the NF4 model quantizes through a quantize/dequantize.
    const QuantParams qp = q.model->base_quant();
    ModelSource src = open_model_source(fixtures() + "/models/" + variant);
    TensorSource rt = src.tensors;
    const TensorSource inner = src.tensors;
    rt.read_f32 = [inner, qp](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
      inner.read_f32(n, shape, dst);
      const bool quantized = n.find("_proj.weight") != std::string::npos || n.find(".experts.") != std::string::npos;
      if (!quantized) return;
      const QuantizedTensor t = quantize_ref(dst, shape[0], shape[1], qp);
      dequantize_ref(t, dst);
    };
    po.base_precision.reset();
    TestModel f;
    f.be = make_cpu_backend();
    f.model = std::make_unique<DecoderModel>(src.config, *f.be, po, fixture_lora(variant));
    f.model->load_base(rt);
    f.model->init_trainable(1);
    load_peft_adapter(fixtures() + "/parity/" + std::string(variant) + "_adapter", *f.model);
    const double lq = q.model->forward_backward(b, 1.0f, 0), lf = f.model->forward_backward(b, 1.0f, 0);
    EXPECT_NEAR(lq, lf, 1e-5 * std::fabs(lf));
    EXPECT_GT(std::fabs(lq - floats(fx, "lora_loss")[0] * double(b.n_trained())), 1e-4 * std::fabs(lq))
        << "NF4 should change the loss";
    auto& gq = q.model->trainable_params();
    auto& gf = f.model->trainable_params();
    ASSERT_EQ(gq.size(), gf.size());
    for (size_t i = 0; i < gq.size(); i++) {
      std::vector<float> a(size_t(gq[i].g.numel())), c(a.size());
      q.be->copy_to_host(a.data(), gq[i].g.data, a.size() * 4);
      f.be->copy_to_host(c.data(), gf[i].g.data, c.size() * 4);
      EXPECT_LT(rel_err(a, c), 2e-5) << gq[i].peft_key;
    }
  }
}

// The router statistics' source: a training forward counts each (token, choice) once per layer;
// the recompute of a checkpointed layer, evaluation forwards and the base-only (reference)
// forwards of preference training count nothing.
TEST(Moe, RoutedTokensCountEachTrainingChoiceOnce) {
  SafetensorsArchive fx(fixtures() + "/parity/qwen3_moe.safetensors");
  const Batch b = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
  TestModel t = make_model("qwen3_moe", fixture_lora("qwen3_moe"), 2, 12, "full");
  const LlamaConfig& c = t.model->config();
  ASSERT_EQ(t.model->routed_tokens().size(), size_t(c.n_layer * c.n_experts));
  t.model->forward_backward(b, 1.0f, 0);
  t.model->forward_loss(b);
  t.model->set_adapters_enabled(false);  // a reference model's token losses
  t.model->token_losses(b);
  t.model->set_adapters_enabled(true);
  int64_t idle = 0;
  for (int64_t l = 0; l < c.n_layer; l++) {
    int64_t sum = 0;
    for (int64_t e = 0; e < c.n_experts; e++) {
      const int64_t k = t.model->routed_tokens()[size_t(l * c.n_experts + e)];
      sum += k;
      idle += k == 0;
    }
    EXPECT_EQ(sum, b.n() * c.experts_per_tok) << "layer " << l;
  }
  EXPECT_GT(idle, 0);  // the fixture leaves experts idle (tools/make_parity_fixtures.py asserts it)
  t.model->reset_routed_tokens();
  for (int64_t k : t.model->routed_tokens()) EXPECT_EQ(k, 0);
}

// gpt-oss is parsed and planned, never trained: its config.json as the Hub ships it (sinks, biases,
// clamped SwiGLU are what the engine lacks), its presets' totals, and qlora plan's answer
// to whether the 20B model with its MXFP4 experts trains on a 24 GB GPU.
TEST(Moe, GptOssConfigAndPlan) {
  const LlamaConfig c = parse_hf_config(R"({
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880,
    "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
    "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
      "sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
      "sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
      "sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
      "sliding_attention", "full_attention"],
    "rope_theta": 150000, "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
      "truncate": false, "original_max_position_embeddings": 4096},
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "swiglu_limit": 7.0, "tie_word_embeddings": false,
    "attention_bias": true, "router_aux_loss_coef": 0.9, "output_router_logits": false, "hidden_act": "silu",
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
      "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
    "eos_token_id": 200002, "pad_token_id": 199999, "torch_dtype": "bfloat16"})",
                                        "gpt-oss/config.json");
  EXPECT_EQ(c.n_experts, 32);
  EXPECT_EQ(c.experts_per_tok, 4);
  EXPECT_EQ(c.experts_stored, "mxfp4");
  EXPECT_EQ(c.window_of(0), 128);
  EXPECT_EQ(c.window_of(1), 0);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_TRUE(c.attention_sinks && c.o_proj_bias && c.moe_biases && c.attention_bias);
  EXPECT_EQ(c.hidden_act, Activation::ClampedSwiglu);
  EXPECT_FLOAT_EQ(c.swiglu_clamp.limit, 7.0f);
  EXPECT_FLOAT_EQ(c.swiglu_clamp.alpha, 1.702f);
  EXPECT_EQ(c.router_aux_loss_coef, 0.0);  // output_router_logits false
  // The preset is the same model: 20.9B parameters, 3.61B active without the input embedding
  // (OpenAI's model card counts the unembedding, not the embedding).
  const LlamaConfig p = preset_config("gpt-oss-20b");
  EXPECT_EQ(p.n_params(), c.n_params());
  EXPECT_NEAR(double(p.n_params()) / 1e9, 20.9, 0.05);
  EXPECT_NEAR(double(p.active_params() - p.vocab_size * p.hidden_size) / 1e9, 3.61, 0.01);
  const LlamaConfig big = preset_config("gpt-oss-120b");  // 116.8B, 5.13B active
  EXPECT_NEAR(double(big.n_params()) / 1e9, 116.8, 0.1);
  EXPECT_NEAR(double(big.active_params() - big.vocab_size * big.hidden_size) / 1e9, 5.13, 0.01);
  // LoRA on the 20B model over its MXFP4 experts (bf16 attention) at 2k tokens with checkpointing
  // fits a 24 GB GPU, and the plan raises no warning that the engine would not run it; bf16
  // experts do not fit.
  PlanRequest r;
  r.model = p;
  r.model_label = "gpt-oss-20b";
  r.gpu = resolve_gpu("rtx4090");
  r.method = Method::Lora;
  r.seq_len = 2048;
  r.micro_batch = 1;
  r.checkpointing = Checkpointing::Full;
  PlanResult plan = make_plan(r);
  ASSERT_TRUE(plan.req.expert_precision.has_value());
  EXPECT_EQ(*plan.req.expert_precision, BasePrecision::Mxfp4);
  EXPECT_NE(plan_text(plan).find("base bf16, experts mxfp4"), std::string::npos) << plan_text(plan);
  EXPECT_TRUE(plan.fits);
  for (const auto& w : plan.warnings) EXPECT_EQ(w.find("engine"), std::string::npos) << w;
  r.expert_precision = BasePrecision::Bf16;
  EXPECT_FALSE(make_plan(r).fits);
}

// What a gpt-oss checkpoint may carry that the engine does not implement, or that is malformed, is
// refused naming the key or tensor: dropout inside the model, a clamp limit that is no limit, an
// `mxfp4` quantization_config on another family, MXFP4 blocks whose shape disagrees with their
// scales.
TEST(Moe, GptOssCheckpointErrors) {
  namespace fs = std::filesystem;
  const std::string fixture = fixtures() + "/models/gpt_oss";
  const json cfg = read_json_file(fixture + "/config.json");
  auto expect_error = [](const std::function<void()>& f, ErrorKind kind, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected an error naming " << part;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  auto with = [&](const char* key, const json& value) {
    json j = cfg;
    j[key] = value;
    return j.dump();
  };
  expect_error([&] { parse_hf_config(with("attention_dropout", 0.1), "c.json"); }, ErrorKind::Unsupported,
               "key 'attention_dropout'");
  expect_error([&] { parse_hf_config(with("swiglu_limit", -1.0), "c.json"); }, ErrorKind::Config, "key 'swiglu_limit'");

  const fs::path dir = fs::temp_directory_path() / "qlora-gpt-oss-errors";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {  // another family's config beside an mxfp4 quantization_config
    json llama = read_json_file(fixtures() + "/models/llama_gqa/config.json");
    llama["quantization_config"] = cfg.at("quantization_config");
    fs::copy(fixtures() + "/models/llama_gqa/model.safetensors", dir / "model.safetensors");
    write_file_atomic((dir / "config.json").string(), llama.dump());
    expect_error([&] { open_model_source(dir.string()); }, ErrorKind::Unsupported, "'mxfp4' checkpoints are read for gpt-oss only");
  }
  {  // the first layer's gate_up blocks declared (E, rows, 4, 8): the same bytes, a shape the scales contradict
    SafetensorsArchive ar(fixture);
    SafetensorsWriter w;
    const std::string bad = "model.layers.0.mlp.experts.gate_up_proj_blocks";
    for (const auto& n : ar.names()) {
      const TensorInfo& t = ar.get(n);
      std::vector<int64_t> shape = t.shape;
      if (n == bad) shape = {shape[0], shape[1], shape[2] * 2, 8};
      w.add_ref(n, t.dtype, shape, t.data);
    }
    w.write((dir / "model.safetensors").string());
    write_file_atomic((dir / "config.json").string(), cfg.dump());
    ModelPlanOptions po;
    po.micro_batch = 1;
    po.seq_len = 8;
    const ModelSource src = open_model_source(dir.string());
    adopt_stored_quantization(po, src.tensors);  // the experts as shipped, as the trainer takes them
    ASSERT_TRUE(po.expert_precision.has_value());
    auto be = make_cpu_backend();
    DecoderModel m(src.config, *be, po, fixture_lora("gpt_oss"));
    expect_error([&] { m.load_base(src.tensors); }, ErrorKind::Format, bad + "': has shape");
  }
  fs::remove_all(dir);
}

// QLoRA on gpt-oss: the attention in NF4 (base_precision) beside the experts in the checkpoint's
// own MXFP4 bytes: both stored quantized, and the loss within NF4's rounding of the float
// attention's (the experts' bytes are the same in both runs).
TEST(Moe, GptOssNf4AttentionBesideMxfp4Experts) {
  SafetensorsArchive fx(fixtures() + "/parity/gpt_oss.safetensors");
  const Batch b = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
  ModelPlanOptions po;
  po.micro_batch = 2;
  po.seq_len = 12;
  TestModel f = make_model_on(make_cpu_backend(), "gpt_oss", po, fixture_lora("gpt_oss"));
  po.method = Method::Qlora;
  po.base_precision = BasePrecision::Nf4;
  TestModel q = make_model_on(make_cpu_backend(), "gpt_oss", po, fixture_lora("gpt_oss"));
  ASSERT_TRUE(q.model->quantized_base());
  const PlannedBuffer* stack = q.model->plan().find("layers.0.experts.gate_proj");
  const PlannedBuffer* attn = q.model->plan().find("layers.0.q_proj");
  ASSERT_TRUE(stack && attn);
  EXPECT_EQ(stack->bytes, f.model->plan().find("layers.0.experts.gate_proj")->bytes) << "MXFP4 in both";
  EXPECT_EQ(q.model->base_quantized(0, "q_proj").params.format, QuantFormat::NF4);
  const double lf = f.model->forward_loss(b) / double(b.n_trained()), lq = q.model->forward_loss(b) / double(b.n_trained());
  EXPECT_NEAR(lq, double(floats(fx, "loss")[0]), 0.05 * lf);  // NF4 moves the loss a little
  EXPECT_NE(lq, lf);                                           // but it does move it: the attention is NF4
  q.model->zero_grads();
  const double l = q.model->forward_backward(b, 1.0f, 0);
  EXPECT_TRUE(std::isfinite(l));
}
