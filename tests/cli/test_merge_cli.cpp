// `qlora merge`: the merged directory, loaded by the engine without an adapter, gives PEFT's
// base + adapter logits (HF, sharded, bnb NF4 and GGUF bases); bf16 output is the fp32 merge rounded;
// the files are byte-identical to those transformers was checked on (tests/fixtures/merge/); bad
// inputs fail naming the file or option and leave nothing behind.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "config_expect.h"
#include "model_test_util.h"
#include "sha256_util.h"
#include "cli_util.h"
#include "core/dtype.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/experts.h"
#include "model/decoder_model.h"
#include "model/peft_io.h"
#include "text/tokenizer.h"
#include "train/model_source.h"

using namespace qlora;
using namespace qlora::cli_test;
using namespace qlora::testing_util;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kFix = QLORA_FIXTURES;
const std::string kLlama = kFix + "/models/llama_gqa";
const std::string kAdapter = kFix + "/parity/llama_gqa_adapter";

RunResult merge(const std::string& args) { return run_qlora("merge " + args); }

// Logits of a model directory run by the engine with a LoRA that adds nothing (B = 0).
std::vector<float> engine_logits(const std::string& dir, const std::string& fixture = "parity/llama_gqa.safetensors") {
  SafetensorsArchive fx(kFix + "/" + fixture);
  const Batch b = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
  auto be = make_cpu_backend();
  ModelSource src = open_model_source(dir);
  ModelPlanOptions po;
  po.micro_batch = b.b;
  po.seq_len = b.t;
  DecoderModel m(src.config, *be, po, fixture_lora());
  m.load_base(src.tensors);
  m.init_trainable(1);
  return m.logits(b);
}

std::vector<float> lora_logits(const std::string& fixture = "parity/llama_gqa.safetensors") {
  return floats(SafetensorsArchive(kFix + "/" + fixture), "lora_logits");
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

}  // namespace

// (a) fp32: the engine loads the merged directory (no adapter) and computes PEFT's base + adapter
// logits; config.json is the base's own with the dtype set.
TEST(MergeCli, Fp32OutputGivesPeftLogits) {
  const std::string out = temp_dir("merge_fp32") + "/out";
  RunResult r = merge("--model " + kLlama + " --adapter " + kAdapter + " --out " + out + " --dtype fp32");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("14 projections merged"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("merge: tensor 21/21"), std::string::npos) << r.output;
  EXPECT_EQ(entries(out), (std::set<std::string>{"config.json", "generation_config.json", "model.safetensors"}));
  EXPECT_LT(rel_err(engine_logits(out), lora_logits()), 2e-5);
  const json cfg = json::parse(read_file(out + "/config.json"));
  const json base = json::parse(read_file(kLlama + "/config.json"));
  EXPECT_EQ(cfg, base);  // float32 base, fp32 output: config.json unchanged
  SafetensorsArchive ar(out);
  EXPECT_EQ(ar.metadata().at("format"), "pt");
  EXPECT_EQ(ar.names(), SafetensorsArchive(kLlama).names());
  fs::remove_all(fs::path(out).parent_path());
}

// (b) bf16: every value is the fp32 merge rounded to bf16; config.json says bfloat16.
TEST(MergeCli, Bf16OutputIsTheFp32MergeRounded) {
  const std::string dir = temp_dir("merge_bf16");
  ASSERT_EQ(merge("--model " + kLlama + " --adapter " + kAdapter + " --out " + dir + "/f32 --dtype fp32").code, 0);
  RunResult r = merge("--model " + kLlama + " --adapter " + kAdapter + " --out " + dir + "/b16 --dtype bf16");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("written in bfloat16"), std::string::npos) << r.output;
  SafetensorsArchive f32(dir + "/f32"), b16(dir + "/b16");
  ASSERT_EQ(f32.names(), b16.names());
  for (const auto& n : f32.names()) {
    const TensorInfo& t = b16.get(n);
    ASSERT_EQ(t.dtype, DType::BF16) << n;
    const std::vector<float> v = floats(f32, n);
    std::vector<uint16_t> want(v.size());
    convert_from_f32(DType::BF16, v.data(), want.data(), int64_t(v.size()));
    EXPECT_EQ(0, std::memcmp(want.data(), t.data, size_t(t.nbytes))) << n;
  }
  EXPECT_EQ(json::parse(read_file(dir + "/b16/config.json"))["torch_dtype"], "bfloat16");
  EXPECT_LT(rel_err(engine_logits(dir + "/b16"), lora_logits()), 3e-2);  // bf16 weights
  fs::remove_all(dir);
}

