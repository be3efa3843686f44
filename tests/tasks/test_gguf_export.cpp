// `qlora export` (tasks/gguf_export.h): the merged GGUF holds exactly MergedModel's weights (Q/K
// permuted as the converter does, quantized as the writer's Q8_0), the LoRA GGUF holds the adapter
// in llama.cpp's layout, bad requests fail clearly leaving nothing behind, and llama.cpp itself
// agrees: tests/fixtures/export/llama_cpp_logits.json (tools/make_gguf_export_fixtures.py) holds
// llama.cpp's logits on files whose sha256 our export must reproduce, and our engine's logits on
// those files must match them.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "io/safetensors.h"
#include "model/experts.h"
#include "model/gguf_model.h"
#include "model/decoder_model.h"
#include "model/merge.h"
#include "model/peft_io.h"
#include "tasks/gguf_export.h"
#include "train/model_source.h"
#include "real_models.h"
#include "sha256_util.h"
#include "config_expect.h"
#include "model_test_util.h"

namespace qlora {
namespace {

namespace fs = std::filesystem;
using testing_util::sha256_file;
using testing_util::source_logits;
using nlohmann::json;

const std::string kFx = QLORA_FIXTURES;
const std::string kTiny = kFx + "/gguf/tiny_llama.gguf";
const std::string kTinyAdapter = kFx + "/parity/llama_gqa_adapter";

struct TmpDir {
  std::string path;
  TmpDir() {
    std::string t = (fs::temp_directory_path() / "qlora-export-test-XXXXXX").string();
    path = mkdtemp(t.data()) ? t : "";
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

GgufExportResult run_export(const std::string& fmt, const std::string& model, const std::string& adapter,
                            const std::string& outtype, const std::string& out) {
  GgufExportOptions o;
  o.format = fmt;
  o.model = model;
  o.adapter = adapter;
  o.outtype = outtype;
  o.out = out;
  return export_gguf(o);
}

TEST(Sha256, KnownDigests) {
  TmpDir d;
  const std::string p = d.path + "/abc";
  std::ofstream(p) << "abc";
  EXPECT_EQ(sha256_file(p), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::ofstream(p, std::ios::trunc) << std::string(1000, 'a');
  EXPECT_EQ(sha256_file(p), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

// f32 export: every tensor is MergedModel's, bit for bit, after our own un-permute on read.
TEST(GgufExport, MergedF32HoldsTheMergedWeights) {
  TmpDir d;
  const std::string out = d.path + "/m.gguf";
  const auto r = run_export("gguf", kTiny, kTinyAdapter, "f32", out);
  EXPECT_EQ(r.bytes, fs::file_size(out));
  ModelSource base = open_model_source(kTiny);
  MergedModel m(base.config, base.tensors, open_peft_adapter(kTinyAdapter, base.config));
  ModelSource ex = open_model_source(out);
  GgufFile g(out);
  GgufFile b(kTiny);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_u32("general.file_type"), 0u);
  EXPECT_EQ(g.get_u32("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(g.get_array_strings("tokenizer.ggml.tokens"), b.get_array_strings("tokenizer.ggml.tokens"));
  EXPECT_EQ(g.read_tensor_f32("rope_freqs.weight"), b.read_tensor_f32("rope_freqs.weight"));
  EXPECT_EQ(ex.config.rope_scaling.type, "llama3");
  EXPECT_EQ(ex.config.n_head_kv, base.config.n_head_kv);
  int differ_from_base = 0;
  for (const auto& n : m.names()) {
    SCOPED_TRACE(n);
    std::vector<float> got(m.read(n).size());
    ex.tensors.read_f32(n, m.shape(n), got.data());
    EXPECT_EQ(got, m.read(n));
    std::vector<float> orig(got.size());
    base.tensors.read_f32(n, m.shape(n), orig.data());
    differ_from_base += got != orig;
  }
  EXPECT_EQ(differ_from_base, 7 * 2);  // the 7 adapted projections of both layers
  // The Q rows in the file are the converter's order: row 1 of head 0 is HF row head_dim/2.
  const auto q = m.read("model.layers.0.self_attn.q_proj.weight");
  const auto& t = g.tensor("blk.0.attn_q.weight");
  std::vector<float> raw(size_t(t.n_elements()));
  std::memcpy(raw.data(), g.tensor_data("blk.0.attn_q.weight"), raw.size() * 4);
  const int64_t C = base.config.hidden_size, hd = base.config.head_dim;
  EXPECT_EQ(std::vector<float>(raw.begin() + C, raw.begin() + 2 * C),
            std::vector<float>(q.begin() + hd / 2 * C, q.begin() + (hd / 2 + 1) * C));
}

TEST(GgufExport, QuantizedTypesFollowTheConverter) {
  TmpDir d;
  for (const std::string ot : {"q8_0", "q4_0", "f16", "bf16"}) {
    SCOPED_TRACE(ot);
    const std::string out = d.path + "/" + ot + ".gguf";
    run_export("gguf", kTiny, kTinyAdapter, ot, out);
    GgufFile g(out);
    const GgmlType want = ot == "q8_0" ? GgmlType::Q8_0 : ot == "q4_0" ? GgmlType::Q4_0 : ot == "f16" ? GgmlType::F16 : GgmlType::BF16;
    EXPECT_EQ(g.tensor("blk.1.ffn_down.weight").type, want);
    EXPECT_EQ(g.tensor("token_embd.weight").type, want);
    EXPECT_EQ(g.tensor("output.weight").type, ot == "q4_0" ? GgmlType::Q8_0 : want);
    EXPECT_EQ(g.tensor("blk.0.attn_norm.weight").type, GgmlType::F32);
    EXPECT_EQ(g.tensor("rope_freqs.weight").type, GgmlType::F32);
    // Values: the merged f32 weight (permuted) through the writer's encoder.
    ModelSource base = open_model_source(kTiny);
    MergedModel m(base.config, base.tensors, open_peft_adapter(kTinyAdapter, base.config));
    const auto k = m.read("model.layers.1.self_attn.k_proj.weight");
    std::vector<float> perm(k.size());
    gguf_permute_qk_rows(k.data(), perm.data(), base.config.n_head_kv, base.config.kv_dim(), base.config.hidden_size);
    const auto& ti = g.tensor("blk.1.attn_k.weight");
    std::vector<uint8_t> enc(ti.n_bytes);
    const int64_t row = ti.ne[0], rb = ggml_row_bytes(ti.type, row);
    for (int64_t r = 0; r < ti.ne[1]; r++) quantize_row(ti.type, perm.data() + r * row, enc.data() + r * rb, row);
    EXPECT_EQ(0, std::memcmp(enc.data(), g.tensor_data("blk.1.attn_k.weight"), enc.size()));
  }
}

// A mixture-of-experts model (Mixtral: llama architecture, Q/K permuted; Qwen3-MoE: qwen3moe): the
// router as ffn_gate_inp kept f32 in every outtype, each expert weight kind stacked over the experts
// as llama.cpp's 3-D ffn_*_exps (ne [in, out, n_experts]) with expert e's weight at slice e, and the
// expert keys.
TEST(GgufExport, MixtureOfExpertsStacksTheExpertsAsLlamaCppReadsThem) {
  TmpDir d;
  for (const std::string variant : {"mixtral", "qwen3_moe_norm"}) {
    SCOPED_TRACE(variant);
    const std::string model = kFx + "/models/" + variant, adapter = kFx + "/parity/" + variant + "_adapter";
    ModelSource base = open_model_source(model);
    const LlamaConfig& c = base.config;
    MergedModel m(c, base.tensors, open_peft_adapter(adapter, c));
    for (const std::string ot : {"f32", "q8_0"}) {
      const std::string out = d.path + "/" + variant + "." + ot + ".gguf";
      run_export("gguf", model, adapter, ot, out);
      GgufFile g(out);
      const std::string a = variant == "mixtral" ? "llama" : "qwen3moe";
      EXPECT_EQ(g.get_string("general.architecture"), a);
      EXPECT_EQ(g.get_u32(a + ".expert_count"), uint32_t(c.n_experts));
      EXPECT_EQ(g.get_u32(a + ".expert_used_count"), uint32_t(c.experts_per_tok));
      EXPECT_EQ(g.has(a + ".expert_feed_forward_length"), a == "qwen3moe");
      if (a == "qwen3moe") {
        EXPECT_EQ(g.get_u32(a + ".expert_feed_forward_length"), uint32_t(c.expert_intermediate_size));
      }
      // Three stacks and a router in place of each layer's 3 * n_experts expert tensors.
      EXPECT_EQ(g.tensors().size(), m.names().size() - size_t(c.n_layer * (3 * c.n_experts - 3)));
      EXPECT_FALSE(g.has_tensor("blk.0.ffn_gate.weight"));
      const auto& r = g.tensor("blk.1.ffn_gate_inp.weight");
      EXPECT_EQ(r.type, GgmlType::F32);
      EXPECT_EQ(r.ne, (std::vector<int64_t>{c.hidden_size, c.n_experts}));
      EXPECT_EQ(g.read_tensor_f32("blk.1.ffn_gate_inp.weight"), m.read(hf_router_name(c, 1)));
      const auto& down = g.tensor("blk.1.ffn_down_exps.weight");
      EXPECT_EQ(down.ne, (std::vector<int64_t>{c.expert_intermediate_size, c.hidden_size, c.n_experts}));
      // q8_0: rows of 24 values (qwen3_moe_norm's expert width) are not Q8_0 blocks: F16, as the converter.
      EXPECT_EQ(down.type, ot == "f32" ? GgmlType::F32 : down.ne[0] % 32 == 0 ? GgmlType::Q8_0 : GgmlType::F16);
      EXPECT_EQ(g.tensor("blk.0.ffn_up_exps.weight").ne,
                (std::vector<int64_t>{c.hidden_size, c.expert_intermediate_size, c.n_experts}));
      if (ot != "f32") continue;
      for (const std::string kind : {"gate_proj", "up_proj", "down_proj"}) {
        const std::string g_name = std::string("blk.0.ffn_") + kind.substr(0, kind.find('_')) + "_exps.weight";
        const std::vector<float> stack = g.read_tensor_f32(g_name);
        const int64_t n = int64_t(stack.size()) / c.n_experts;
        for (int64_t e : {int64_t(0), c.n_experts / 2, c.n_experts - 1})
          EXPECT_EQ(std::vector<float>(stack.begin() + e * n, stack.begin() + (e + 1) * n),
                    m.read(hf_expert_name(c, 0, e, kind)))
              << g_name << " expert " << e;
      }
      // The adapted attention is written merged (and Mixtral's Q rows permuted as for Llama).
      const auto v = m.read("model.layers.1.self_attn.v_proj.weight");
      EXPECT_EQ(g.read_tensor_f32("blk.1.attn_v.weight"), v);
      // Read back as a model source: the same experts and router (each expert a slice of its stack)
      // and the same routing, so the file trains as the merged checkpoint.
      const ModelSource back = open_model_source(out);
      const LlamaConfig& b = back.config;
      testing_util::expect_same_math(b, c);
      for (int64_t l = 0; l < c.n_layer; l++) {
        const auto [rr, rc] = *hf_moe_tensor_shape(c, hf_router_name(c, l));
        std::vector<float> router(size_t(rr * rc));
        back.tensors.read_f32(hf_router_name(b, l), {rr, rc}, router.data());
        EXPECT_EQ(router, m.read(hf_router_name(c, l))) << "layer " << l;
        for (const std::string kind : {"gate_proj", "up_proj", "down_proj"})
          for (int64_t e : {int64_t(0), c.n_experts - 1}) {
            const auto [rows, cols] = expert_shape(c, kind);
            std::vector<float> w(size_t(rows * cols));
            back.tensors.read_f32(hf_expert_name(b, l, e, kind), {rows, cols}, w.data());
            EXPECT_EQ(w, m.read(hf_expert_name(c, l, e, kind))) << kind << " expert " << e << " layer " << l;
          }
      }
    }
  }
}

TEST(GgufExport, LoraGgufHoldsTheAdapterInLlamaCppLayout) {
  TmpDir d;
  const std::string out = d.path + "/lora.gguf";
  run_export("gguf-lora", kTiny, kTinyAdapter, "", out);
  GgufFile g(out);
  const ModelSource base = open_model_source(kTiny);
  const PeftAdapter ad = open_peft_adapter(kTinyAdapter, base.config);
  EXPECT_EQ(g.get_string("general.type"), "adapter");
  EXPECT_EQ(g.get_string("adapter.type"), "lora");
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  const int64_t r = ad.spec.r;
  EXPECT_FLOAT_EQ(g.get_f32("adapter.lora.alpha") / float(r), ad.spec.scale());  // llama.cpp: alpha / rank
  EXPECT_EQ(g.tensors().size(), size_t(2 * 7 * base.config.n_layer));
  const auto& c = base.config;
  const auto a = ad.weights->read_f32(peft_module_name(c, 1, "k_proj") + ".lora_A.weight", {r, c.hidden_size});
  const auto b = ad.weights->read_f32(peft_module_name(c, 1, "k_proj") + ".lora_B.weight", {c.kv_dim(), r});
  EXPECT_EQ(g.tensor("blk.1.attn_k.weight.lora_a").ne, (std::vector<int64_t>{c.hidden_size, r}));
  EXPECT_EQ(g.tensor("blk.1.attn_k.weight.lora_b").ne, (std::vector<int64_t>{r, c.kv_dim()}));
  EXPECT_EQ(g.tensor("blk.1.attn_k.weight.lora_a").type, GgmlType::F32);
  EXPECT_EQ(g.read_tensor_f32("blk.1.attn_k.weight.lora_a"), a);
  std::vector<float> unperm(b.size());
  gguf_unpermute_qk_rows(g.read_tensor_f32("blk.1.attn_k.weight.lora_b").data(), unperm.data(), c.n_head_kv, c.kv_dim(), r);
  EXPECT_EQ(unperm, b);
  const auto bv = ad.weights->read_f32(peft_module_name(c, 0, "v_proj") + ".lora_B.weight", {c.kv_dim(), r});
  EXPECT_EQ(g.read_tensor_f32("blk.0.attn_v.weight.lora_b"), bv);  // v is not permuted
  // q8_0: lora_b rows hold r = 4 values, not a Q8_0 block: F16 as convert_lora_to_gguf.py falls back.
  const auto r8 = run_export("gguf-lora", kTiny, kTinyAdapter, "q8_0", d.path + "/l8.gguf");
  GgufFile g8(d.path + "/l8.gguf");
  EXPECT_EQ(g8.tensor("blk.0.attn_q.weight.lora_a").type, GgmlType::Q8_0);
  EXPECT_EQ(g8.tensor("blk.0.attn_q.weight.lora_b").type, GgmlType::F16);
  EXPECT_FALSE(r8.notes.empty());
}

void expect_error(const std::function<void()>& f, ErrorKind kind, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << "'" << w << "' not in: " << e.what();
  }
}

TEST(GgufExport, ClearErrorsAndNothingLeftBehind) {
  TmpDir d;
  const std::string out = d.path + "/x.gguf";
  expect_error([&] { run_export("gguf", kTiny, "", "q5_k", out); }, ErrorKind::Config, {"q5_k", "f32, f16, bf16, q8_0, q4_0"});
  expect_error([&] { run_export("gguf-lora", kTiny, kTinyAdapter, "q4_0", out); }, ErrorKind::Config, {"f32, f16, bf16, q8_0"});
  expect_error([&] { run_export("ggml", kTiny, "", "", out); }, ErrorKind::Config, {"gguf, gguf-lora"});
  expect_error([&] { run_export("gguf-lora", kFx + "/models/llama_gqa", kTinyAdapter, "", out); }, ErrorKind::Config,
               {"needs a GGUF base", "--format gguf"});
  expect_error([&] { run_export("gguf-lora", kTiny, "", "", out); }, ErrorKind::Config, {"--adapter"});
  expect_error([&] { run_export("gguf", kFx + "/models/llama_gqa", "", "", out); }, ErrorKind::Config, {"tokenizer.json"});
  // An adapter trained on another shape (mistral's: one kv head) against the llama base: names the tensor.
  expect_error([&] { run_export("gguf", kTiny, kFx + "/parity/mistral_adapter", "f32", out); }, ErrorKind::Shape, {"lora_"});
  expect_error([&] { run_export("gguf", kTiny, d.path + "/nope", "f32", out); }, ErrorKind::Io, {"adapter directory"});
  expect_error([&] { run_export("gguf", kTiny, "", "f32", d.path + "/no/such/dir/x.gguf"); }, ErrorKind::Io, {"does not exist"});
  // Families without a GGUF layout here, or what llama.cpp would compute differently: refused,
  // pointing at qlora merge (the parity fixture's query_pre_attn_scalar 20 is not its head_dim 24).
  expect_error([&] { run_export("gguf", kFx + "/models/gemma3", "", "f32", out); }, ErrorKind::Unsupported,
               {"gemma3_text", "query_pre_attn_scalar", "qlora merge"});
  expect_error([&] { run_export("gguf", kFx + "/models/gemma3_mm", "", "f32", out); }, ErrorKind::Unsupported,
               {"gemma3_text", "query_pre_attn_scalar"});
  // The parity fixture's SwiGLU limit 1 (llama.cpp's gpt-oss fixes 7), and YaRN with an
  // attention_factor of its own (llama.cpp's is 0.1 ln(factor) + 1).
  expect_error([&] { run_export("gguf", kFx + "/models/gpt_oss", "", "f32", out); }, ErrorKind::Unsupported,
               {"swiglu_limit", "limit 7", "qlora merge"});
  {
    const std::string y = d.path + "/yarn_scaled";
    fs::create_directories(y);
    for (const char* f : {"model.safetensors", "tokenizer.json"}) fs::copy_file(kFx + "/models/qwen3_yarn/" + f, y + "/" + f);
    json cfg = json::parse(std::ifstream(kFx + "/models/qwen3_yarn/config.json"));
    cfg["rope_scaling"]["attention_factor"] = 1.5;
    std::ofstream(y + "/config.json") << cfg.dump();
    expect_error([&] { run_export("gguf", y, "", "f32", out); }, ErrorKind::Unsupported, {"attention_factor", "qlora merge"});
    fs::remove_all(y);
  }
  // llama.cpp always renormalises the chosen experts' weights; Qwen3-MoE without norm_topk_prob would differ.
  expect_error([&] { run_export("gguf", kFx + "/models/qwen3_moe", "", "f32", out); }, ErrorKind::Unsupported,
               {"norm_topk_prob", "qwen3moe"});
  EXPECT_TRUE(fs::is_empty(d.path));
}

// gpt-oss in llama.cpp's gpt-oss layout (tests/fixtures/export/gpt_oss, written by
// tools/make_gguf_export_fixtures.py): the interleaved gate_up_proj split into ffn_gate_exps and
// ffn_up_exps, down_proj transposed per expert into ffn_down_exps, their biases as the stacks'
// .bias, the router and the sinks in f32, the window and YaRN as keys. Read back, every fused tensor
// is the merged model's bit for bit, and the config is the model's with YaRN truncated (llama.cpp's).
TEST(GgufExport, GptOssIsWrittenInLlamaCppsLayout) {
  TmpDir d;
  const std::string model = kFx + "/export/gpt_oss", adapter = kFx + "/parity/gpt_oss_adapter", out = d.path + "/g.gguf";
  ModelSource base = open_model_source(model);
  const LlamaConfig& c = base.config;
  MergedModel m(c, base.tensors, open_peft_adapter(adapter, c));
  const GgufExportResult r = run_export("gguf", model, adapter, "f32", out);
  GgufFile g(out);
  const std::string a = "gpt-oss";
  EXPECT_EQ(g.get_string("general.architecture"), a);
  EXPECT_EQ(g.get_u32(a + ".expert_count"), uint32_t(c.n_experts));
  EXPECT_EQ(g.get_u32(a + ".expert_used_count"), uint32_t(c.experts_per_tok));
  EXPECT_EQ(g.get_u32(a + ".expert_feed_forward_length"), uint32_t(c.expert_intermediate_size));
  EXPECT_EQ(g.get_u32(a + ".attention.sliding_window"), uint32_t(c.sliding_window));
  EXPECT_EQ(g.get_u32(a + ".attention.key_length"), uint32_t(c.head_dim));
  EXPECT_EQ(g.get_string(a + ".rope.scaling.type"), "yarn");
  EXPECT_EQ(g.get_f32(a + ".rope.scaling.factor"), float(c.rope_scaling.factor));
  EXPECT_EQ(g.get_u32(a + ".rope.scaling.original_context_length"), uint32_t(c.rope_scaling.original_max_position_embeddings));
  EXPECT_EQ(g.get_f32(a + ".rope.scaling.yarn_beta_fast"), float(c.rope_scaling.beta_fast));
  EXPECT_TRUE(std::any_of(r.notes.begin(), r.notes.end(), [](const std::string& n) { return n.find("truncate false") != std::string::npos; }));
  const int64_t E = c.n_experts, F = c.expert_intermediate_size, C = c.hidden_size;
  EXPECT_EQ(g.tensor("blk.1.ffn_gate_exps.weight").ne, (std::vector<int64_t>{C, F, E}));
  EXPECT_EQ(g.tensor("blk.1.ffn_up_exps.bias").ne, (std::vector<int64_t>{F, E}));
  EXPECT_EQ(g.tensor("blk.1.ffn_down_exps.weight").ne, (std::vector<int64_t>{F, C, E}));
  EXPECT_EQ(g.tensor("blk.1.ffn_down_exps.bias").ne, (std::vector<int64_t>{C, E}));
  EXPECT_EQ(g.tensor("blk.1.attn_sinks.weight").ne, (std::vector<int64_t>{c.n_head}));
  EXPECT_EQ(g.tensor("blk.1.ffn_gate_inp.weight").type, GgmlType::F32);
  EXPECT_TRUE(g.has_tensor("blk.1.post_attention_norm.weight"));
  EXPECT_TRUE(g.has_tensor("blk.1.ffn_gate_inp.bias"));
  EXPECT_TRUE(g.has_tensor("blk.1.attn_output.bias"));
  EXPECT_FALSE(g.has_tensor("blk.1.ffn_norm.weight"));
  // Expert 3's gate row 5 is the fused stack's output 10 (gate and up interleave), up's row 5 output 11.
  const std::vector<float> fused = m.read("model.layers.1.mlp.experts.gate_up_proj");  // (E, C, 2F)
  const std::vector<float> gate = g.read_tensor_f32("blk.1.ffn_gate_exps.weight"), up = g.read_tensor_f32("blk.1.ffn_up_exps.weight");
  for (int64_t i = 0; i < C; i++) {
    EXPECT_EQ(gate[size_t((3 * F + 5) * C + i)], fused[size_t((3 * C + i) * 2 * F + 10)]);
    EXPECT_EQ(up[size_t((3 * F + 5) * C + i)], fused[size_t((3 * C + i) * 2 * F + 11)]);
  }
  // Read back by the engine: each fused tensor is the merged one, bit for bit.
  const LlamaConfig gc = gguf_llama_config(g);
  for (const std::string t : {"mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj",
                              "mlp.experts.down_proj_bias", "mlp.router.weight", "mlp.router.bias", "self_attn.sinks",
                              "self_attn.o_proj.bias", "post_attention_layernorm.weight", "self_attn.q_proj.weight"}) {
    const std::string hf = "model.layers.2." + t;
    SCOPED_TRACE(hf);
    ASSERT_TRUE(gguf_has_hf_tensor(g, gc, hf));
    EXPECT_EQ(gguf_hf_shape(g, gc, hf), llama_hf_tensor_shape(c, hf));
    std::vector<float> back(m.read(hf).size());
    gguf_read_hf_tensor(g, gc, hf, back.data());
    EXPECT_EQ(back, m.read(hf));
  }
  LlamaConfig want = c;
  want.rope_scaling.truncate = true;  // llama.cpp's YaRN
  want.router_aux_loss_coef = 0;      // a GGUF holds no auxiliary-loss setting
  want.experts_stored = "";           // the experts come back as floats
  testing_util::expect_same_math(gc, want);
  EXPECT_EQ(gc.sliding_layers, c.sliding_layers);
  EXPECT_TRUE(gc.attention_sinks && gc.moe_biases && gc.o_proj_bias);
  EXPECT_EQ(gc.swiglu_clamp.alpha, c.swiglu_clamp.alpha);
  EXPECT_EQ(gc.swiglu_clamp.limit, c.swiglu_clamp.limit);
  EXPECT_EQ(gc.rope_scaling.attention_factor, c.rope_scaling.attention_factor);

  // With the experts left alone (LoRA on the attention only) they are written in MXFP4 as the
  // checkpoint holds them, and read back as the same blocks: held as shipped, byte for byte.
  const std::string mx = d.path + "/mx.gguf";
  const GgufExportResult rm = run_export("gguf", model, kFx + "/export/gpt_oss_attn_adapter", "f32", mx);
  EXPECT_TRUE(std::any_of(rm.notes.begin(), rm.notes.end(), [](const std::string& n) { return n.find("MXFP4") != std::string::npos; }));
  GgufFile gm(mx);
  for (const char* k : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) EXPECT_EQ(gm.tensor("blk.2." + std::string(k) + ".weight").type, GgmlType::MXFP4) << k;
  EXPECT_EQ(gm.tensor("blk.2.attn_q.weight").type, GgmlType::F32);
  const LlamaConfig mc = gguf_llama_config(gm);
  EXPECT_EQ(mc.experts_stored, "mxfp4");
  ModelSource ms = open_model_source(mx);
  ASSERT_TRUE(ms.tensors.stored_expert_quant.has_value());
  for (const auto& [t, rows, cols] : {std::tuple<std::string, int64_t, int64_t>{"gate_up_proj", E * 2 * F, C}, {"down_proj", E * C, F}}) {
    SCOPED_TRACE(t);
    const std::string hf = "model.layers.2.mlp.experts." + t;
    QuantizedTensor want, got;
    ASSERT_TRUE(base.tensors.read_quantized(hf, rows, cols, want));
    ASSERT_TRUE(ms.tensors.read_quantized(hf, rows, cols, got));
    EXPECT_EQ(got.data, want.data);
    EXPECT_EQ(got.scales, want.scales);
    EXPECT_EQ(got.params.format, QuantFormat::MXFP4);
  }
  // GGUF to GGUF: the MXFP4 base exported again (no adapter) holds every tensor byte for byte.
  const std::string again = d.path + "/again.gguf";
  run_export("gguf", mx, "", "f32", again);
  GgufFile ga(again);
  ASSERT_EQ(ga.tensors().size(), gm.tensors().size());
  for (const GgufTensorInfo& t : gm.tensors()) {
    SCOPED_TRACE(t.name);
    const GgufTensorInfo& u = ga.tensor(t.name);
    ASSERT_EQ(u.type, t.type);
    ASSERT_EQ(u.n_bytes, t.n_bytes);
    EXPECT_EQ(std::memcmp(ga.tensor_data(t.name), gm.tensor_data(t.name), size_t(t.n_bytes)), 0);
  }
}

// Gemma 2 and 3 in llama.cpp's gemma2/gemma3 layout (tests/fixtures/export/gemma*, written by
// tools/make_gguf_export_fixtures.py): the four norms per layer under llama.cpp's names, each stored
// as 1 + w; the tied head not written; the SentencePiece-style vocabulary as llama.cpp's "llama"
// vocabulary (byte pieces BYTE, <unk> UNKNOWN, the specials CONTROL, a score per piece: minus the
// rank of the first merge making it); the caps and the window as keys.
TEST(GgufExport, GemmaIsWrittenInLlamaCppsLayout) {
  TmpDir d;
  for (const std::string kind : {"gemma2", "gemma3"}) {
    SCOPED_TRACE(kind);
    const std::string dir = kFx + "/export/" + kind, out = d.path + "/" + kind + ".gguf";
    run_export("gguf", dir, "", "f32", out);
    GgufFile g(out);
    EXPECT_EQ(g.get_string("general.architecture"), kind);
    EXPECT_EQ(g.get_u32(kind + ".attention.sliding_window"), 4u);
    EXPECT_EQ(g.get_u32(kind + ".attention.key_length"), 16u);
    EXPECT_FALSE(g.has_tensor("output.weight"));
    SafetensorsArchive st(dir + "/model.safetensors");
    const std::vector<std::pair<std::string, std::string>> norms = {
        {"blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"},
        {"blk.1.post_attention_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
        {"blk.1.ffn_norm.weight", "model.layers.1.pre_feedforward_layernorm.weight"},
        {"blk.1.post_ffw_norm.weight", "model.layers.1.post_feedforward_layernorm.weight"},
        {"output_norm.weight", "model.norm.weight"}};
    for (const auto& [gn, hn] : norms) {
      const std::vector<float> w = st.read_f32(hn, {32}), got = g.read_tensor_f32(gn);
      ASSERT_EQ(got.size(), w.size()) << gn;
      for (size_t i = 0; i < w.size(); i++) ASSERT_EQ(got[i], w[i] + 1.0f) << gn << "[" << i << "]";
    }
    if (kind == "gemma2") {
      EXPECT_EQ(g.get_f32("gemma2.attn_logit_softcapping"), 5.0f);
      EXPECT_EQ(g.get_f32("gemma2.final_logit_softcapping"), 8.0f);
    } else {
      const std::vector<float> qn = st.read_f32("model.layers.5.self_attn.q_norm.weight", {16});
      EXPECT_EQ(g.read_tensor_f32("blk.5.attn_q_norm.weight")[3], qn[3] + 1.0f);
      EXPECT_EQ(g.get_string("gemma3.rope.scaling.type"), "linear");
      EXPECT_EQ(g.get_f32("gemma3.rope.scaling.factor"), 2.0f);
      EXPECT_EQ(g.get_f32("gemma3.rope.freq_base"), 1e6f);
    }
    // The vocabulary
    const json tj = json::parse(std::ifstream(dir + "/tokenizer.json"));
    EXPECT_EQ(g.get_string("tokenizer.ggml.model"), "llama");
    EXPECT_FALSE(g.get_bool("tokenizer.ggml.add_space_prefix"));
    const auto tokens = g.get_array_strings("tokenizer.ggml.tokens");
    const auto types = g.get_array_i64("tokenizer.ggml.token_type");
    const auto scores = g.get_array_f64("tokenizer.ggml.scores");
    ASSERT_EQ(tokens.size(), tj["model"]["vocab"].size());
    ASSERT_EQ(types.size(), tokens.size());
    ASSERT_EQ(scores.size(), tokens.size());
    EXPECT_EQ(types[2], 3) << "<bos>";
    EXPECT_EQ(types[3], 2) << "<unk>";
    EXPECT_EQ(tokens[4 + 0x41], "<0x41>");
    EXPECT_EQ(types[4 + 0x41], 6);
    const auto& merges = tj["model"]["merges"];
    std::map<std::string, size_t> first;  // each merge's piece scores minus the rank of its first merge
    for (size_t r = 0; r < merges.size(); r++)
      first.emplace(merges[r][0].get<std::string>() + merges[r][1].get<std::string>(), r);
    ASSERT_GT(first.size(), 20u);
    for (const auto& [piece, r] : first) {
      const int64_t id = tj["model"]["vocab"][piece].get<int64_t>();
      EXPECT_EQ(scores[size_t(id)], -double(r)) << piece;
      EXPECT_EQ(types[size_t(id)], 1) << piece;
    }
    EXPECT_EQ(scores[size_t(tj["model"]["vocab"]["t"].get<int64_t>())] < -double(merges.size()), true);
    EXPECT_EQ(g.get_u32("tokenizer.ggml.bos_token_id"), 2u);
    EXPECT_TRUE(g.get_bool("tokenizer.ggml.add_bos_token"));
  }
}

// What llama.cpp's gemma architectures fix instead of reading is checked: a layer pattern, a
// local RoPE base, an attention scale or caps other than theirs are refused by name.
TEST(GgufExport, GemmaThatLlamaCppWouldComputeDifferentlyIsRefused) {
  TmpDir d;
  const std::string out = d.path + "/x.gguf";
  auto variant = [&](const std::string& kind, const std::function<void(json&)>& edit) {
    const std::string dir = d.path + "/" + kind + "_edited";
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* f : {"model.safetensors", "tokenizer.json"}) fs::copy_file(kFx + "/export/" + kind + "/" + f, dir + "/" + f);
    json c = json::parse(std::ifstream(kFx + "/export/" + kind + "/config.json"));
    edit(c);
    std::ofstream(dir + "/config.json") << c.dump();
    return dir;
  };
  expect_error([&] { run_export("gguf", variant("gemma3", [](json& c) { c["layer_types"][5] = "sliding_attention"; }), "", "f32", out); },
               ErrorKind::Unsupported, {"layer_types", "layer 5", "five of every six"});
  expect_error([&] { run_export("gguf", variant("gemma3", [](json& c) { c["rope_local_base_freq"] = 20000.0; }), "", "f32", out); },
               ErrorKind::Unsupported, {"rope_local_base_freq", "10000"});
  expect_error([&] { run_export("gguf", variant("gemma3", [](json& c) { c["query_pre_attn_scalar"] = 32; }), "", "f32", out); },
               ErrorKind::Unsupported, {"query_pre_attn_scalar", "head_dim"});
  expect_error([&] { run_export("gguf", variant("gemma2", [](json& c) { c["final_logit_softcapping"] = nullptr; }), "", "f32", out); },
               ErrorKind::Unsupported, {"final_logit_softcapping", "always soft-caps"});
  expect_error([&] { run_export("gguf", variant("gemma2", [](json& c) { c["layer_types"][0] = "full_attention"; }), "", "f32", out); },
               ErrorKind::Unsupported, {"layer_types", "layer 0"});
  EXPECT_FALSE(fs::exists(out));
}

// ---- llama.cpp's logits ----------------------------------------------------------------------

json llama_cpp_fixture() {
  std::ifstream in(kFx + "/export/llama_cpp_logits.json");
  if (!in) return json();
  return json::parse(in);
}

// Bounds. f32 (merged, and the adapter GGUF run by llama.cpp on an f32 export of its base): both
// sides run the same fp32 weights and differ only in summation order; measured 8.3e-7 (tiny) and
// 3.1e-5 (SmolLM2, 30 layers), bounds about 10x and 5x that. q8_0: llama.cpp also rounds the
// activations to Q8_0 blocks before each product (ggml's vec_dot_type for Q8_0) while our engine
// multiplies the same dequantized weights with fp32 activations, so the bound is how far llama.cpp's
// own q8_0 logits are from its f32 logits of the same model on the same tokens (from the fixture:
// 0.063 tiny, 0.81 SmolLM2); ours are closer to llama.cpp's q8_0 than that (measured 0.032, 0.49).
double llama_cpp_self_gap(const json& fx, const std::string& a, const std::string& b) {
  const json *ca = nullptr, *cb = nullptr;
  for (const json& c : fx["cases"]) {
    if (c["name"] == a) ca = &c;
    if (c["name"] == b) cb = &c;
  }
  return ca && cb ? testing_util::records_gap((*ca)["rows"], (*cb)["rows"]) : 0;
}

// A quantized export of a Hugging Face directory (from_hf) is compared with the engine on the f32
// weights it was merged from, so the difference is llama.cpp's own quantized-vs-f32 gap plus the f32
// bound. Gemma's GeGLU runs in llama.cpp through ggml's float16 GELU table (its input and output
// rounded to f16, 2^-11 relative, in every MLP): measured 1.2e-3 (gemma2, 4 layers) and 4.7e-3
// (gemma3, 6 layers), bound 1e-2. With the engine's GELU rounded the same way (a local experiment)
// the gaps fall to 3.6e-5 and 1.8e-4, so the table is their cause; a norm without its 1 + w, a
// missing cap or a window on the wrong layers moves the logits by 0.1 or more.
double bound_for(const json& fx, const json& c, const std::string& outtype, bool real, bool from_hf) {
  const std::string name = c["name"];
  if (c.value("llama_cpp_gelu_f16_table", false)) return 1e-2;
  const double f32 = real ? 1.5e-4 : 1e-5;
  // MXFP4 experts: llama.cpp multiplies them by activations it rounds to Q8_0; its gap to its own F32
  // copy of the file bounds the comparison (the engine is held to the copy at f32 tolerance too).
  if (c.contains("rows_llama_cpp_f32_copy")) return testing_util::records_gap(c["rows"], c["rows_llama_cpp_f32_copy"]) + f32;
  if (outtype == "f32") return f32;
  const std::string model = name.substr(0, name.find('_'));
  const double gap = llama_cpp_self_gap(fx, model + "_f32", model + "_" + outtype);
  return gap > 0 && from_hf ? gap + f32 : gap;
}

TEST(GgufExportLlamaCpp, OurExportsAreTheFilesLlamaCppRanAndOurLogitsMatch) {
  const json fx = llama_cpp_fixture();
  if (fx.is_null()) GTEST_SKIP() << "tests/fixtures/export/llama_cpp_logits.json missing: run tools/make_gguf_export_fixtures.py";
  TmpDir d;
  int ran = 0;
  for (const json& c : fx["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const bool real = name.rfind("smollm2", 0) == 0;
    std::string base = std::string(QLORA_SOURCE_DIR) + "/" + c["model"].get<std::string>();
    if (real) {
      base = testing_paths::smollm2_gguf();
      if (base.empty()) {
        std::printf("skipping %s: %s\n", name.c_str(), testing_paths::smollm2_skip_reason());
        continue;
      }
    }
    const std::string adapter = std::string(QLORA_SOURCE_DIR) + "/" + c["adapter"].get<std::string>();
    const std::string out = d.path + "/" + name + ".gguf";
    run_export(c["format"], base, adapter, c["outtype"], out);
    ASSERT_EQ(sha256_file(out), c["sha256"].get<std::string>())
        << "the export no longer writes the bytes llama.cpp was run on: if the change is intended, re-run "
           "tools/make_gguf_export_fixtures.py";
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    // A merged GGUF runs as itself: the engine reads it back (its config, its 1 + w Gemma norms, its
    // fused Phi-3 projections and LongRoPE factors, its SentencePiece vocabulary) and must compute
    // what llama.cpp computed on the same bytes. One exported from a Hugging Face directory is also
    // compared with the engine on the base and adapter it was merged from (a mixture of experts'
    // experts are read back as slices of llama.cpp's 3-D stacks).
    const bool from_hf = fs::is_directory(base);
    const bool reads_back = c["format"] == "gguf";
    if (c.contains("text")) {  // our tokenizer (from the exported file, else the HF base's) agrees with llama.cpp's
      ModelSource s = open_model_source(reads_back ? out : base);
      EXPECT_EQ(s.tokenizer->encode(c["text"].get<std::string>(), false), ids);
      if (from_hf && reads_back) {  // and the tokenizer.json it was written from, the one the model trains with
        EXPECT_EQ(open_model_source(base).tokenizer->encode(c["text"].get<std::string>(), false), ids);
      }
    }
    std::vector<std::pair<std::string, std::vector<float>>> runs;
    if (reads_back) runs.emplace_back("the exported GGUF", source_logits(out, "", ids));
    // gpt-oss's YaRN has truncate false, which llama.cpp does not implement (the export notes it): the
    // file it runs is the model with truncate true, so the base and adapter must be seen to differ.
    const bool yarn_truncates = c.value("llama_cpp_yarn_truncates", false);
    if (!reads_back || (from_hf && !yarn_truncates)) runs.emplace_back("the base and adapter", source_logits(base, adapter, ids));
    const double tol = bound_for(fx, c, c["outtype"], real, from_hf);
    ASSERT_GT(tol, 0) << "no bound for " << name;
    // llama.cpp's logits of the f32 model: its run, or its F32 copy's where it multiplied MXFP4 experts.
    const json& f32_rows = c.contains("rows_llama_cpp_f32_copy") ? c["rows_llama_cpp_f32_copy"] : c["rows"];
    if (yarn_truncates && c["outtype"] == "f32") {  // (a q8_0 file's own gap would hide it)
      const double f32_tol = 1e-5;
      const auto untruncated = testing_util::recorded_logits_gap(source_logits(base, adapter, ids), f32_rows, 2 * f32_tol);
      std::printf("%s, the engine on the base and adapter (YaRN untruncated): max |logit - llama.cpp| = %.3g\n", name.c_str(),
                  untruncated.max_diff);
      EXPECT_GT(untruncated.max_diff, 100 * f32_tol) << "llama.cpp's YaRN was expected to differ from truncate false";
      const std::vector<std::string> notes = run_export(c["format"], base, adapter, c["outtype"], out).notes;
      EXPECT_TRUE(std::any_of(notes.begin(), notes.end(), [](const std::string& n) { return n.find("truncate false") != std::string::npos; }))
          << "the export does not say that llama.cpp truncates YaRN's ramp";
    }
    if (reads_back && c.contains("rows_llama_cpp_f32_copy")) {
      const auto copy = testing_util::recorded_logits_gap(runs.front().second, f32_rows, 2e-5);
      std::printf("%s, the engine on the exported GGUF: max |logit - llama.cpp on its F32 copy| = %.3g (bound 1e-05)\n",
                  name.c_str(), copy.max_diff);
      EXPECT_LE(copy.max_diff, 1e-5) << "the engine against llama.cpp's F32 copy of the file";
      EXPECT_TRUE(c.value("experts_mxfp4", false));
      EXPECT_TRUE(open_model_source(out).tensors.stored_expert_quant.has_value()) << "the MXFP4 experts are held as shipped";
    }
    fs::remove(out);
    double max_diff = 0;
    for (const auto& [what, lg] : runs) {
      SCOPED_TRACE("the engine on " + what);
      const testing_util::RecordedLogitsGap g = testing_util::recorded_logits_gap(lg, c["rows"], 2 * tol);
      EXPECT_TRUE(g.top1_wrong_with_margin.empty()) << "another top token at " << g.top1_wrong_with_margin.size() << " positions";
      std::printf("%s, the engine on %s: max |logit - llama.cpp| = %.3g (bound %.3g)\n", name.c_str(), what.c_str(), g.max_diff, tol);
      EXPECT_LE(g.max_diff, tol);
      max_diff = std::max(max_diff, g.max_diff);
    }
    RecordProperty("max_abs_diff_" + name, std::to_string(max_diff));
    ran++;
  }
  EXPECT_GE(ran, 3);
}

}  // namespace
}  // namespace qlora
