// LlamaConfig: transformers-written config.json files, public parameter totals of real models, RoPE vs
// transformers, and every config error.
#include "model/llama_config.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/memory_plan.h"
#include "io/json_util.h"
#include "model/model_plan.h"

using namespace qlora;

static const std::string kFix = std::string(QLORA_FIXTURES) + "/io";

template <class F>
static Error config_error(F&& f, ErrorKind kind) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(int(e.kind()), int(kind)) << e.what();
    return e;
  }
  ADD_FAILURE() << "expected a qlora::Error of kind " << error_kind_name(kind);
  return Error(ErrorKind::Internal, "", "");
}

static bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---------------------------------------------------------------------------------------------------
// Presets against published parameter totals (model cards / safetensors index "total_size" / 2).

TEST(LlamaConfigPresets, ParameterCountsMatchPublishedTotals) {
  const std::pair<const char*, int64_t> known[] = {
      {"llama3-8b", 8030261248},       {"llama3-70b", 70553706496},   {"llama3.2-1b", 1235814400},
      {"smollm2-135m", 134515008},     {"qwen2.5-7b", 7615616512},    {"llama3.1-8b", 8030261248},
      {"llama3.1-405b", 405853388800}, {"llama3.2-3b", 3212749824},   {"llama2-7b", 6738415616},
      {"mistral-7b", 7248023552},      {"qwen2.5-0.5b", 494032768},   {"qwen2.5-72b", 72706203648},
      {"smollm2-360m", 361821120},     {"smollm2-1.7b", 1711376384},  {"tinyllama-1.1b", 1100048384},
  };
  for (const auto& [name, total] : known) EXPECT_EQ(preset_config(name).n_params(), total) << name;
}

TEST(LlamaConfigPresets, AllPresetsValidAndNamed) {
  const auto& names = preset_names();
  EXPECT_EQ(names.size(), 38u);
  for (const auto& n : names) {
    SCOPED_TRACE(n);
    EXPECT_TRUE(has_preset(n));
    LlamaConfig c = preset_config(n);
    EXPECT_EQ(c.name, n);
    EXPECT_NO_THROW(c.validate(n));
    EXPECT_EQ(c.attention_bias, c.model_type == "qwen2" || c.model_type == "gpt_oss");
    const bool gemma3 = c.model_type == "gemma3_text";
    EXPECT_EQ(c.qk_norm, c.model_type == "qwen3" || c.model_type == "qwen3_moe" || gemma3);
    EXPECT_EQ(c.moe(), c.model_type == "mixtral" || c.model_type == "qwen3_moe" || c.model_type == "gpt_oss");
    EXPECT_EQ(c.sandwich_norms, gemma3 || c.model_type == "gemma2");
    // Llama 3.1/3.2 extend context with llama3 RoPE scaling, Gemma 3 4B-27B with linear scaling
    // (factor 8) on the global layers, Phi-3.5-mini and Phi-4-mini with LongRoPE; the others use plain RoPE.
    bool scaled = n.rfind("llama3.1", 0) == 0 || n.rfind("llama3.2", 0) == 0;
    const bool linear = gemma3 && n != "gemma-3-1b" && n != "gemma-3-270m";
    const bool longrope = n == "phi-3.5-mini" || n == "phi-4-mini";
    EXPECT_EQ(c.rope_scaling.type, scaled ? "llama3" : linear ? "linear" : longrope ? "longrope"
                                   : c.model_type == "gpt_oss" ? "yarn" : "none");
  }
  EXPECT_EQ(preset_config("llama3.2-1b").rope_scaling.factor, 32.0);
  EXPECT_EQ(preset_config("llama3.1-70b").rope_scaling.factor, 8.0);
  EXPECT_EQ(preset_config("llama3.2-1b").head_dim, 64);
  EXPECT_EQ(preset_config("mistral-7b").vocab_size, 32768);
  // Qwen3-8B's published size, 8,190,735,360 parameters: q/k norms included, untied head.
  EXPECT_EQ(preset_config("qwen3-8b").n_params(), 8190735360);
  EXPECT_EQ(preset_config("qwen3-0.6b").head_dim, 128);  // not hidden / heads = 64
  EXPECT_TRUE(preset_config("qwen3-4b").tie_word_embeddings);
  EXPECT_FALSE(has_preset("llama3-8"));
}

TEST(LlamaConfigPresets, UnknownPresetSuggestsClosest) {
  Error e = config_error([] { preset_config("llama3-8"); }, ErrorKind::Config);
  EXPECT_TRUE(contains(e.hint(), "did you mean 'llama3-8b'")) << e.hint();
  EXPECT_TRUE(contains(e.hint(), "smollm2-135m"));  // lists the choices
  e = config_error([] { preset_config("qwen2.5-7B"); }, ErrorKind::Config);
  EXPECT_TRUE(contains(e.hint(), "'qwen2.5-7b'")) << e.hint();
}

// ---------------------------------------------------------------------------------------------------
// config.json written by transformers; parameter counts of the models transformers built from them.