// (c) A small --max-shard-size: transformers' shard names and index; the sharded directory loads
// to the same logits bit for bit.
TEST(MergeCli, ShardsWithTransformersIndex) {
  const std::string dir = temp_dir("merge_shards");
  ASSERT_EQ(merge("--model " + kLlama + " --adapter " + kAdapter + " --out " + dir + "/one --dtype fp32").code, 0);
  RunResult r = merge("--model " + kLlama + " --adapter " + kAdapter + " --out " + dir +
                      "/many --dtype fp32 --max-shard-size 100KB");
  ASSERT_EQ(r.code, 0) << r.output;
  const json index = json::parse(read_file(dir + "/many/model.safetensors.index.json"));
  const json& wm = index["weight_map"];
  std::set<std::string> files;
  for (const auto& [name, file] : wm.items()) files.insert(file.get<std::string>());
  ASSERT_GT(files.size(), 2u);
  int64_t total = 0;
  size_t i = 1;
  for (const auto& f : files) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", i++, files.size());
    EXPECT_EQ(f, want);
    SafetensorsFile sf(dir + "/many/" + f);
    int64_t bytes = 0;
    for (const auto& [n, t] : sf.tensors()) {
      bytes += t.nbytes;
      EXPECT_EQ(wm[n], f) << n;
    }
    EXPECT_TRUE(bytes <= 100000 || sf.tensors().size() == 1) << f << " holds " << bytes << " bytes";
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(wm.size(), SafetensorsArchive(dir + "/one").size());
  EXPECT_FALSE(fs::exists(dir + "/many/model.safetensors"));
  EXPECT_EQ(engine_logits(dir + "/many"), engine_logits(dir + "/one"));
  fs::remove_all(dir);
}

// (d) bnb NF4 base: bf16 by default with a note saying why; no quantization_config; the fp32 merge
// gives PEFT's logits on the NF4 base (transformers + bitsandbytes fixture).
TEST(MergeCli, Nf4BaseIsWrittenDequantizedWithANote) {
  const std::string dir = temp_dir("merge_nf4");
  const std::string base = kFix + "/qlora/llama_gqa_bnb_nf4";
  RunResult r = merge("--model " + base + " --adapter " + kAdapter + " --out " + dir + "/out");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the base is quantized (nf4 (double quant)); the output is the dequantized base plus the "
                          "adapter in bf16, not re-quantized"),
            std::string::npos)
      << r.output;
  const json cfg = json::parse(read_file(dir + "/out/config.json"));
  EXPECT_FALSE(cfg.contains("quantization_config"));
  EXPECT_EQ(cfg["dtype"], "bfloat16");
  EXPECT_FALSE(cfg.contains("torch_dtype"));  // the base spells it "dtype" (transformers 5)
  const json src = json::parse(read_file(base + "/config.json"));
  for (const auto& [k, v] : src.items()) {
    if (k != "quantization_config" && k != "dtype") {
      EXPECT_EQ(cfg[k], v) << k;
    }
  }
  SafetensorsArchive ar(dir + "/out");
  for (const auto& n : ar.names()) EXPECT_EQ(ar.get(n).dtype, DType::BF16) << n;
  const std::string nf4_fx = "qlora/llama_gqa_nf4.safetensors";
  EXPECT_LT(rel_err(engine_logits(dir + "/out", nf4_fx), lora_logits(nf4_fx)), 3e-2);
  ASSERT_EQ(merge("--model " + base + " --adapter " + kAdapter + " --out " + dir + "/f32 --dtype fp32").code, 0);
  EXPECT_LT(rel_err(engine_logits(dir + "/f32", nf4_fx), lora_logits(nf4_fx)), 2e-5);
  fs::remove_all(dir);
}

