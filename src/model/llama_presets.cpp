// Built-in presets of real model shapes: the table of their config.json numbers and the LlamaConfig
// each one gives.
#include "model/llama_config.h"

#include <cmath>

#include "core/error.h"
#include "core/strings.h"
#include "io/json_util.h"

namespace qlora {


namespace {
struct Preset {
  const char* name;
  const char* hf_repo;  // where the numbers come from (config.json)
  const char* model_type;
  int64_t V, C, F, L, H, KV, head_dim, max_pos;
  double eps, theta;
  const char* rope;  // "none" | "linear" | "llama3" | "longrope" | "yarn"
  double rope_factor;
  bool tie;
  int64_t bos, eos;
  const char* torch_dtype;
};

// clang-format off
const Preset kPresets[] = {
  // name            HF repo (config.json)                     type       V       C      F      L    H   KV  hd   max_pos  eps    theta    rope      fac  tie    bos     eos     dtype
  {"llama2-7b",      "meta-llama/Llama-2-7b-hf",               "llama",   32000,  4096,  11008, 32,  32, 32, 128, 4096,   1e-5, 10000,   "none",   1,   false, 1,      2,      "float16"},
  {"llama3-8b",      "meta-llama/Meta-Llama-3-8B",             "llama",   128256, 4096,  14336, 32,  32, 8,  128, 8192,   1e-5, 500000,  "none",   1,   false, 128000, 128001, "bfloat16"},
  {"llama3-70b",     "meta-llama/Meta-Llama-3-70B",            "llama",   128256, 8192,  28672, 80,  64, 8,  128, 8192,   1e-5, 500000,  "none",   1,   false, 128000, 128001, "bfloat16"},
  {"llama3.1-8b",    "meta-llama/Llama-3.1-8B",                "llama",   128256, 4096,  14336, 32,  32, 8,  128, 131072, 1e-5, 500000,  "llama3", 8,   false, 128000, 128001, "bfloat16"},
  {"llama3.1-70b",   "meta-llama/Llama-3.1-70B",               "llama",   128256, 8192,  28672, 80,  64, 8,  128, 131072, 1e-5, 500000,  "llama3", 8,   false, 128000, 128001, "bfloat16"},
  {"llama3.1-405b",  "meta-llama/Llama-3.1-405B",              "llama",   128256, 16384, 53248, 126, 128, 8, 128, 131072, 1e-5, 500000,  "llama3", 8,   false, 128000, 128001, "bfloat16"},
  {"llama3.2-1b",    "meta-llama/Llama-3.2-1B",                "llama",   128256, 2048,  8192,  16,  32, 8,  64,  131072, 1e-5, 500000,  "llama3", 32,  true,  128000, 128001, "bfloat16"},
  {"llama3.2-3b",    "meta-llama/Llama-3.2-3B",                "llama",   128256, 3072,  8192,  28,  24, 8,  128, 131072, 1e-5, 500000,  "llama3", 32,  true,  128000, 128001, "bfloat16"},
  {"mistral-7b",     "mistralai/Mistral-7B-v0.3",              "mistral", 32768,  4096,  14336, 32,  32, 8,  128, 32768,  1e-5, 1e6,     "none",   1,   false, 1,      2,      "bfloat16"},
  {"qwen2.5-0.5b",   "Qwen/Qwen2.5-0.5B",                      "qwen2",   151936, 896,   4864,  24,  14, 2,  64,  32768,  1e-6, 1e6,     "none",   1,   true,  151643, 151643, "bfloat16"},
  {"qwen2.5-7b",     "Qwen/Qwen2.5-7B",                        "qwen2",   152064, 3584,  18944, 28,  28, 4,  128, 131072, 1e-6, 1e6,     "none",   1,   false, 151643, 151643, "bfloat16"},
  {"qwen2.5-72b",    "Qwen/Qwen2.5-72B",                       "qwen2",   152064, 8192,  29568, 80,  64, 8,  128, 131072, 1e-5, 1e6,     "none",   1,   false, 151643, 151643, "bfloat16"},
  {"qwen3-0.6b",     "Qwen/Qwen3-0.6B",                        "qwen3",   151936, 1024,  3072,  28,  16, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   true,  151643, 151645, "bfloat16"},
  {"qwen3-1.7b",     "Qwen/Qwen3-1.7B",                        "qwen3",   151936, 2048,  6144,  28,  16, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   true,  151643, 151645, "bfloat16"},
  {"qwen3-4b",       "Qwen/Qwen3-4B",                          "qwen3",   151936, 2560,  9728,  36,  32, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   true,  151643, 151645, "bfloat16"},
  {"qwen3-8b",       "Qwen/Qwen3-8B",                          "qwen3",   151936, 4096,  12288, 36,  32, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   false, 151643, 151645, "bfloat16"},
  {"qwen3-14b",      "Qwen/Qwen3-14B",                         "qwen3",   151936, 5120,  17408, 40,  40, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   false, 151643, 151645, "bfloat16"},
  {"qwen3-32b",      "Qwen/Qwen3-32B",                         "qwen3",   151936, 5120,  25600, 64,  64, 8,  128, 40960,  1e-6, 1e6,     "none",   1,   false, 151643, 151645, "bfloat16"},
  // Gemma 2: window 4096 on every other layer, soft-capping 50 (scores) and 30 (logits).
  {"gemma-2-2b",     "google/gemma-2-2b",                      "gemma2",  256000, 2304,  9216,  26,  8,  4,  256, 8192,   1e-6, 10000,   "none",   1,   true,  2,      1,      "float32"},
  {"gemma-2-9b",     "google/gemma-2-9b",                      "gemma2",  256000, 3584,  14336, 42,  16, 8,  256, 8192,   1e-6, 10000,   "none",   1,   true,  2,      1,      "float32"},
  {"gemma-2-27b",    "google/gemma-2-27b",                     "gemma2",  256000, 4608,  36864, 46,  32, 16, 128, 8192,   1e-6, 10000,   "none",   1,   true,  2,      1,      "float32"},
  // Gemma 3: the text model (text_config of the multimodal 4b/12b/27b checkpoints); window and
  // query_pre_attn_scalar in kGemma below.
  {"gemma-3-270m",   "google/gemma-3-270m",                    "gemma3_text", 262144, 640, 2048, 18, 4, 1, 256, 32768,   1e-6, 1e6,     "none",   1,   true,  2,      1,      "bfloat16"},
  {"gemma-3-1b",     "google/gemma-3-1b-pt",                   "gemma3_text", 262144, 1152, 6912, 26, 4, 1, 256, 32768,  1e-6, 1e6,     "none",   1,   true,  2,      1,      "bfloat16"},
  {"gemma-3-4b",     "google/gemma-3-4b-pt",                   "gemma3_text", 262208, 2560, 10240, 34, 8, 4, 256, 131072, 1e-6, 1e6,     "linear", 8,   true,  2,      1,      "bfloat16"},
  {"gemma-3-12b",    "google/gemma-3-12b-pt",                  "gemma3_text", 262208, 3840, 15360, 48, 16, 8, 256, 131072, 1e-6, 1e6,    "linear", 8,   true,  2,      1,      "bfloat16"},
  {"gemma-3-27b",    "google/gemma-3-27b-pt",                  "gemma3_text", 262208, 5376, 21504, 62, 32, 16, 128, 131072, 1e-6, 1e6,   "linear", 8,   true,  2,      1,      "bfloat16"},
  // Phi: qkv_proj and gate_up_proj fused; Phi-3-mini-4k slides a window of 2047 keys on every layer.
  {"phi-3-mini-4k",  "microsoft/Phi-3-mini-4k-instruct",       "phi3",    32064,  3072,  8192,  32,  32, 32, 96,  4096,   1e-5, 10000,   "none",   1,   false, 1,      32000,  "bfloat16"},
  {"phi-4",          "microsoft/phi-4",                        "phi3",    100352, 5120,  17920, 40,  40, 10, 128, 16384,  1e-5, 250000,  "none",   1,   false, 100257, 100265, "bfloat16"},
  // LongRoPE from 4,096 positions; Phi-4-mini rotates 96 of each head's 128 dims (partial_rotary_factor 0.75).
  {"phi-3.5-mini",   "microsoft/Phi-3.5-mini-instruct",        "phi3",    32064,  3072,  8192,  32,  32, 32, 96,  131072, 1e-5, 10000,   "longrope", 32, false, 1,      32000,  "bfloat16"},
  {"phi-4-mini",     "microsoft/Phi-4-mini-instruct",          "phi3",    200064, 3072,  8192,  32,  24, 8,  128, 131072, 1e-5, 10000,   "longrope", 32, true,  199999, 199999, "bfloat16"},
  // Mixture of experts: experts, experts per token and the expert's size in kMoe below.
  {"mixtral-8x7b",   "mistralai/Mixtral-8x7B-v0.1",            "mixtral", 32000,  4096,  14336, 32,  32, 8,  128, 32768,  1e-5, 1e6,     "none",   1,   false, 1,      2,      "bfloat16"},
  {"qwen3-30b-a3b",  "Qwen/Qwen3-30B-A3B",                     "qwen3_moe", 151936, 2048, 6144, 48,  32, 4,  128, 40960,  1e-6, 1e6,     "none",   1,   false, 151643, 151645, "bfloat16"},
  {"gpt-oss-20b",    "openai/gpt-oss-20b",                     "gpt_oss", 201088, 2880,  2880,  24,  64, 8,  64,  131072, 1e-5, 150000,  "yarn",   32,  false, 199998, 200002, "bfloat16"},
  {"gpt-oss-120b",   "openai/gpt-oss-120b",                    "gpt_oss", 201088, 2880,  2880,  36,  64, 8,  64,  131072, 1e-5, 150000,  "yarn",   32,  false, 199998, 200002, "bfloat16"},
  {"smollm2-135m",   "HuggingFaceTB/SmolLM2-135M",             "llama",   49152,  576,   1536,  30,  9,  3,  64,  8192,   1e-5, 100000,  "none",   1,   true,  0,      0,      "bfloat16"},
  {"smollm2-360m",   "HuggingFaceTB/SmolLM2-360M",             "llama",   49152,  960,   2560,  32,  15, 5,  64,  8192,   1e-5, 100000,  "none",   1,   true,  0,      0,      "bfloat16"},
  {"smollm2-1.7b",   "HuggingFaceTB/SmolLM2-1.7B",             "llama",   49152,  2048,  8192,  24,  32, 32, 64,  8192,   1e-5, 130000,  "none",   1,   true,  0,      0,      "bfloat16"},
  {"tinyllama-1.1b", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "llama", 32000, 2048, 5632, 22, 32, 4, 64, 2048, 1e-5, 10000, "none", 1,  false, 1,      2,      "float32"},
};
// clang-format on

// Gemma's sliding window and query_pre_attn_scalar per preset (Gemma 2: every other layer global;
// Gemma 3: every 6th, local RoPE base 10,000).
struct GemmaExtra {
  const char* name;
  int64_t window;
  double query_pre_attn_scalar;
};
const GemmaExtra kGemma[] = {
    {"gemma-2-2b", 4096, 256}, {"gemma-2-9b", 4096, 256},   {"gemma-2-27b", 4096, 144}, {"gemma-3-270m", 512, 256},
    {"gemma-3-1b", 512, 256},
    {"gemma-3-4b", 1024, 256}, {"gemma-3-12b", 1024, 256}, {"gemma-3-27b", 1024, 168}};

// The mixture-of-experts presets' experts (their config.json: num_local_experts / num_experts,
// num_experts_per_tok, intermediate_size / moe_intermediate_size, norm_topk_prob).
struct MoeExtra {
  const char* name;
  int64_t experts, per_tok, expert_size;
  bool norm_topk;
};
const MoeExtra kMoe[] = {{"mixtral-8x7b", 8, 2, 14336, true},
                         {"qwen3-30b-a3b", 128, 8, 768, true},
                         {"gpt-oss-20b", 32, 4, 2880, true},
                         {"gpt-oss-120b", 128, 4, 2880, true}};
}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> n;
    for (const auto& p : kPresets) n.push_back(p.name);
    return n;
  }();
  return v;
}

