// GGUF -> our Llama model: LlamaConfig from GGUF metadata, GGUF <-> HF tensor names, Q/K un-permute.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "model/llama_config.h"
#include "quant/quantize.h"

namespace qlora {

// Reads the decoder shape from `{arch}.*` and `tokenizer.ggml.*` metadata (arch: llama, qwen2,
// qwen3, gemma2, gemma3, phi3; mixtures of experts as llama with expert_count (Mixtral), qwen3moe
// and gpt-oss) and checks that every tensor the model needs is present with the
// expected shape. What llama.cpp fixes for an architecture instead of reading it (Gemma's attention
// scale and layer pattern, Gemma 3's local RoPE base, Gemma 2's default caps, gpt-oss's SwiGLU
// constants and layer pattern, YaRN's truncated ramp) becomes the config field transformers reads,
// so the model computes as llama.cpp runs the file. Errors: Unsupported (other architectures, experts
// outside llama/qwen3moe/gpt-oss or one tensor per expert, partial rotary outside phi3, YaRN keys
// beyond factor, original context and betas, rope factors that do not follow llama3 scaling), Format
// (missing keys, missing/misshaped tensors; `where` names key or tensor).
LlamaConfig gguf_llama_config(const GgufFile& f);

// "model.layers.3.self_attn.q_proj.weight" <-> "blk.3.attn_q.weight". "" when there is no counterpart
// (e.g. rope_freqs.weight, which holds llama3 rope factors and has no HF tensor).
std::string gguf_to_hf_name(const std::string& gguf_name);
// hf_to_gguf_name also names Phi-3's fused qkv_proj / gate_up_proj (blk.N.attn_qkv, blk.N.ffn_up), a
// mixture-of-experts router (blk.N.ffn_gate_inp) and the engine's expert stacks
// "model.layers.N.mlp.experts.<kind>" (blk.N.ffn_gate_exps, ffn_up_exps, ffn_down_exps), which
// gguf_to_hf_name does not read back.
std::string hf_to_gguf_name(const std::string& hf_name);
// The same for a tensor of the model `cfg` describes: Gemma's four norms per layer under llama.cpp's
// gemma2/gemma3 names (post_attention_norm, ffn_norm, post_ffw_norm), every other name as above.
std::string hf_to_gguf_name(const LlamaConfig& cfg, const std::string& hf_name);

// What llama.cpp's gemma2 and gemma3 fix instead of reading (its llama-model.cpp), for the reader
// (gguf_llama_config) and for the export's check that a model computes the same there:
// - which layers slide: every layer but each period-th (set_swa_pattern; period 0: all), the period
//   2 for gemma2 and 6 for gemma3 where the file names none;
// - the scores' scale, as transformers' query_pre_attn_scalar: the head dim, or hidden / heads for
//   the 27B sizes, told apart by their layer count (46 for gemma2, 62 for gemma3);
// - gemma3's sliding layers rotate at base 10000, unscaled, where the file names none.
int64_t llama_cpp_gemma_swa_period(bool gemma2);
bool llama_cpp_swa_layer(int64_t period, int64_t layer);
bool llama_cpp_gemma_27b(const LlamaConfig& c);
double llama_cpp_gemma_query_pre_attn_scalar(const LlamaConfig& c);
inline constexpr double kLlamaCppGemmaLocalRopeBase = 10000.0;
// Whether llama.cpp's Gemma layout stores this tensor as 1 + w (every norm, as convert_hf_to_gguf.py's
// Gemma2Model/Gemma3Model write them; the engine keeps w).
bool gguf_stores_unit_offset(const LlamaConfig& cfg, const std::string& hf_name);

// HF names of every base-model tensor for cfg, in HF state-dict order (lm_head only when untied).
std::vector<std::string> llama_hf_tensor_names(const LlamaConfig& cfg);

// llama.cpp's convert_hf_to_gguf.py (DecoderModel.permute) reorders the rows of q_proj/k_proj (weight
// and bias) of each head from HF's rotate_half layout to interleaved pairs:
//   gguf_row[h, 2*j + s] = hf_row[h, s*head_dim/2 + j]   (s in {0,1}, j < head_dim/2)
// Qwen2Model in the same converter does not permute. `rows` = n_head * head_dim rows of `cols` floats.
bool gguf_qk_permuted(const LlamaConfig& cfg);
void gguf_permute_qk_rows(const float* hf, float* gguf, int64_t n_head, int64_t rows, int64_t cols);    // as the converter
void gguf_unpermute_qk_rows(const float* gguf, float* hf, int64_t n_head, int64_t rows, int64_t cols);  // its inverse

// Whether the GGUF holds the tensor the model `cfg` calls `hf_name`. A mixture of experts' per-expert
// names (hf_expert_name) are slices of llama.cpp's 3-D stacks for all three functions below, and
// gpt-oss's fused gate_up_proj / down_proj (and biases) are put together from its stacks.
bool gguf_has_hf_tensor(const GgufFile& f, const LlamaConfig& cfg, const std::string& hf_name);
// HF shape of `hf_name` as stored in the GGUF (lm_head.weight of a tied model: the embedding's).
std::vector<int64_t> gguf_hf_shape(const GgufFile& f, const LlamaConfig& cfg, const std::string& hf_name);
// Dequantizes `hf_name` into dst (f32, HF layout, Q/K un-permuted for llama, Gemma's norms back to
// the checkpoint's w from the stored 1 + w). For tied models lm_head.weight reads the token
// embedding. Error(Format) for names with no GGUF tensor.
void gguf_read_hf_tensor(const GgufFile& f, const LlamaConfig& cfg, const std::string& hf_name, float* dst);
// gpt-oss's fused expert tensors (GptOssExperts: gate_up_proj (E, C, 2F) with gate's and up's
// outputs interleaved, down_proj (E, F, C), stored (experts, in, out); their biases (E, 2F)
// interleaved alike and (E, C)) and the stacks llama.cpp's gpt-oss keeps them in: ffn_gate_exps
// and ffn_up_exps (ne [C, F, E]), ffn_down_exps (ne [F, C, E]: each expert's transpose), their
// .bias (ne [F, E], [C, E]). One mapping for the reader and the export: part p's element (expert
// e, output o, input i) is the fused tensor's float at offset(p, e, o, i), and its row (e, o) the
// checkpoint's quantized (E * out, in) weight's row quantized_row(p, e, o).
struct GptOssFusedLayout {
  struct Part {
    std::string gguf;         // the stack's name
    std::vector<int64_t> ne;  // its ggml shape
    int64_t in = 0, out = 0;  // per expert: a weight's (out, in); a bias's out values (in 1)
  };
  bool gate_up = false, bias = false;
  int64_t experts = 0;
  std::vector<Part> parts;  // gate_up: gate's, then up's
  int64_t offset(size_t p, int64_t e, int64_t o, int64_t i) const;
  int64_t quantized_row(size_t p, int64_t e, int64_t o) const;
};
// The layout of `hf_name` ("model.layers.<l>.mlp.experts.gate_up_proj[_bias]" / "down_proj[_bias]"
// of a gpt_oss config); nullopt for any other tensor or model.
std::optional<GptOssFusedLayout> gpt_oss_fused_layout(const LlamaConfig& cfg, const std::string& hf_name);

// gpt-oss's fused expert weight `hf_name` (gate_up_proj / down_proj) as the file stores it, when its
// experts are MXFP4 (cfg.experts_stored "mxfp4", which gguf_llama_config sets when every stack is):
// the (E * out, in) weight of the checkpoint's blocks (gate's and up's rows interleaved), codes and
// scales moved from ggml's blocks bit for bit. False for any other tensor or file.
bool gguf_read_hf_quantized(const GgufFile& f, const LlamaConfig& cfg, const std::string& hf_name, int64_t rows,
                            int64_t cols, QuantizedTensor& q);
// Hands the mapped pages gguf_read_hf_tensor read for `hf_name` back to the OS (GgufFile::release_pages).
void gguf_release_hf_tensor(const GgufFile& f, const LlamaConfig& cfg, const std::string& hf_name);

}  // namespace qlora