TEST(LlamaConfigHf, TransformersConfigsMatchTheirModels) {
  json counts = read_json_file(kFix + "/hf_configs/n_params.json");
  for (const auto& [name, n] : counts.items()) {
    SCOPED_TRACE(name);
    LlamaConfig c = load_hf_config(kFix + "/hf_configs/" + name + ".json");
    EXPECT_EQ(c.n_params(), n.get<int64_t>());
  }
  LlamaConfig l = load_hf_config(kFix + "/hf_configs/llama31.json");
  EXPECT_EQ(l.model_type, "llama");
  EXPECT_EQ(l.n_head_kv, 2);
  EXPECT_EQ(l.head_dim, 4);
  EXPECT_EQ(l.rope_theta, 500000.0);
  EXPECT_EQ(l.rope_scaling.type, "llama3");
  EXPECT_EQ(l.rope_scaling.factor, 8.0);
  EXPECT_EQ(l.rope_scaling.original_max_position_embeddings, 64);
  EXPECT_EQ(l.bos_token_id, 1);
  EXPECT_EQ(l.eos_token_id, 2);
  EXPECT_EQ(l.name, kFix + "/hf_configs/llama31.json");

  LlamaConfig t = load_hf_config(kFix + "/hf_configs/llama_tied.json");
  EXPECT_EQ(t.head_dim, 8);  // explicit head_dim differs from hidden/heads = 4
  EXPECT_EQ(t.q_dim(), 32);
  EXPECT_TRUE(t.tie_word_embeddings);

  LlamaConfig q = load_hf_config(kFix + "/hf_configs/qwen2.json");
  EXPECT_TRUE(q.attention_bias);
  EXPECT_EQ(q.rms_norm_eps, 1e-6);
  EXPECT_EQ(q.rope_theta, 1e6);
  EXPECT_EQ(q.rope_scaling.type, "none");

  LlamaConfig m = load_hf_config(kFix + "/hf_configs/mistral.json");
  EXPECT_EQ(m.model_type, "mistral");
  EXPECT_EQ(m.n_head_kv, 1);
  EXPECT_EQ(m.sliding_window, 32);
  EXPECT_EQ(q.sliding_window, 0);  // use_sliding_window false
}

TEST(LlamaConfigHf, ShardedFixtureConfig) {
  LlamaConfig c = load_hf_config(kFix + "/sharded/config.json");
  EXPECT_EQ(c.torch_dtype, "bfloat16");  // transformers 5 spells it "dtype"
  json expected = read_json_file(kFix + "/sharded_expected.json");
  EXPECT_EQ(c.n_params(), expected["n_params"].get<int64_t>());
}

// The transformers 4.x layout (rope_theta + rope_scaling, torch_dtype, eos list), as in Llama-3.2-1B.
static const char* kLegacy = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 128256
})";

TEST(LlamaConfigHf, LegacyLayoutEqualsPreset) {
  LlamaConfig c = parse_hf_config(kLegacy, "Llama-3.2-1B/config.json");
  LlamaConfig p = preset_config("llama3.2-1b");
  EXPECT_EQ(c.n_params(), p.n_params());
  EXPECT_EQ(c.eos_token_id, 128001);  // first of the list
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(rope_inv_freq(c), rope_inv_freq(p));
  EXPECT_EQ(c.max_position_embeddings, p.max_position_embeddings);
  EXPECT_EQ(c.rms_norm_eps, p.rms_norm_eps);
}

TEST(LlamaConfigHf, DefaultsForOptionalKeys) {
  LlamaConfig c = parse_hf_config(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":12,
    "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":null,"rope_scaling":{"type":"linear","factor":2}})", "x");
  EXPECT_EQ(c.n_head_kv, 2);  // null -> same as heads
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.rope_scaling.type, "linear");  // old "type" spelling
  EXPECT_EQ(c.rope_scaling.factor, 2.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, -1);
}

static std::string with(const std::string& extra_or_replaced) {
  json j = json::parse(kLegacy);
  json patch = json::parse(extra_or_replaced);
  for (const auto& [k, v] : patch.items()) {
    if (v.is_string() && v.get<std::string>() == "<erase>") j.erase(k);
    else j[k] = v;
  }
  return j.dump(1);
}

// Gemma 3 1B's config.json as the Hub has it (transformers 4.50 layout: rope_theta,
// rope_local_base_freq, sliding_window_pattern, no layer_types).
static const char* kGemma3Hub = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
  "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
  "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
  "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null,
  "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 262144
})";

static std::string gemma3_with(const std::string& patch_text) {
  json j = json::parse(kGemma3Hub);
  const json patch = json::parse(patch_text);
  for (const auto& [k, v] : patch.items()) {
    if (v.is_string() && v.get<std::string>() == "<erase>") j.erase(k);
    else j[k] = v;
  }
  return j.dump(1);
}