bool has_preset(const std::string& name) {
  for (const auto& p : kPresets)
    if (name == p.name) return true;
  return false;
}

namespace {

// The preset's RoPE scaling (and Phi-4-mini's partial rotary dims, which LongRoPE's factors count).
void apply_preset_rope(const Preset& p, const std::string& name, LlamaConfig& c) {
  if (std::string(p.rope) == "linear") {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = p.rope_factor;
  }
  if (std::string(p.rope) == "yarn") {  // gpt-oss: from 4,096 positions, the ramp not truncated
    c.rope_scaling.type = "yarn";
    c.rope_scaling.factor = p.rope_factor;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.rope_scaling.truncate = false;
    c.rope_scaling.attention_factor = 0.1 * std::log(p.rope_factor) + 1.0;
  }
  if (name == "phi-4-mini") c.rotary_dim = 96;
  if (std::string(p.rope) == "longrope") {  // the factors do not change a plan: ones stand in for them
    c.rope_scaling.type = "longrope";
    c.rope_scaling.factor = p.rope_factor;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.rope_scaling.attention_factor = longrope_attention_factor(p.rope_factor, 4096);
    c.rope_scaling.short_factor.assign(size_t(c.rope_dim() / 2), 1.0);
    c.rope_scaling.long_factor = c.rope_scaling.short_factor;
  }
  if (std::string(p.rope) == "llama3") {
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = p.rope_factor;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 8192;
  }
}

// Gemma 2 / Gemma 3's layout: kGemma's window and scalar, the norms, GeGLU, the sliding layers.
void apply_gemma_preset(const std::string& name, LlamaConfig& c) {
  const bool gemma2 = c.model_type == "gemma2";
  for (const auto& g : kGemma)
    if (name == g.name) {
      c.sliding_window = g.window;
      c.query_pre_attn_scalar = g.query_pre_attn_scalar;
    }
  c.norm_unit_offset = c.sandwich_norms = c.scale_embeddings = true;
  c.qk_norm = !gemma2;
  c.hidden_act = Activation::GeluTanh;
  c.rope_local_theta = gemma2 ? 0.0 : 10000.0;
  if (gemma2) c.attn_logit_softcapping = 50.0, c.final_logit_softcapping = 30.0;
  const int64_t pattern = gemma2 ? 2 : 6;
  c.sliding_layers.assign(size_t(c.n_layer), false);
  for (int64_t l = 0; l < c.n_layer; l++) c.sliding_layers[size_t(l)] = (l + 1) % pattern != 0;
}

// What the preset's family always has: its attention's biases and norms, kMoe's experts, the
// Gemma, gpt-oss and Phi-3 layouts.
void apply_preset_family(const std::string& name, LlamaConfig& c) {
  c.attention_bias = c.model_type == "qwen2";
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  for (const auto& m : kMoe)
    if (name == m.name) {
      c.n_experts = m.experts;
      c.experts_per_tok = m.per_tok;
      c.expert_intermediate_size = m.expert_size;
      c.norm_topk_prob = m.norm_topk;
    }
  if (c.model_type == "gemma3_text" || c.model_type == "gemma2") apply_gemma_preset(name, c);
  if (c.model_type == "gpt_oss") {  // windows of 128 on the even layers, MXFP4 experts as shipped
    apply_gpt_oss_layout(c);
    c.router_aux_loss_coef = 0;  // output_router_logits false, as the Hub's config.json
    c.sliding_window = 128;
    c.experts_stored = "mxfp4";
  }
  if (c.model_type == "phi3") {
    c.fused_qkv = c.fused_gate_up = true;
    if (name == "phi-3-mini-4k") c.sliding_window = 2047;
  }
}

}  // namespace

LlamaConfig preset_config(const std::string& name) {
  for (const auto& p : kPresets) {
    if (name != p.name) continue;
    LlamaConfig c;
    c.name = p.name;
    c.model_type = p.model_type;
    c.vocab_size = p.V;
    c.hidden_size = p.C;
    c.intermediate_size = p.F;
    c.n_layer = p.L;
    c.n_head = p.H;
    c.n_head_kv = p.KV;
    c.head_dim = p.head_dim;
    c.max_position_embeddings = p.max_pos;
    c.rms_norm_eps = p.eps;
    c.rope_theta = p.theta;
    apply_preset_rope(p, name, c);
    apply_preset_family(name, c);
    c.tie_word_embeddings = p.tie;
    c.bos_token_id = p.bos;
    c.eos_token_id = p.eos;
    c.torch_dtype = p.torch_dtype;
    c.validate(std::string("preset '") + p.name + "'");
    return c;
  }
  fail(ErrorKind::Config, "model preset '" + name + "'", "unknown preset",
       "did you mean '" + closest_name(preset_names(), name) + "'? presets: " + join_commas(preset_names()));
}

}  // namespace qlora