// (e) GGUF base: config.json written from the GGUF (reads back as the same config), tokenizer
// files from its vocabulary, PEFT's logits.
TEST(MergeCli, GgufBase) {
  const std::string out = temp_dir("merge_gguf") + "/out";
  const std::string gguf = kFix + "/gguf/tiny_llama.gguf";
  RunResult r = merge("--model " + gguf + " --adapter " + kAdapter + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("fp32"), std::string::npos) << r.output;  // an F32 GGUF stays fp32
  EXPECT_EQ(entries(out), (std::set<std::string>{"config.json", "generation_config.json", "model.safetensors",
                                                 "tokenizer.json", "tokenizer_config.json"}));
  EXPECT_LT(rel_err(engine_logits(out), lora_logits()), 2e-5);
  const LlamaConfig a = open_model_source(gguf).config, b = load_hf_config(out + "/config.json");
  EXPECT_EQ(b.model_type, a.model_type);
  EXPECT_EQ(b.n_head_kv, a.n_head_kv);
  EXPECT_EQ(b.head_dim, a.head_dim);
  EXPECT_EQ(b.rope_theta, a.rope_theta);
  EXPECT_EQ(b.rope_scaling.type, "llama3");
  EXPECT_EQ(b.rope_scaling.original_max_position_embeddings, a.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(b.bos_token_id, a.bos_token_id);
  EXPECT_EQ(b.eos_token_id, a.eos_token_id);
  EXPECT_EQ(rope_inv_freq(b), rope_inv_freq(a));
  const Tokenizer t = Tokenizer::from_file(out + "/tokenizer.json");
  const Tokenizer g = Tokenizer::from_gguf(GgufFile(gguf));
  EXPECT_EQ(t.vocab_size(), g.vocab_size());
  EXPECT_EQ(t.bos_id(), g.bos_id());
  EXPECT_EQ(t.eos_id(), g.eos_id());
  fs::remove_all(fs::path(out).parent_path());
}

// Gemma 2, Gemma 3, Phi-3 (LongRoPE, half the dims rotated), Mixtral and Qwen3-MoE from the GGUF
// `qlora export` writes: the merged directory's config.json is the family's own and reads back as
// the model the GGUF held, its weights give the GGUF + adapter's logits (Gemma's norms back to w,
// Phi-3's fused projections kept fused, each expert unstacked under the checkpoint's name), and the
// tokenizer.json written from the GGUF's vocabulary tokenizes as the GGUF does.
TEST(MergeCli, FamilyGgufBasesWriteTheirFamilysFiles) {
  struct Case {
    std::string model, adapter, arch;
  };
  const std::string text = "the dog runs over the river, \xc3\xa9t\xc3\xa9 at Where's the fox? the sun";
  for (const Case& c : {Case{kFix + "/export/gemma2", kFix + "/export/gemma2_adapter", "Gemma2ForCausalLM"},
                        Case{kFix + "/export/gemma3", kFix + "/export/gemma3_adapter", "Gemma3ForCausalLM"},
                        Case{kFix + "/models/phi3_longrope", kFix + "/parity/phi3_longrope_adapter", "Phi3ForCausalLM"},
                        Case{kFix + "/models/mixtral", kFix + "/parity/mixtral_adapter", "MixtralForCausalLM"},
                        Case{kFix + "/models/qwen3_moe_norm", kFix + "/parity/qwen3_moe_norm_adapter", "Qwen3MoeForCausalLM"},
                        Case{kFix + "/export/gpt_oss", kFix + "/parity/gpt_oss_adapter", "GptOssForCausalLM"}}) {
    SCOPED_TRACE(c.arch);
    const std::string dir = temp_dir("merge_gguf_family"), gguf = dir + "/base.gguf", out = dir + "/out";
    RunResult e = run_qlora("export --format gguf --outtype f32 --model " + c.model + " --out " + gguf);
    ASSERT_EQ(e.code, 0) << e.output;
    RunResult r = merge("--model " + gguf + " --adapter " + c.adapter + " --out " + out);
    ASSERT_EQ(r.code, 0) << r.output;
    const json cfg = json::parse(read_file(out + "/config.json"));
    EXPECT_EQ(cfg["architectures"][0], c.arch);
    const LlamaConfig from_gguf = open_model_source(gguf).config;
    expect_same_math(from_gguf, load_hf_config(out + "/config.json"));
    // and the model it was exported from, but for gpt-oss's YaRN: llama.cpp truncates its ramp, so the
    // GGUF (and the merge of it) is the model with truncate true, which the config.json says.
    LlamaConfig exported = load_hf_config(c.model + "/config.json");
    const bool yarn_truncated = exported.rope_scaling.type == "yarn" && !exported.rope_scaling.truncate;
    exported.rope_scaling.truncate = true;
    exported.router_aux_loss_coef = from_gguf.router_aux_loss_coef;  // a GGUF has no setting for it
    exported.experts_stored = from_gguf.experts_stored;              // gpt-oss's MXFP4 comes back as floats
    expect_same_math(from_gguf, exported);
    EXPECT_EQ(cfg["rope_scaling"].is_object() && cfg["rope_scaling"].value("truncate", false), yarn_truncated);
    const std::vector<int32_t> ids = {2, 17, 42, 5, 88, 63, 9, 30, 71, 1, 55, 12};
    EXPECT_LT(rel_err(source_logits(out, "", ids), source_logits(gguf, c.adapter, ids)), 2e-5);
    if (!yarn_truncated) {
      EXPECT_LT(rel_err(source_logits(out, "", ids), source_logits(c.model, c.adapter, ids)), 2e-5);
    }
    if (from_gguf.model_type == "gpt_oss") {  // GptOssExperts' fused stacks and their biases
      const SafetensorsArchive st(out + "/model.safetensors");
      for (const char* t : {"gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"})
        EXPECT_TRUE(st.has("model.layers.2.mlp.experts." + std::string(t))) << t;
      EXPECT_TRUE(st.has("model.layers.2.self_attn.sinks"));
    } else if (from_gguf.moe()) {  // the checkpoint's per-expert tensors, as the Hub's files name them
      const SafetensorsArchive st(out + "/model.safetensors");
      const std::string last = hf_expert_name(from_gguf, from_gguf.n_layer - 1, from_gguf.n_experts - 1, "down_proj");
      EXPECT_TRUE(st.has(last)) << last;
      EXPECT_TRUE(st.has(hf_router_name(from_gguf, 0)));
    }
    const Tokenizer merged = Tokenizer::from_file(out + "/tokenizer.json"), g = Tokenizer::from_gguf(GgufFile(gguf));
    EXPECT_EQ(merged.encode(text, true), g.encode(text, true));
    EXPECT_EQ(merged.encode(text, false), Tokenizer::from_file(c.model + "/tokenizer.json").encode(text, false));
    fs::remove_all(dir);
  }
}

// The files `qlora merge` writes now are those transformers loaded and checked against PEFT
// (tools/make_merge_fixtures.py): same names, same sha256.
TEST(MergeCli, OutputsAreTheFilesTransformersChecked) {
  const json check = json::parse(read_file(kFix + "/merge/merge_check.json"));
  ASSERT_GE(check["cases"].size(), 5u);
  const std::string dir = temp_dir("merge_sha");
  for (const auto& [name, c] : check["cases"].items()) {
    std::string args;
    for (const auto& a : c["args"]) {
      const std::string s = a.get<std::string>();
      if (s.rfind("@", 0) == 0) {  // a GGUF base exported from that directory first, as the script did
        const std::string base = dir + "/" + name + "_base.gguf";
        RunResult e = run_qlora("export --format gguf --outtype f32 --model " + kFix + "/" + s.substr(1) + " --out " + base);
        ASSERT_EQ(e.code, 0) << name << ": " << e.output;
        EXPECT_EQ(qlora::testing_util::sha256_file(base), c["base_gguf_sha256"].get<std::string>()) << name;
        args += " " + base;
        continue;
      }
      args += " " + (s.rfind("--", 0) != 0 && s != "merge" && fs::exists(kFix + "/" + s) ? kFix + "/" + s : s);
    }
    const std::string out = dir + "/" + name;
    RunResult r = run_qlora(args.substr(1) + " --out " + out);
    ASSERT_EQ(r.code, 0) << name << ": " << r.output;
    std::set<std::string> want;
    for (const auto& [f, sum] : c["files"].items()) {
      want.insert(f);
      EXPECT_EQ(qlora::testing_util::sha256_file(out + "/" + f), sum.get<std::string>())
          << name << ": " << f << " differs from the file transformers checked; if the change is intended, "
          << "re-run /opt/fixenv/bin/python tools/make_merge_fixtures.py build/qlora (see tests/fixtures/merge/README.md)";
    }
    EXPECT_EQ(entries(out), want) << name;
    EXPECT_LT(c["logits_max_abs_err"].get<double>(),
              (c["dtype"] == "float32" ? 2e-5 : 3e-2) * c["logits_max_abs"].get<double>())
        << name;
  }
  fs::remove_all(dir);
}

// (f) Errors name the file, tensor or option, and leave nothing behind.
TEST(MergeCli, ErrorsLeaveNothingBehind) {
  const std::string dir = temp_dir("merge_errors");
  const std::string out = dir + "/out";
  auto expect_fail = [&](const std::string& args, const std::string& says) {
    RunResult r = merge(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << "\n" << r.output;
  };
  const std::string io = "--model " + kLlama + " --adapter ";
  // An adapter for another shape (mistral: one kv head): names the adapter file and tensor.
  expect_fail(io + kFix + "/parity/mistral_adapter --out " + out,
              "adapter_model.safetensors: tensor 'base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight'");
  // No adapter files.
  expect_fail(io + dir + " --out " + out, dir + "/adapter_config.json");
  // Unknown dtype: lists the allowed ones.
  expect_fail(io + kAdapter + " --out " + out + " --dtype int8", "allowed: bf16, fp16, fp32");
  expect_fail(io + kAdapter + " --out " + out + " --max-shard-size 5XB", "--max-shard-size");
  // A disk that fills up (a file size limit): the error names the file being written.
  RunResult full = run_command("ulimit -f 100; " + std::string(QLORA_BIN) + " merge " + io + kAdapter + " --out " + out +
                             " --dtype fp32 2>&1");
  EXPECT_EQ(full.code, 1) << full.output;
  EXPECT_NE(full.output.find(out + "/model.safetensors: write failed"), std::string::npos) << full.output;
  EXPECT_NE(full.output.find("nothing was written to " + out), std::string::npos) << full.output;
  EXPECT_EQ(entries(dir), std::set<std::string>{}) << "an error left files behind";
  // An existing non-empty directory is refused without --force and kept as it was.
  fs::create_directories(out);
  { std::ofstream(out + "/mine.txt") << "user data"; }
  expect_fail(io + kAdapter + " --out " + out, "exists and is not empty");
  EXPECT_EQ(read_file(out + "/mine.txt"), "user data");
  EXPECT_EQ(entries(dir), std::set<std::string>{"out"});
  // --force replaces it; an --out holding an input is refused even with --force.
  RunResult forced = merge(io + kAdapter + " --out " + out + " --force");
  ASSERT_EQ(forced.code, 0) << forced.output;
  EXPECT_FALSE(fs::exists(out + "/mine.txt"));
  EXPECT_EQ(entries(dir), std::set<std::string>{"out"});
  fs::create_directories(dir + "/holder");
  fs::copy(kLlama, dir + "/holder/base");
  expect_fail("--model " + dir + "/holder/base --adapter " + kAdapter + " --out " + dir + "/holder --force",
              "contains the input");
  EXPECT_TRUE(fs::exists(dir + "/holder/base/model.safetensors"));
  fs::remove_all(dir);
}