TEST(LlamaConfigHf, Gemma3HubLayoutEqualsPreset) {
  const LlamaConfig c = parse_hf_config(kGemma3Hub, "gemma-3-1b-pt/config.json");
  const LlamaConfig p = preset_config("gemma-3-1b");
  EXPECT_EQ(c.n_params(), p.n_params());
  EXPECT_EQ(c.n_params(), 999885952);  // Gemma 3 1B: 1.0B, its embeddings tied
  EXPECT_TRUE(c.norm_unit_offset && c.sandwich_norms && c.scale_embeddings && c.qk_norm && c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_act, Activation::GeluTanh);
  EXPECT_FLOAT_EQ(c.attn_scale(), 1.0f / 16.0f);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_id, 1);
  // Every sixth layer is global (layers 5, 11, ...), the rest slide over 512 keys with base 1e4.
  for (int64_t l = 0; l < c.n_layer; l++) {
    EXPECT_EQ(c.window_of(l), (l + 1) % 6 == 0 ? 0 : 512) << l;
    EXPECT_EQ(c.local_rope(l), (l + 1) % 6 != 0) << l;
    EXPECT_EQ(p.window_of(l), c.window_of(l)) << l;
  }
  EXPECT_EQ(rope_inv_freq(c), rope_inv_freq(p));
  EXPECT_EQ(rope_local_inv_freq(c), rope_local_inv_freq(p));
  EXPECT_FLOAT_EQ(rope_inv_freq(c)[1], float(std::pow(1e6, -2.0 / 256)));
  EXPECT_FLOAT_EQ(rope_local_inv_freq(c)[1], float(std::pow(1e4, -2.0 / 256)));
  // 27B: query_pre_attn_scalar 168, not head_dim 128; linear RoPE scaling on the global layers only.
  const LlamaConfig b = preset_config("gemma-3-27b");
  EXPECT_FLOAT_EQ(b.attn_scale(), float(1.0 / std::sqrt(168.0)));
  EXPECT_FLOAT_EQ(rope_inv_freq(b)[1], float(std::pow(1e6, -2.0 / 128) / 8));
  EXPECT_FLOAT_EQ(rope_local_inv_freq(b)[1], float(std::pow(1e4, -2.0 / 128)));
}

TEST(LlamaConfigHf, Gemma3LayoutsAgree) {
  // transformers 5: layer_types and rope_parameters per layer type; a file may keep the thetas at
  // the top level beside them.
  const LlamaConfig v5 = parse_hf_config(
      gemma3_with(R"({"num_hidden_layers":3, "layer_types":["sliding_attention","full_attention","sliding_attention"],
                     "rope_theta":"<erase>", "rope_local_base_freq":"<erase>", "sliding_window_pattern":"<erase>",
                     "rope_parameters":{"full_attention":{"rope_type":"linear","factor":4.0,"rope_theta":500000.0},
                                        "sliding_attention":{"rope_type":"default","rope_theta":20000.0}}})"),
      "v5.json");
  EXPECT_EQ(v5.window_of(0), 512);
  EXPECT_EQ(v5.window_of(1), 0);
  EXPECT_TRUE(v5.local_rope(2));
  EXPECT_EQ(v5.rope_theta, 500000.0);
  EXPECT_EQ(v5.rope_scaling.type, "linear");
  EXPECT_EQ(v5.rope_local_theta, 20000.0);
  const LlamaConfig mixed = parse_hf_config(
      gemma3_with(R"({"rope_parameters":{"full_attention":{"rope_type":"linear","factor":8.0},
                                         "sliding_attention":{"rope_type":"default"}}})"),
      "mixed.json");
  EXPECT_EQ(mixed.rope_theta, 1e6);
  EXPECT_EQ(mixed.rope_local_theta, 1e4);
  EXPECT_EQ(mixed.rope_scaling.factor, 8.0);
  // The engine's own fixture, written by transformers 5.
  const LlamaConfig f = load_hf_config(std::string(QLORA_FIXTURES) + "/models/gemma3/config.json");
  EXPECT_EQ(f.model_type, "gemma3_text");
  EXPECT_EQ(f.query_pre_attn_scalar, 20.0);
  EXPECT_EQ(f.window_of(1), 0);
  EXPECT_EQ(f.window_of(2), 5);
}

// The layout of google/gemma-3-4b-it's config.json (Gemma3ForConditionalGeneration): the text model
// under text_config, which lists only what differs from Gemma3TextConfig's defaults; the token ids
// and the dtype at the top. The vision tower's config is cut to a few keys (the engine ignores it).
static const char* kGemma3Multimodal = R"({
  "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
  "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
  "model_type": "gemma3",
  "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                  "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                  "sliding_window": 1024},
  "torch_dtype": "bfloat16",
  "vision_config": {"hidden_size": 1152, "image_size": 896, "model_type": "siglip_vision_model",
                    "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false}})";

TEST(LlamaConfigHf, Gemma3MultimodalReadsItsTextModel) {
  const LlamaConfig c = parse_hf_config(kGemma3Multimodal, "gemma-3-4b-it/config.json");
  const LlamaConfig p = preset_config("gemma-3-4b");
  EXPECT_EQ(c.multimodal, "gemma3");
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_EQ(c.name, "gemma-3-4b-it/config.json");
  // Gemma3TextConfig's defaults fill what text_config leaves out.
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.n_head, 8);
  EXPECT_EQ(c.n_head_kv, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.n_params(), p.n_params());
  EXPECT_TRUE(c.tie_word_embeddings && c.qk_norm && c.sandwich_norms && c.norm_unit_offset);
  for (int64_t l = 0; l < c.n_layer; l++) EXPECT_EQ(c.window_of(l), p.window_of(l)) << l;
  EXPECT_EQ(rope_inv_freq(c), rope_inv_freq(p));
  EXPECT_EQ(rope_local_inv_freq(c), rope_local_inv_freq(p));
  // From the top of the file: the first eos id, the dtype.
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  // The engine's fixture, written by transformers 5 (Gemma3ForConditionalGeneration.save_pretrained).
  const LlamaConfig f = load_hf_config(std::string(QLORA_FIXTURES) + "/models/gemma3_mm/config.json");
  const LlamaConfig t = load_hf_config(std::string(QLORA_FIXTURES) + "/models/gemma3/config.json");
  EXPECT_EQ(f.multimodal, "gemma3");
  EXPECT_EQ(f.n_params(), t.n_params());
  EXPECT_TRUE(t.multimodal.empty());
  // A gemma3 file without its text model's config, or with another text model, is refused by key.
  Error e = config_error([] { parse_hf_config(R"({"model_type": "gemma3"})", "g.json"); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "g.json: key 'text_config'");
  e = config_error([] { parse_hf_config(R"({"model_type": "gemma3", "text_config": {"model_type": "llama"}})", "g.json"); },
                   ErrorKind::Unsupported);
  EXPECT_EQ(e.where(), "g.json: text_config: key 'model_type'");
}

// microsoft/phi-4's config.json.
static const char* kPhi4 = R"({
  "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 100257,
  "embd_pdrop": 0.0, "eos_token_id": 100265, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
  "intermediate_size": 17920, "max_position_embeddings": 16384, "model_type": "phi3", "num_attention_heads": 40,
  "num_hidden_layers": 40, "num_key_value_heads": 10, "original_max_position_embeddings": 16384,
  "pad_token_id": 100349, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 250000,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "vocab_size": 100352
})";

static std::string phi4_with(const std::string& patch_text) {
  json j = json::parse(kPhi4);
  const json patch = json::parse(patch_text);
  for (const auto& [k, v] : patch.items()) j[k] = v;
  return j.dump(1);
}

TEST(LlamaConfigHf, Phi4EqualsPresetAndFusesProjections) {
  const LlamaConfig c = parse_hf_config(kPhi4, "phi-4/config.json");
  const LlamaConfig p = preset_config("phi-4");
  EXPECT_EQ(c.n_params(), p.n_params());
  EXPECT_EQ(c.n_params(), 14659507200);  // Phi-4: 14.7B
  EXPECT_TRUE(c.fused_qkv && c.fused_gate_up && p.fused_qkv && p.fused_gate_up);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.window_of(0), 0);
  EXPECT_EQ(rope_inv_freq(c), rope_inv_freq(p));
  // all-linear is PEFT's four fused modules; q/k/v and gate/up become their fused module whole.
  const std::vector<std::string> mods = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"};
  EXPECT_EQ(lora_modules(c), mods);
  EXPECT_EQ(lora_targets_for(c, LoraSpec::resolve_targets({"all-linear"})), mods);
  EXPECT_EQ(lora_targets_for(c, LoraSpec::resolve_targets({"qkv_proj", "down_proj"})),
            (std::vector<std::string>{"qkv_proj", "down_proj"}));
  EXPECT_EQ(lora_targets_for(c, LoraSpec::resolve_targets({"v_proj", "q_proj", "k_proj"})),
            (std::vector<std::string>{"qkv_proj"}));
  Error e = config_error([&] { lora_targets_for(c, {"q_proj", "v_proj"}); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "target_modules");
  EXPECT_TRUE(contains(e.hint(), "qkv_proj")) << e.hint();
  e = config_error([&] { lora_targets_for(c, {"gate_proj"}); }, ErrorKind::Config);
  EXPECT_TRUE(contains(e.message(), "gate_up_proj")) << e.message();
  // A model without fusion has no fused modules.
  e = config_error([] { lora_targets_for(preset_config("llama3-8b"), {"qkv_proj"}); }, ErrorKind::Config);
  EXPECT_TRUE(contains(e.message(), "qkv_proj")) << e.message();
  // Phi-3-mini-4k: a sliding window of 2047 keys on every layer.
  EXPECT_EQ(parse_hf_config(phi4_with(R"({"sliding_window":2047})"), "p.json").window_of(39), 2047);
  EXPECT_EQ(preset_config("phi-3-mini-4k").window_of(0), 2047);
}

// google/gemma-2-9b's config.json (transformers 4.42 layout: no layer_types, no rope_parameters).
static const char* kGemma2 = R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
  "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
  "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "sliding_window_size": 4096,
  "torch_dtype": "float32", "use_cache": true, "vocab_size": 256000
})";

TEST(LlamaConfigHf, Gemma2EqualsPresetWithSoftCapping) {
  const LlamaConfig c = parse_hf_config(kGemma2, "gemma-2-9b/config.json");
  const LlamaConfig p = preset_config("gemma-2-9b");
  EXPECT_EQ(c.n_params(), p.n_params());
  EXPECT_EQ(c.n_params(), 9241705984);  // Gemma 2 9B: 9.24B, embeddings tied
  EXPECT_EQ(c.attn_logit_softcapping, 50.0);
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_EQ(p.attn_logit_softcapping, 50.0);
  EXPECT_EQ(p.final_logit_softcapping, 30.0);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.norm_unit_offset && c.sandwich_norms && c.scale_embeddings);
  EXPECT_EQ(c.rope_local_theta, 0.0);  // one RoPE for every layer
  for (int64_t l = 0; l < c.n_layer; l++) {  // even layers slide over 4096 keys, odd ones are global
    EXPECT_EQ(c.window_of(l), l % 2 == 0 ? 4096 : 0) << l;
    EXPECT_EQ(p.window_of(l), c.window_of(l)) << l;
  }
  EXPECT_EQ(rope_inv_freq(c), rope_inv_freq(p));
  // null turns soft-capping off; an absent key is Gemma2Config's default.
  json j = json::parse(kGemma2);
  j["attn_logit_softcapping"] = nullptr;
  j.erase("final_logit_softcapping");
  const LlamaConfig n = parse_hf_config(j.dump(), "g2.json");
  EXPECT_EQ(n.attn_logit_softcapping, 0.0);
  EXPECT_EQ(n.final_logit_softcapping, 30.0);
}

// Phi-4-mini's shape (microsoft/Phi-4-mini-instruct): rotary on 3/4 of each 128-dim head and
// LongRoPE from 4,096 to 131,072 positions, the two keys at the top level as its config.json has them.
static std::string phi4_mini(const std::string& extra = "{}") {
  json f = json::array();
  for (int i = 0; i < 48; i++) f.push_back(1.0 + 0.25 * i);
  json j = json::parse(phi4_with(R"({"hidden_size":3072,"intermediate_size":8192,"num_attention_heads":24,
      "num_key_value_heads":8,"num_hidden_layers":32,"vocab_size":200064,"max_position_embeddings":131072,
      "original_max_position_embeddings":4096,"partial_rotary_factor":0.75,"rope_theta":10000.0,
      "tie_word_embeddings":true})"));
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", f}, {"long_factor", f}};
  j["rope_scaling"]["long_factor"][0] = 3.5;
  const json patch = json::parse(extra);
  for (const auto& [k, v] : patch.items()) j[k] = v;
  return j.dump();
}

TEST(LlamaConfigHf, Phi4MiniLongRopeOnPartialRotaryResolvesAsTransformers) {
  const LlamaConfig c = parse_hf_config(phi4_mini(), "phi-4-mini/config.json");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_dim(), 96);  // int(128 * 0.75)
  EXPECT_EQ(c.rope_scaling.type, "longrope");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);  // no "factor": max / original
  // transformers: sqrt(1 + ln(factor) / ln(original)) = sqrt(1 + 5 ln 2 / 12 ln 2)
  EXPECT_NEAR(c.rope_scaling.attention_factor, std::sqrt(17.0 / 12.0), 1e-15);
  EXPECT_FLOAT_EQ(rope_attention_scale(c), float(std::sqrt(17.0 / 12.0)));
  const std::vector<float> s = rope_inv_freq(c), l = rope_inv_freq(c, true);
  ASSERT_EQ(s.size(), 48u);
  EXPECT_FLOAT_EQ(s[0], 1.0f);         // 1 / (1.0 * 10000^0)
  EXPECT_FLOAT_EQ(l[0], 1.0f / 3.5f);  // the long factor differs there only
  EXPECT_FLOAT_EQ(s[47], float(1.0 / (12.75 * std::pow(10000.0, 94.0 / 96.0))));
  EXPECT_EQ(s[47], l[47]);
  EXPECT_FALSE(rope_uses_long_factors(c, 4095));  // 4,096 positions: within the original
  EXPECT_TRUE(rope_uses_long_factors(c, 4096));
  const LlamaConfig p = preset_config("phi-4-mini");  // `qlora plan`'s shape of the same model
  EXPECT_EQ(p.n_params(), c.n_params());
  EXPECT_EQ(p.rope_dim(), 96);
  EXPECT_EQ(p.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(p.rope_scaling.attention_factor, c.rope_scaling.attention_factor);
  // attention_factor and factor from the file win; original_max_position_embeddings inside the
  // RoPE object serves when the top level has none.
  json j = json::parse(phi4_mini());
  j.erase("original_max_position_embeddings");
  j["rope_scaling"]["original_max_position_embeddings"] = 8192;
  j["rope_scaling"]["attention_factor"] = 1.5;
  const LlamaConfig d = parse_hf_config(j.dump(), "p.json");
  EXPECT_EQ(d.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(d.rope_scaling.factor, 16.0);
  EXPECT_DOUBLE_EQ(d.rope_scaling.attention_factor, 1.5);
}

TEST(LlamaConfigErrors, Phi3RefusesWhatItDoesNotImplement) {
  Error e = config_error([] { parse_hf_config(phi4_with(R"({"resid_pdrop":0.1})"), "p.json"); }, ErrorKind::Unsupported);
  EXPECT_EQ(e.where(), "p.json: key 'resid_pdrop'");
  // LongRoPE needs one factor per rotary frequency (48 for 96 rotary dims).
  json j = json::parse(phi4_mini());
  j["rope_scaling"]["short_factor"].erase(0);
  e = config_error([&] { parse_hf_config(j.dump(), "p.json"); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "p.json: key 'rope_scaling.short_factor'");
  EXPECT_TRUE(contains(e.message(), "47 entries")) << e.message();
  j = json::parse(phi4_mini());
  j["rope_scaling"]["long_factor"][3] = -1.0;
  e = config_error([&] { parse_hf_config(j.dump(), "p.json"); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "p.json: rope_scaling: key 'long_factor[3]'");
  // int(128 * 0.7) = 89 rotary dims: no pairs; int(128 * 0.005) = 0: none at all.
  for (const char* f : {R"({"partial_rotary_factor":0.7})", R"({"partial_rotary_factor":0.005})"}) {
    e = config_error([&] { parse_hf_config(phi4_mini(f), "p.json"); }, ErrorKind::Config);
    EXPECT_EQ(e.where(), "p.json: key 'partial_rotary_factor'") << f;
  }
  // Gemma's RoPE objects take neither LongRoPE nor YaRN.
  json g = json::parse(R"({"model_type":"gemma2","vocab_size":64,"hidden_size":32,"intermediate_size":64,
      "num_hidden_layers":2,"num_attention_heads":2,"head_dim":16,
      "rope_scaling":{"rope_type":"longrope","short_factor":[1],"long_factor":[1]}})");
  e = config_error([&] { parse_hf_config(g.dump(), "g.json"); }, ErrorKind::Unsupported);
  EXPECT_TRUE(contains(e.message(), "longrope")) << e.message();
  g["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  e = config_error([&] { parse_hf_config(g.dump(), "g.json"); }, ErrorKind::Unsupported);
  EXPECT_EQ(e.where(), "g.json: key 'rope_scaling.rope_type'");
}

TEST(LlamaConfigErrors, Gemma3RefusesWhatItDoesNotImplement) {
  // Soft-capping (Gemma 2's) is read on Gemma 3 files too, where released checkpoints have none.
  EXPECT_EQ(parse_hf_config(gemma3_with(R"({"final_logit_softcapping":30.0})"), "g.json").final_logit_softcapping, 30.0);
  Error e = config_error([] { parse_hf_config(gemma3_with(R"({"attn_logit_softcapping":-1.0})"), "g.json"); },
                         ErrorKind::Config);
  EXPECT_EQ(e.where(), "g.json: key 'attn_logit_softcapping'");
  e = config_error([] { parse_hf_config(gemma3_with(R"({"use_bidirectional_attention":true})"), "g.json"); },
                   ErrorKind::Unsupported);
  e = config_error([] { parse_hf_config(gemma3_with(R"({"hidden_activation":"gelu"})"), "g.json"); },
                   ErrorKind::Unsupported);
  EXPECT_EQ(e.where(), "g.json: key 'hidden_activation'");
  e = config_error([] { parse_hf_config(gemma3_with(R"({"rope_parameters":{"sliding_attention":{"rope_type":"linear","factor":2.0}}})"), "g.json"); },
                   ErrorKind::Unsupported);
  e = config_error([] { parse_hf_config(gemma3_with(R"({"num_hidden_layers":2,"layer_types":["full_attention"]})"), "g.json"); },
                   ErrorKind::Config);
  EXPECT_EQ(e.where(), "g.json: key 'layer_types'");
  // Llama keeps refusing GeGLU.
  e = config_error([] { parse_hf_config(with(R"({"hidden_act":"gelu_pytorch_tanh"})"), "l.json"); },
                   ErrorKind::Unsupported);
  EXPECT_EQ(e.where(), "l.json: key 'hidden_act'");
}

// ---------------------------------------------------------------------------------------------------
// Errors


TEST(LlamaConfigErrors, UnsupportedModelType) {
  Error e = config_error([] { parse_hf_config(with(R"({"model_type":"gpt_neox"})"), "cfg.json"); }, ErrorKind::Unsupported);
  EXPECT_EQ(e.where(), "cfg.json: key 'model_type'");
  EXPECT_TRUE(contains(e.message(), "gpt_neox"));
  EXPECT_TRUE(contains(e.hint(), "llama, mistral, qwen2")) << e.hint();
}

TEST(LlamaConfigErrors, MissingKey) {
  Error e = config_error([] { parse_hf_config(with(R"({"hidden_size":"<erase>"})"), "cfg.json"); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "cfg.json: key 'hidden_size'");
  config_error([] { parse_hf_config(with(R"({"model_type":"<erase>"})"), "cfg.json"); }, ErrorKind::Config);
}

TEST(LlamaConfigErrors, WrongType) {
  Error e = config_error([] { parse_hf_config(with(R"({"num_hidden_layers":"16"})"), "cfg.json"); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "cfg.json: key 'num_hidden_layers'");
  EXPECT_TRUE(contains(e.message(), "expected an integer")) << e.what();
  e = config_error([] { parse_hf_config(with(R"({"tie_word_embeddings":"yes"})"), "cfg.json"); }, ErrorKind::Config);
  EXPECT_TRUE(contains(e.message(), "boolean"));
  config_error([] { parse_hf_config(with(R"({"rope_scaling":4})"), "cfg.json"); }, ErrorKind::Config);
}

TEST(LlamaConfigErrors, UnsupportedRopeScaling) {
  for (const char* t : {"dynamic", "ntk"}) {
    SCOPED_TRACE(t);
    std::string patch = std::string(R"({"rope_scaling":{"rope_type":")") + t + R"(","factor":4.0}})";
    Error e = config_error([&] { parse_hf_config(with(patch), "cfg.json"); }, ErrorKind::Unsupported);
    EXPECT_TRUE(contains(e.where(), "rope_scaling"));
    EXPECT_TRUE(contains(e.message(), t));
    EXPECT_TRUE(contains(e.hint(), "linear, llama3"));
  }
  // longrope without its factors
  Error lr = config_error([] { parse_hf_config(with(R"({"rope_scaling":{"rope_type":"longrope","factor":4.0}})"), "cfg.json"); },
                          ErrorKind::Config);
  EXPECT_EQ(lr.where(), "cfg.json: rope_scaling: key 'short_factor'");
  // llama3 without its parameters
  Error e = config_error([] { parse_hf_config(with(R"({"rope_scaling":{"rope_type":"llama3","factor":8.0}})"), "cfg.json"); },
                         ErrorKind::Config);
  EXPECT_TRUE(contains(e.where(), "low_freq_factor")) << e.what();
}

TEST(LlamaConfigErrors, InconsistentShapes) {
  Error e = config_error([] { parse_hf_config(with(R"({"num_key_value_heads":5})"), "cfg.json"); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "cfg.json: key 'num_key_value_heads'");
  e = config_error([] { parse_hf_config(with(R"({"head_dim":"<erase>","num_attention_heads":30,"num_key_value_heads":6})"), "cfg.json"); },
                   ErrorKind::Config);
  EXPECT_EQ(e.where(), "cfg.json: key 'hidden_size'");  // 2048 % 30 != 0
  e = config_error([] { parse_hf_config(with(R"({"num_hidden_layers":0})"), "cfg.json"); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "cfg.json: key 'num_hidden_layers'");
  // A head wider than any model's (the fuzzer's 477777777775555554): refused before RoPE sizes by it.
  e = config_error([] { parse_hf_config(with(R"({"head_dim":477777777775555554})"), "cfg.json"); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "cfg.json: key 'head_dim'");
  EXPECT_NE(e.message().find("at most 4096"), std::string::npos) << e.message();
  config_error([] { parse_hf_config(with(R"({"hidden_act":"gelu"})"), "cfg.json"); }, ErrorKind::Unsupported);
  config_error([] { parse_hf_config(with(R"({"attention_bias":true})"), "cfg.json"); }, ErrorKind::Unsupported);
}

TEST(LlamaConfigErrors, FileProblems) {
  Error e = config_error([] { load_hf_config("/no/such/config.json"); }, ErrorKind::Io);
  EXPECT_EQ(e.where(), "/no/such/config.json");
  e = config_error([] { parse_hf_config("{\"model_type\": \"llama\",\n \"x\": }", "cfg.json"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), "cfg.json:2:7");
}

// ---------------------------------------------------------------------------------------------------
// RoPE inverse frequencies vs transformers' rotary embedding and an independent float64 evaluation.

TEST(LlamaConfigRope, MatchesTransformers) {
  json fx = read_json_file(kFix + "/rope_inv_freq.json");
  for (const auto& [name, c] : fx.items()) {
    SCOPED_TRACE(name);
    LlamaConfig cfg = parse_hf_config(c["config"].dump(), name);
    std::vector<float> got = rope_inv_freq(cfg);
    auto f64 = c["inv_freq_f64"].get<std::vector<double>>();
    auto hf = c["inv_freq_transformers_f32"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), f64.size());
    ASSERT_EQ(got.size(), size_t(cfg.head_dim / 2));
    for (size_t i = 0; i < got.size(); i++) {
      EXPECT_NEAR(got[i], f64[i], 1e-7 * f64[i]) << i;  // float rounding of the double result
      EXPECT_NEAR(got[i], hf[i], 2e-6 * hf[i]) << i;    // transformers evaluates in float32
    }
  }
}

TEST(LlamaConfigRope, Llama3ScalingHasAllThreeBands) {
  // For Llama 3.1 8B (head_dim 128) some frequencies are kept, some divided by 8, some blended; make sure
  // the test above covers all three branches.
  LlamaConfig c = preset_config("llama3.1-8b");
  LlamaConfig plain = c;
  plain.rope_scaling = RopeScaling{};
  std::vector<float> s = rope_inv_freq(c), p = rope_inv_freq(plain);
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == p[i]) kept++;
    else if (std::fabs(s[i] - p[i] / 8) <= 1e-6f * p[i]) divided++;
    else if (s[i] < p[i] && s[i] > p[i] / 8) blended++;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  EXPECT_EQ(kept + divided + blended, 64);
  EXPECT_EQ(p[0], 1.0f);
}

// Sliding-window attention is not implemented: a row longer than the window (training rows or the
// sample answers' KV cache) is refused when the model is planned, naming the key; rows within the
// window, where full causal attention is the same math, are planned.
TEST(LlamaConfigHf, SlidingWindowsPerLayer) {
  // Mistral's window applies to every layer, and rows longer than it are planned (the attention
  // ops mask keys outside it).
  LlamaConfig m = load_hf_config(kFix + "/hf_configs/mistral.json");
  m.sliding_window = 16;
  EXPECT_EQ(m.window_of(0), 16);
  EXPECT_EQ(m.window_of(m.n_layer - 1), 16);
  ModelPlanOptions o;
  o.seq_len = 48;
  o.kv_cache_tokens = 64;
  MemoryPlan plan;
  plan_model_buffers(plan, m, o);
  EXPECT_GT(plan.total_bytes(), 0);
  // Qwen: the layers layer_types marks, or from max_window_layers on.
  const LlamaConfig q = parse_hf_config(
      with(R"({"model_type":"qwen3","sliding_window":8,"use_sliding_window":true,"max_window_layers":1,"num_hidden_layers":3})"),
      "q.json");
  EXPECT_EQ(q.window_of(0), 0);
  EXPECT_EQ(q.window_of(1), 8);
  EXPECT_EQ(q.window_of(2), 8);
  const LlamaConfig lt = parse_hf_config(
      with(R"({"model_type":"qwen2","sliding_window":8,"num_hidden_layers":3,
               "layer_types":["sliding_attention","full_attention","sliding_attention"]})"),
      "q.json");
  EXPECT_EQ(lt.window_of(0), 8);
  EXPECT_EQ(lt.window_of(1), 0);
  EXPECT_EQ(lt.window_of(2), 8);
  Error e = config_error([] { parse_hf_config(with(R"({"model_type":"qwen3","sliding_window":8,"num_hidden_layers":2,
                                                        "layer_types":["full_attention","chunked_attention"]})"), "q.json"); },
                         ErrorKind::Unsupported);
  EXPECT_EQ(e.where(), "q.json: key 'layer_types[1]'");
  e = config_error([] { parse_hf_config(with(R"({"model_type":"qwen3","sliding_window":8,"num_hidden_layers":2,
                                                  "layer_types":["full_attention"]})"), "q.json"); },
                   ErrorKind::Config);
  EXPECT_TRUE(contains(e.message(), "1 entries for 2 layers")) << e.message();

  // Mistral with sliding_window null (v0.2 on), and Qwen2's window: only with use_sliding_window
  // and on layers from max_window_layers on.
  EXPECT_EQ(parse_hf_config(with(R"({"model_type":"mistral","sliding_window":null})"), "m.json").sliding_window, 0);
  EXPECT_EQ(parse_hf_config(with(R"({"model_type":"mistral","sliding_window":4096})"), "m.json").sliding_window, 4096);
  EXPECT_EQ(parse_hf_config(with(R"({"model_type":"qwen2","sliding_window":64,"use_sliding_window":true,"max_window_layers":4})"),
                            "q.json").sliding_window, 64);
  EXPECT_EQ(parse_hf_config(with(R"({"model_type":"qwen2","sliding_window":64,"use_sliding_window":true,"max_window_layers":16})"),
                            "q.json").sliding_window, 0);  // 16 layers, none from 16 on
  EXPECT_EQ(parse_hf_config(with(R"({"model_type":"qwen2","sliding_window":64,"use_sliding_window":false})"), "q.json").sliding_window, 0);
  // max_window_layers defaults to 28 (Qwen2Config, Qwen3Config): 16 layers, none sliding.
  EXPECT_EQ(parse_hf_config(with(R"({"model_type":"qwen3","sliding_window":64,"use_sliding_window":true})"), "q.json").sliding_window, 0);
  // transformers 5 writes the per-layer choice as layer_types.
  EXPECT_EQ(parse_hf_config(with(R"({"model_type":"qwen3","sliding_window":64,"num_hidden_layers":2,"layer_types":["full_attention","sliding_attention"]})"),
                            "q.json").sliding_window, 64);
  EXPECT_EQ(parse_hf_config(with(R"({"model_type":"qwen3","sliding_window":null,"num_hidden_layers":1,"layer_types":["full_attention"]})"),
                            "q.json").sliding_window, 0);
}

TEST(LlamaConfigHf, Qwen3HasQkNormsAndItsOwnDefaults) {
  LlamaConfig q = load_hf_config(std::string(QLORA_FIXTURES) + "/models/qwen3/config.json");
  EXPECT_EQ(q.model_type, "qwen3");
  EXPECT_TRUE(q.qk_norm);
  EXPECT_FALSE(q.attention_bias);
  EXPECT_EQ(q.head_dim, 24);
  EXPECT_EQ(q.q_dim(), 96);
  EXPECT_EQ(q.sliding_window, 0);
  // Without head_dim Qwen3Config's default is 128, not hidden_size / heads.
  EXPECT_EQ(parse_hf_config(with(R"({"model_type":"qwen3","head_dim":"<erase>"})"), "q.json").head_dim, 128);
  EXPECT_EQ(parse_hf_config(with(R"({"model_type":"qwen2","head_dim":"<erase>"})"), "q.json").head_dim,
            parse_hf_config(with(R"({"model_type":"qwen2"})"), "q.json").hidden_size /
                parse_hf_config(with(R"({"model_type":"qwen2"})"), "q.json").n_head);
  EXPECT_FALSE(parse_hf_config(with(R"({"model_type":"qwen2"})"), "q.json").qk_norm);
  // Qwen3's attention_bias puts biases on q, k, v and o: refused, naming the key.
  Error e = config_error([] { parse_hf_config(with(R"({"model_type":"qwen3","attention_bias":true})"), "q.json"); },
                         ErrorKind::Unsupported);
  EXPECT_EQ(e.where(), "q.json: key 'attention_bias'");
  // The config written for a merged model reads back as the same model.
  const json back = hf_config_json(q, "float32");
  EXPECT_EQ(back["architectures"][0], "Qwen3ForCausalLM");
  const LlamaConfig r = parse_hf_config(back.dump(), "back.json");
  EXPECT_TRUE(r.qk_norm);
  EXPECT_EQ(r.head_dim, q.head_dim);
  EXPECT_EQ(r.n_params(), q.n_params());
}
