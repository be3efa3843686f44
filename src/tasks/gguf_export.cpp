// GGUF export: metadata and tensor layout of llama.cpp's convert_hf_to_gguf.py (DecoderModel with Mixtral's
// experts, Qwen2Model, Qwen3Model, Qwen3MoeModel, Phi3MiniModel, Gemma2Model, Gemma3Model, GptOssModel)
// and convert_lora_to_gguf.py, weights streamed one tensor at a time from MergedModel.
#include "tasks/gguf_export.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "core/error.h"
#include "core/strings.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "io/json_util.h"
#include "model/experts.h"
#include "model/gguf_arch.h"
#include "model/gguf_model.h"
#include "model/lora.h"
#include "model/merge.h"
#include "text/gguf_vocab_export.h"
#include "train/model_source.h"

namespace fs = std::filesystem;

namespace qlora {

namespace {

struct OutType {
  const char* name;
  GgmlType type;
  uint32_t file_type;  // general.file_type (llama_ftype)
};
const OutType kOutTypes[] = {{"f32", GgmlType::F32, 0},
                             {"f16", GgmlType::F16, 1},
                             {"bf16", GgmlType::BF16, 32},
                             {"q8_0", GgmlType::Q8_0, 7},
                             {"q4_0", GgmlType::Q4_0, 2}};

const OutType& find_outtype(const std::string& name, const std::string& format) {
  const bool lora = format == "gguf-lora";
  std::string allowed;
  for (const auto& o : kOutTypes) {
    if (lora && std::string(o.name) == "q4_0") continue;  // convert_lora_to_gguf.py: f32 f16 bf16 q8_0
    allowed += std::string(allowed.empty() ? "" : ", ") + o.name;
    if (name == o.name) return o;
  }
  fail(ErrorKind::Config, "--outtype", "unsupported outtype '" + name + "' for --format " + format,
       "allowed: " + allowed);
}

const char* const kConvertHint =
    "merge with `qlora merge` and convert the merged Hugging Face model with llama.cpp's convert_hf_to_gguf.py";

// What llama.cpp's gemma2 and gemma3 architectures fix instead of reading (its llama-model.cpp):
// the attention scale, query_pre_attn_scalar^-1/2 with the scalar = head_dim, or hidden/heads for
// the 27B sizes, which it tells apart by their layer count (46 for Gemma 2, 62 for Gemma 3); which
// layers slide (gemma2: every other from the first; gemma3: five of every six); the sliding layers'
// RoPE base (Gemma 3: 10000, unscaled); Gemma 2's soft-capping is always on (50 and 30 when the file
// names none). A checkpoint that differs would compute differently there, so it is refused.
void check_gemma_for_llama_cpp(const LlamaConfig& c) {
  const bool g2 = c.model_type == "gemma2";
  const std::string arch = g2 ? "gemma2" : "gemma3";
  auto refuse = [&](const std::string& key, const std::string& why) {
    fail(ErrorKind::Unsupported, "model_type '" + c.model_type + "', " + key, why + ", so this model would compute differently there",
         kConvertHint);
  };
  const bool is_27b = llama_cpp_gemma_27b(c);
  const double scalar = llama_cpp_gemma_query_pre_attn_scalar(c);
  if (c.query_pre_attn_scalar != scalar)
    refuse("query_pre_attn_scalar " + json(c.query_pre_attn_scalar).dump(),
           "llama.cpp's " + arch + " scales scores by " + (is_27b ? "(hidden_size / heads)" : "head_dim") + "^-1/2 = " +
               json(scalar).dump() + "^-1/2 for " + std::to_string(c.n_layer) + " layers");
  if (c.sliding_window <= 0) refuse("sliding_window", "llama.cpp's " + arch + " has sliding-window layers and this model none");
  for (int64_t l = 0; l < c.n_layer; l++) {
    const bool slides = llama_cpp_swa_layer(llama_cpp_gemma_swa_period(g2), l);
    if ((c.window_of(l) > 0) != slides)
      refuse("layer_types", "layer " + std::to_string(l) + (slides ? " attends to every earlier key" : " slides") +
                                ", where llama.cpp's " + arch + " has " +
                                (g2 ? "every other layer sliding, from the first" : "five of every six layers sliding"));
  }
  if (g2 && (c.attn_logit_softcapping <= 0 || c.final_logit_softcapping <= 0))
    refuse("attn_logit_softcapping / final_logit_softcapping", "llama.cpp's gemma2 always soft-caps scores and logits");
  if (!g2 && (c.attn_logit_softcapping > 0 || c.final_logit_softcapping > 0))
    refuse("attn_logit_softcapping / final_logit_softcapping", "llama.cpp's gemma3 has no soft-capping");
  if (!g2 && c.rope_local_theta != kLlamaCppGemmaLocalRopeBase)
    refuse("rope_local_base_freq " + json(c.rope_local_theta).dump(), "llama.cpp's gemma3 rotates its sliding layers at base 10000");
  if (c.rope_scaling.type != "none" && c.rope_scaling.type != "linear")
    refuse("rope_scaling", "llama.cpp's " + arch + " takes linear RoPE scaling only");
}

// YaRN as llama.cpp runs it (ggml's rope): the magnitude scale 0.1 ln(factor) + 1, which is
// transformers' attention_factor where the config names none; another one would need
// rope.scaling.yarn_attn_factor, whose meaning there was not checked here.
void check_yarn_for_llama_cpp(const LlamaConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  if (r.type == "yarn" && !yarn_attention_factor_is_derived(r))
    fail(ErrorKind::Unsupported, "rope_scaling.attention_factor " + json(r.attention_factor).dump(),
         "llama.cpp scales YaRN's cos and sin by 0.1 ln(factor) + 1 = " + json(yarn_mscale(r.factor, 1.0)).dump() +
             "; this model would compute differently there",
         "keep the merged Hugging Face model (`qlora merge`) for this model");
}

// What llama.cpp's gpt-oss architecture fixes instead of reading (its llama-model.cpp and
// build_moe_ffn): biases on q/k/v/o, the clamped SwiGLU's alpha 1.702 and limit 7, the window on the
// even layers (swa pattern 2) and none on the others.
void check_gpt_oss_for_llama_cpp(const LlamaConfig& c) {
  auto refuse = [&](const std::string& key, const std::string& why) {
    fail(ErrorKind::Unsupported, key, why + "; this model would compute differently there",
         "keep the merged Hugging Face model (`qlora merge`) for this model");
  };
  if (!c.attention_bias || !c.o_proj_bias) refuse("attention_bias", "llama.cpp's gpt-oss has biases on q, k, v and o");
  if (c.swiglu_clamp.alpha != 1.702f || c.swiglu_clamp.limit != 7.0f)
    refuse("swiglu_alpha / swiglu_limit " + float_decimal(c.swiglu_clamp.alpha) + " / " + float_decimal(c.swiglu_clamp.limit),
           "llama.cpp's gpt-oss clamps its SwiGLU with alpha 1.702 and limit 7");
  if (c.expert_intermediate_size != c.intermediate_size)
    refuse("intermediate_size", "llama.cpp's gpt-oss experts are the intermediate size wide");
  if (c.sliding_window <= 0) refuse("sliding_window", "llama.cpp's gpt-oss slides on the even layers");
  for (int64_t l = 0; l < c.n_layer; l++)
    if ((c.window_of(l) > 0) != (l % 2 == 0))
      refuse("layer_types", "layer " + std::to_string(l) + (l % 2 == 0 ? " attends to every earlier key" : " slides") +
                                ", where llama.cpp's gpt-oss slides on the even layers only");
}

// llama.cpp's architecture for the model: Mistral and Mixtral are written as llama (convert_hf_to_gguf.py
// does too), Qwen3-MoE as qwen3moe, Gemma 3's text model as gemma3.
std::string gguf_arch(const LlamaConfig& c) {
  const GgufArch* a = gguf_arch_to_write(c.model_type);
  if (!a)
    fail(ErrorKind::Unsupported, "model_type '" + c.model_type + "'", "GGUF export of this model type is not implemented",
         kConvertHint);
  const std::string arch = a->arch;
  if (c.model_type == "gpt_oss") {
    check_gpt_oss_for_llama_cpp(c);
    return arch;
  }
  if (!c.multimodal.empty() && c.multimodal != "gemma3")
    fail(ErrorKind::Unsupported, "model_type '" + c.multimodal + "' (multimodal)",
         "GGUF export of this multimodal checkpoint is not implemented", kConvertHint);
  // A multimodal Gemma 3 (Gemma3ForConditionalGeneration) is written as its text model, as
  // convert_hf_to_gguf.py does; llama.cpp reads the tower from a second (--mmproj) file.
  if (arch == "gemma2" || arch == "gemma3") {
    check_gemma_for_llama_cpp(c);
    return arch;
  }
  // llama.cpp's llama and qwen3moe graphs renormalise the chosen experts' weights (build_moe_ffn's
  // norm_w is fixed to true there), which transformers does only with norm_topk_prob.
  if (c.moe() && !c.norm_topk_prob)
    fail(ErrorKind::Unsupported, "norm_topk_prob",
         "llama.cpp's " + arch +
             " architecture always renormalises the chosen experts' weights; this model (norm_topk_prob false) "
             "would compute differently there",
         "keep the merged Hugging Face model (`qlora merge`) for this model");
  const bool phi3 = arch == "phi3";  // Phi3MiniModel: LongRoPE and partial rotary are its own
  if (!phi3 && (c.rope_scaling.type == "longrope" || c.rotary_dim != 0))
    fail(ErrorKind::Unsupported, "rope_scaling",
         "GGUF export of LongRoPE or a partial rotary embedding on " + c.model_type + " is not implemented",
         "merge with `qlora merge` and convert the merged Hugging Face model with llama.cpp's convert_hf_to_gguf.py");
  if (phi3 && c.rope_scaling.type == "yarn")
    fail(ErrorKind::Unsupported, "rope_scaling", "GGUF export of YaRN on phi3 is not implemented", kConvertHint);
  return arch;
}

// ---- llama3 rope factors (convert_hf_to_gguf.py DecoderModel.generate_extra_tensors, in float32) --

std::vector<float> llama3_rope_factors(const LlamaConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  const int64_t dim = c.head_dim;
  const float base = float(c.rope_theta), factor = float(rs.factor);
  const float lo = float(rs.low_freq_factor), hi = float(rs.high_freq_factor);
  const float old_ctx = float(rs.original_max_position_embeddings);
  const double low_wavelen = double(rs.original_max_position_embeddings) / rs.low_freq_factor;
  const double high_wavelen = double(rs.original_max_position_embeddings) / rs.high_freq_factor;
  std::vector<float> out;
  for (int64_t i = 0; i < dim; i += 2) {
    const float freq = 1.0f / std::pow(base, float(i) / float(dim));
    const float wavelen = float(2.0 * M_PI) / freq;
    if (double(wavelen) < high_wavelen) out.push_back(1.0f);
    else if (double(wavelen) > low_wavelen) out.push_back(factor);
    else {
      const float smooth = (old_ctx / wavelen - lo) / (hi - lo);
      out.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
    }
  }
  return out;
}

// ---- progress-aware tensor writing -------------------------------------------------------------

struct Planned {
  std::string gguf_name;
  std::function<void(std::vector<float>&)> values;  // fills the f32 values in GGUF row order
  std::function<void(std::vector<uint8_t>&)> bytes = {};  // or the stored bytes themselves (values unset)
};

uint64_t write_all(GgufWriter& w, const std::vector<Planned>& plan, const std::string& out,
                   const GgufExportProgress& progress) {
  const uint64_t total = w.file_size();
  w.begin(out);
  std::vector<float> buf;
  std::vector<uint8_t> raw;
  for (size_t i = 0; i < plan.size(); i++) {
    if (plan[i].bytes) {
      plan[i].bytes(raw);
      w.write_tensor(raw.data(), raw.size());
    } else {
      plan[i].values(buf);
      w.write_tensor_f32(buf.data(), int64_t(buf.size()));
    }
    if (progress) progress(i + 1, plan.size(), plan[i].gguf_name, w.bytes_written(), total);
  }
  w.commit();
  return total;
}

// Storage type of a 2-D weight `gguf_name` with rows of ne0 values, and a note when it differs.
GgmlType weight_type(const OutType& ot, const std::string& gguf_name, int64_t ne0, bool is_output,
                     std::vector<std::string>& notes) {
  GgmlType t = ot.type;
  if (t == GgmlType::Q4_0 && is_output) {
    t = GgmlType::Q8_0;  // llama-quantize keeps the output projection at higher precision (Q6_K there)
    notes.push_back(gguf_name + ": Q8_0 (the output projection is kept at higher precision in q4_0 files)");
  }
  const int64_t bs = ggml_type_traits(t).block_size;
  if (ne0 % bs != 0) {
    notes.push_back(gguf_name + ": F16 instead of " + ggml_type_name(t) + " (row of " + std::to_string(ne0) +
                    " values is not a multiple of the block size " + std::to_string(bs) +
                    "; convert_hf_to_gguf.py falls back the same way)");
    t = GgmlType::F16;
  }
  return t;
}

std::string default_name(const GgufExportOptions& o, const GgufFile* base) {
  if (!o.name.empty()) return o.name;
  if (base && base->has("general.name") && base->type_of("general.name") == GgufType::STRING)
    return base->get_string("general.name");
  fs::path p(o.model);
  if (p.filename().empty()) p = p.parent_path();
  return p.stem().string();
}

void set_model_metadata(GgufWriter& w, const LlamaConfig& c, const OutType& ot, const std::string& name,
                        const GgufFile* base) {
  const std::string a = gguf_arch(c);
  w.set("general.architecture", gguf_str(a));
  w.set("general.type", gguf_str("model"));
  w.set("general.name", gguf_str(name));
  w.set(a + ".block_count", gguf_u32(uint32_t(c.n_layer)));
  w.set(a + ".context_length", gguf_u32(uint32_t(c.max_position_embeddings)));
  w.set(a + ".embedding_length", gguf_u32(uint32_t(c.hidden_size)));
  w.set(a + ".feed_forward_length", gguf_u32(uint32_t(c.intermediate_size)));
  w.set(a + ".attention.head_count", gguf_u32(uint32_t(c.n_head)));
  w.set(a + ".attention.head_count_kv", gguf_u32(uint32_t(c.n_head_kv)));
  w.set(a + ".rope.freq_base", gguf_f32(float(c.rope_theta)));
  w.set(a + ".attention.layer_norm_rms_epsilon", gguf_f32(float(c.rms_norm_eps)));
  const bool gemma = a == "gemma2" || a == "gemma3";
  const bool explicit_hd = gemma || c.head_dim != c.hidden_size / c.n_head ||
                           (base && base->has(a + ".attention.key_length"));
  if (explicit_hd || a == "gpt-oss") {  // GptOssModel: head_dim is in every config
    w.set(a + ".attention.key_length", gguf_u32(uint32_t(c.head_dim)));
    w.set(a + ".attention.value_length", gguf_u32(uint32_t(c.head_dim)));
  }
  if (c.rope_scaling.type == "linear") {
    w.set(a + ".rope.scaling.type", gguf_str("linear"));
    w.set(a + ".rope.scaling.factor", gguf_f32(float(c.rope_scaling.factor)));
  }
  if (c.rope_scaling.type == "yarn") {  // TextModel.set_gguf_parameters (check_yarn_for_llama_cpp took the scale)
    check_yarn_for_llama_cpp(c);
    const RopeScaling& rs = c.rope_scaling;
    w.set(a + ".rope.scaling.type", gguf_str("yarn"));
    w.set(a + ".rope.scaling.factor", gguf_f32(float(rs.factor)));
    w.set(a + ".rope.scaling.original_context_length", gguf_u32(uint32_t(rs.original_max_position_embeddings)));
    w.set(a + ".rope.scaling.yarn_beta_fast", gguf_f32(float(rs.beta_fast)));
    w.set(a + ".rope.scaling.yarn_beta_slow", gguf_f32(float(rs.beta_slow)));
  }
  if (a == "gpt-oss") w.set(a + ".attention.sliding_window", gguf_u32(uint32_t(c.sliding_window)));  // GptOssModel
  if (a == "phi3") {  // Phi3MiniModel.set_gguf_parameters and generate_extra_tensors' attn_factor
    const RopeScaling& rs = c.rope_scaling;
    w.set(a + ".rope.scaling.original_context_length",
          gguf_u32(uint32_t(rs.type == "longrope" ? rs.original_max_position_embeddings : c.max_position_embeddings)));
    w.set(a + ".attention.sliding_window", gguf_u32(uint32_t(c.sliding_window)));  // 0: none
    if (rs.type == "longrope") w.set(a + ".rope.scaling.attn_factor", gguf_f32(float(rs.attention_factor)));
  }
  if (gemma) {  // Gemma2Model / Gemma3Model.set_gguf_parameters (check_gemma_for_llama_cpp took the rest)
    w.set(a + ".attention.sliding_window", gguf_u32(uint32_t(c.sliding_window)));
    if (a == "gemma2") {
      w.set(a + ".attn_logit_softcapping", gguf_f32(float(c.attn_logit_softcapping)));
      w.set(a + ".final_logit_softcapping", gguf_f32(float(c.final_logit_softcapping)));
    }
  }
  if (c.moe()) {  // TextModel.set_gguf_parameters; Qwen2MoeModel adds the experts' own width
    w.set(a + ".expert_count", gguf_u32(uint32_t(c.n_experts)));
    w.set(a + ".expert_used_count", gguf_u32(uint32_t(c.experts_per_tok)));
    if (a != "llama") w.set(a + ".expert_feed_forward_length", gguf_u32(uint32_t(c.expert_intermediate_size)));
  }
  w.set("general.file_type", gguf_u32(ot.file_type));
  if (a == "llama") w.set(a + ".vocab_size", gguf_u32(uint32_t(c.vocab_size)));
  w.set(a + ".rope.dimension_count", gguf_u32(uint32_t(c.rope_dim())));
  w.set("general.quantization_version", gguf_u32(2));
}

void check_out_path(const std::string& out) {
  if (out.empty()) fail(ErrorKind::Config, "--out", "no output file given", "pass --out FILE.gguf");
  if (fs::is_directory(out)) fail(ErrorKind::Config, out, "is a directory", "pass a file name such as " + out + "/model.gguf");
  const fs::path parent = fs::path(out).parent_path();
  if (!parent.empty() && !fs::is_directory(parent))
    fail(ErrorKind::Io, out, "the output directory " + parent.string() + " does not exist");
}

PeftAdapter open_adapter(const std::string& dir, const LlamaConfig& cfg) {
  if (!fs::is_directory(dir))
    fail(ErrorKind::Io, dir, "adapter directory does not exist",
         "pass a directory with adapter_config.json and adapter_model.safetensors (a run's output_dir)");
  return open_peft_adapter(dir, cfg);
}

// Whether gpt-oss's fused stack `hf` is written as the checkpoint ships it: MXFP4 experts the adapter
// leaves alone, rows of whole blocks (convert_hf_to_gguf.py copies such blocks too). Experts the
// adapter changes are written as floats in the outtype, with a note.
bool mxfp4_as_shipped(const MergedModel& m, const std::string& hf, int64_t row, std::vector<std::string>& notes) {
  const auto& q = m.base_expert_quant();
  if (!q || q->format != QuantFormat::MXFP4 || row % 32 != 0) return false;
  const bool kept = !m.merged(hf);
  const std::string note = kept ? "the experts are written in MXFP4 as the base holds them (ggml's MXFP4 blocks)"
                                : "the experts the adapter changes are written in the outtype, not the base's MXFP4";
  if (std::find(notes.begin(), notes.end(), note) == notes.end()) notes.push_back(note);
  return kept;
}

// gpt-oss's router and fused experts as llama.cpp's gpt-oss holds them (GptOssModel): the router as
// ffn_gate_inp in f32; each fused expert tensor as its stacks (gpt_oss_fused_layout: gate_up_proj's
// interleaved outputs as ffn_gate_exps and ffn_up_exps, down_proj transposed per expert as
// ffn_down_exps, the biases as the stacks' .bias in f32), a weight in MXFP4 from the base's own
// blocks where mxfp4_as_shipped says so. False for any other tensor.
bool plan_gpt_oss_tensor(GgufWriter& w, const std::shared_ptr<MergedModel>& m, const OutType& ot, const std::string& hf,
                         std::vector<Planned>& plan, std::vector<std::string>& notes) {
  const LlamaConfig& c = m->config();
  const std::string g = hf_to_gguf_name(c, hf);
  if (g.ends_with("ffn_gate_inp.weight")) {  // llama.cpp never quantizes the router
    w.add_tensor(g, {c.hidden_size, c.n_experts}, GgmlType::F32);
    plan.push_back({g, [m, hf](std::vector<float>& v) { v = m->read(hf); }});
    return true;
  }
  const auto layout = gpt_oss_fused_layout(c, hf);
  if (!layout) return false;
  const bool as_shipped = !layout->bias && mxfp4_as_shipped(*m, hf, layout->parts[0].in, notes);
  for (size_t p = 0; p < layout->parts.size(); p++) {
    const GptOssFusedLayout::Part& part = layout->parts[p];
    const GptOssFusedLayout l = *layout;
    if (as_shipped) {  // the checkpoint's rows of the stack, as ggml's MXFP4 blocks
      w.add_tensor(part.gguf, part.ne, GgmlType::MXFP4);
      const int64_t rows = l.experts * part.out * int64_t(l.parts.size());
      plan.push_back({part.gguf, {}, [m, hf, l, p, rows](std::vector<uint8_t>& b) {
                        const QuantizedTensor q = *m->stored_quantized(hf, rows, l.parts[p].in);
                        const int64_t in = q.cols, row_bytes = ggml_row_bytes(GgmlType::MXFP4, in);
                        b.resize(size_t(l.experts * l.parts[p].out * row_bytes));
                        for (int64_t e = 0; e < l.experts; e++)
                          for (int64_t o = 0; o < l.parts[p].out; o++) {
                            const int64_t r = l.quantized_row(p, e, o);
                            mxfp4_to_ggml(q.data.data() + r * in / 2, q.scales.data() + r * in / 32, in,
                                          b.data() + (e * l.parts[p].out + o) * row_bytes);
                          }
                      }});
      continue;
    }
    w.add_tensor(part.gguf, part.ne, l.bias ? GgmlType::F32 : weight_type(ot, part.gguf, part.in, false, notes));
    plan.push_back({part.gguf, [m, hf, l, p](std::vector<float>& v) {
                      const std::vector<float> fused = m->read(hf);
                      const GptOssFusedLayout::Part& pt = l.parts[p];
                      v.resize(size_t(l.experts * pt.out * pt.in));
                      for (int64_t e = 0; e < l.experts; e++)
                        for (int64_t o = 0; o < pt.out; o++)
                          for (int64_t i = 0; i < pt.in; i++) v[size_t((e * pt.out + o) * pt.in + i)] = fused[size_t(l.offset(p, e, o, i))];
                    }});
  }
  return true;
}

bool permuted_qk(const LlamaConfig& c, const std::string& hf_name, int64_t& n_head) {
  n_head = 0;
  if (!gguf_qk_permuted(c)) return false;
  if (hf_name.find(".self_attn.q_proj.") != std::string::npos) n_head = c.n_head;
  if (hf_name.find(".self_attn.k_proj.") != std::string::npos) n_head = c.n_head_kv;
  return n_head != 0;
}

// Everything a base GGUF says but its alignment, file type and quantization version (the export
// sets those).
void copy_base_metadata(GgufWriter& w, const GgufFile& base, std::vector<std::string>& notes) {
  for (const auto& k : base.keys())
    if (k != "general.alignment" && k != "general.file_type" && k != "general.quantization_version")
      w.set(k, base.get(k));
  if (w.has("tokenizer.ggml.model") && base.get_string("tokenizer.ggml.model") == "gpt2" &&
      !w.has("tokenizer.ggml.merges")) {
    // llama.cpp refuses a gpt2 vocabulary without a merges key; an empty list means "no merges".
    w.set("tokenizer.ggml.merges", gguf_str_array({}));
    notes.push_back("tokenizer.ggml.merges: the base has none; an empty list is written (llama.cpp needs the key)");
  }
}

// Notes on what llama.cpp leaves out of the model or runs otherwise than it was trained.
void note_llama_cpp_differences(const LlamaConfig& c, std::vector<std::string>& notes) {
  if (c.multimodal == "gemma3")
    notes.push_back("the text model of a multimodal Gemma 3: its vision tower and projector are not written "
                    "(llama.cpp reads them from the file convert_hf_to_gguf.py --mmproj writes)");
  if (c.model_type == "phi3" && c.sliding_window > 0)
    notes.push_back("phi3.attention.sliding_window " + std::to_string(c.sliding_window) +
                    ": llama.cpp runs Phi-3's sliding window as full attention (it disables Phi SWA), so "
                    "sequences longer than the window differ from the trained model");
  else if (c.sliding_window > 0 && !c.sandwich_norms && c.model_type != "gpt_oss")  // convert_hf_to_gguf.py writes no window for these architectures either
    notes.push_back("sliding window " + std::to_string(c.sliding_window) + ": llama.cpp's " + gguf_arch(c) +
                    " architecture has none and runs full attention, so sequences longer than the window "
                    "differ from the trained model");
  if (c.rope_scaling.type == "yarn" && !c.rope_scaling.truncate)
    notes.push_back("rope_scaling.truncate false: llama.cpp floors and ceils the ends of YaRN's ramp (as transformers "
                    "does with truncate true), so the rotary frequencies in that ramp differ from the trained model's");
}

// The RoPE factor tensors, f32: llama3's rope_freqs, Phi-3's long and short LongRoPE factors.
void plan_rope_factors(GgufWriter& w, const LlamaConfig& c, GgufFile* base, std::vector<Planned>& plan) {
  // llama3 rope factors: the base GGUF's tensor as it is, else computed as the converter does.
  if (base && base->has_tensor("rope_freqs.weight")) {
    w.add_tensor("rope_freqs.weight", base->tensor("rope_freqs.weight").ne, GgmlType::F32);
    plan.push_back(
        {"rope_freqs.weight", [base](std::vector<float>& v) { v = base->read_tensor_f32("rope_freqs.weight"); }});
  } else if (c.rope_scaling.type == "llama3") {
    const std::vector<float> f = llama3_rope_factors(c);
    w.add_tensor("rope_freqs.weight", {int64_t(f.size())}, GgmlType::F32);
    plan.push_back({"rope_freqs.weight", [f](std::vector<float>& v) { v = f; }});
  } else if (c.rope_scaling.type == "longrope") {  // Phi-3: the long and short factors, f32
    for (const auto& [name, factors] : {std::pair<std::string, std::vector<double>>{"rope_factors_long.weight", c.rope_scaling.long_factor},
                                        {"rope_factors_short.weight", c.rope_scaling.short_factor}}) {
      const std::vector<float> f(factors.begin(), factors.end());
      w.add_tensor(name, {int64_t(f.size())}, GgmlType::F32);
      plan.push_back({name, [f](std::vector<float>& v) { v = f; }});
    }
  }
}

// Layer l's router `hf`, then its three expert stacks (llama.cpp's ffn_{gate,up,down}_exps, ne
// [in, out, n_experts]), each filled from the layer's per-expert tensors.
void plan_moe_layer(GgufWriter& w, const std::shared_ptr<MergedModel>& m, const OutType& ot, const std::string& hf,
                    int64_t l, std::vector<Planned>& plan, std::vector<std::string>& notes) {
  const LlamaConfig& c = m->config();
  const std::string router = hf_to_gguf_name(hf);  // kept f32: llama.cpp never quantizes ffn_gate_inp
  w.add_tensor(router, {c.hidden_size, c.n_experts}, GgmlType::F32);
  plan.push_back({router, [m, hf](std::vector<float>& v) { v = m->read(hf); }});
  for (const std::string& kind : expert_kinds()) {
    const std::string g = hf_to_gguf_name("model.layers." + std::to_string(l) + ".mlp.experts." + kind);
    const auto [out, in] = expert_shape(c, kind);
    w.add_tensor(g, {in, out, c.n_experts}, weight_type(ot, g, in, false, notes));
    plan.push_back({g, [m, c, l, kind, out, in](std::vector<float>& v) {
                      v.resize(size_t(c.n_experts * out * in));
                      for (int64_t e = 0; e < c.n_experts; e++)
                        m->read(hf_expert_name(c, l, e, kind), v.data() + e * out * in);
                    }});
  }
}

// Any other tensor `hf` under its GGUF name: a 2-D weight in the outtype (weight_type), the rest
// (norms, biases, 1-D tensors) f32.
void plan_tensor(GgufWriter& w, const std::shared_ptr<MergedModel>& m, const OutType& ot, const std::string& hf,
                 std::vector<Planned>& plan, std::vector<std::string>& notes) {
  const LlamaConfig& c = m->config();
  const std::string g = hf_to_gguf_name(c, hf);
  if (g.empty()) fail(ErrorKind::Internal, hf, "no GGUF name");
  const std::vector<int64_t> shape = m->shape(hf);
  std::vector<int64_t> ne(shape.rbegin(), shape.rend());
  GgmlType t = GgmlType::F32;
  const bool norm = g.size() > 12 && g.compare(g.size() - 12, 12, "_norm.weight") == 0;
  const bool is_weight = g.size() > 7 && g.compare(g.size() - 7, 7, ".weight") == 0;
  if (shape.size() >= 2 && !norm && is_weight) {
    const bool is_output = g == "output.weight" || (g == "token_embd.weight" && c.tie_word_embeddings);
    t = weight_type(ot, g, ne[0], is_output, notes);
  }
  w.add_tensor(g, ne, t);
  // Gemma's norms multiply by (1 + w); llama.cpp's by the stored weight, so the file holds 1 + w
  // (Gemma2Model/Gemma3Model.modify_tensors).
  const bool unit_offset = gguf_stores_unit_offset(c, hf);
  plan.push_back({g, [m, hf, shape, c, unit_offset](std::vector<float>& v) {
                    int64_t n = 1;
                    for (int64_t d : shape) n *= d;
                    v.resize(size_t(n));
                    int64_t n_head = 0;
                    if (!permuted_qk(c, hf, n_head)) {
                      m->read(hf, v.data());
                      if (unit_offset)
                        for (float& x : v) x += 1.0f;
                      return;
                    }
                    std::vector<float> tmp(v.size());
                    m->read(hf, tmp.data());
                    const int64_t rows = shape[0], cols = shape.size() == 2 ? shape[1] : 1;
                    gguf_permute_qk_rows(tmp.data(), v.data(), n_head, rows, cols);
                  }});
}

// The merged model's tensors in its order, as llama.cpp's architecture holds them.
void plan_model_tensors(GgufWriter& w, const std::shared_ptr<MergedModel>& merged, const OutType& ot,
                        std::vector<Planned>& plan, std::vector<std::string>& notes) {
  const LlamaConfig& c = merged->config();
  // A mixture-of-experts layer: its router where the checkpoint lists it, then the three expert
  // stacks (llama.cpp's ffn_{gate,up,down}_exps, ne [in, out, n_experts]) in place of the per-expert
  // tensors.
  std::map<std::string, int64_t> router_layer;
  for (int64_t l = 0; c.moe() && l < c.n_layer; l++) router_layer[hf_router_name(c, l)] = l;
  for (const std::string& hf : merged->names()) {
    if (c.model_type == "gpt_oss" && plan_gpt_oss_tensor(w, merged, ot, hf, plan, notes)) continue;
    if (hf_expert_of(c, hf)) continue;  // an expert: in its stack
    const auto rl = router_layer.find(hf);
    if (rl != router_layer.end()) plan_moe_layer(w, merged, ot, hf, rl->second, plan, notes);
    else plan_tensor(w, merged, ot, hf, plan, notes);
  }
}

GgufExportResult export_merged(const GgufExportOptions& o, const OutType& ot, const GgufExportProgress& progress) {
  ModelSource src = open_model_source(o.model);
  gguf_arch(src.config);  // a family without a GGUF layout here is refused before anything else
  std::unique_ptr<GgufFile> base;
  if (src.format == "gguf") base = std::make_unique<GgufFile>(o.model);
  std::optional<PeftAdapter> ad;
  if (!o.adapter.empty()) ad = open_adapter(o.adapter, src.config);
  auto merged = std::make_shared<MergedModel>(src.config, src.tensors, std::move(ad));
  const LlamaConfig& c = merged->config();

  GgufWriter w;
  GgufExportResult res;
  // Everything the base says, then ours on top (same keys replaced in place).
  if (base) copy_base_metadata(w, *base, res.notes);
  set_model_metadata(w, c, ot, default_name(o, base.get()), base.get());
  note_llama_cpp_differences(c, res.notes);
  if (!base) {
    if (src.format != "hf" || !fs::exists(o.model + "/tokenizer.json"))
      fail(ErrorKind::Config, o.model, "no tokenizer.json: a GGUF for llama.cpp needs the model's vocabulary",
           "add the base model's tokenizer.json (and tokenizer_config.json) to the directory");
    hf_tokenizer_gguf_metadata(o.model, c.vocab_size, w, &res.notes);
  }

  std::vector<Planned> plan;
  plan_rope_factors(w, c, base.get(), plan);
  plan_model_tensors(w, merged, ot, plan, res.notes);
  res.bytes = write_all(w, plan, o.out, progress);
  res.n_tensors = plan.size();
  return res;
}

GgufExportResult export_lora(const GgufExportOptions& o, const OutType& ot, const GgufExportProgress& progress) {
  const bool is_gguf = o.model.size() > 5 && o.model.compare(o.model.size() - 5, 5, ".gguf") == 0;
  if (!is_gguf || fs::is_directory(o.model))
    fail(ErrorKind::Config, o.model, "--format gguf-lora needs a GGUF base (llama.cpp applies the adapter to that file)",
         "export the merged model instead: qlora export --format gguf --model " + o.model + " --adapter DIR --out FILE.gguf");
  if (o.adapter.empty())
    fail(ErrorKind::Config, "--adapter", "--format gguf-lora exports an adapter: pass --adapter DIR");
  ModelSource src = open_model_source(o.model);
  GgufFile base(o.model);
  const LlamaConfig& c = src.config;
  const PeftAdapter ad = open_adapter(o.adapter, c);
  const int64_t r = ad.spec.r;
  if (!ad.spec.expert_targets.empty())
    fail(ErrorKind::Unsupported, o.adapter + ": key 'target_parameters'",
         "--format gguf-lora does not write LoRA on stacked experts",
         "export the merged model: qlora export --format gguf --model BASE --adapter " + o.adapter);

  GgufWriter w;
  GgufExportResult res;
  const std::string a = gguf_arch(c);
  w.set("general.architecture", gguf_str(a));
  w.set("general.type", gguf_str("adapter"));
  w.set("general.name", gguf_str(o.name.empty() ? fs::path(o.adapter).filename().string() : o.name));
  w.set("general.file_type", gguf_u32(ot.file_type));
  // llama.cpp scales by alpha / rank (rank = lora_b's ne[0]); alpha = scale * r keeps PEFT's scale,
  // rsLoRA's alpha / sqrt(r) included.
  w.set("adapter.type", gguf_str("lora"));
  w.set("adapter.lora.alpha", gguf_f32(float(double(ad.spec.scale()) * double(r))));
  w.set("general.quantization_version", gguf_u32(2));

  std::vector<Planned> plan;
  auto weights = ad.weights;
  for (int64_t l = 0; l < c.n_layer; l++)
    for (const std::string& hf : llama_hf_tensor_names(c)) {
      const std::string mod = lora_module_of(hf);
      if (mod.empty() || mod.rfind("layers." + std::to_string(l) + ".", 0) != 0) continue;
      const std::string proj = mod.substr(mod.rfind('.') + 1);
      if (std::find(ad.spec.targets.begin(), ad.spec.targets.end(), proj) == ad.spec.targets.end()) continue;
      const std::string key = peft_module_name(c, l, proj);
      const std::string g = hf_to_gguf_name(hf);
      const std::vector<int64_t> shape = llama_hf_tensor_shape(c, hf);  // (out, in)
      const int64_t out = shape[0], in = shape[1];
      // lora_a: (r, in) -> ne [in, r]; lora_b: (out, r) -> ne [r, out], rows permuted like the base's.
      w.add_tensor(g + ".lora_a", {in, r}, weight_type(ot, g + ".lora_a", in, false, res.notes));
      w.add_tensor(g + ".lora_b", {r, out}, weight_type(ot, g + ".lora_b", r, false, res.notes));
      plan.push_back({g + ".lora_a", [weights, key, r, in](std::vector<float>& v) {
                        v = weights->read_f32(key + ".lora_A.weight", {r, in});
                      }});
      plan.push_back({g + ".lora_b", [weights, key, r, out, c, hf](std::vector<float>& v) {
                        std::vector<float> b = weights->read_f32(key + ".lora_B.weight", {out, r});
                        int64_t n_head = 0;
                        if (!permuted_qk(c, hf, n_head)) return void(v = std::move(b));
                        v.resize(b.size());
                        gguf_permute_qk_rows(b.data(), v.data(), n_head, out, r);
                      }});
    }
  (void)base;
  res.bytes = write_all(w, plan, o.out, progress);
  res.n_tensors = plan.size();
  return res;
}

}  // namespace

std::string default_export_outtype(const std::string& format) { return format == "gguf-lora" ? "f32" : "f16"; }

void hf_tokenizer_gguf_metadata(const std::string& dir, int64_t vocab_size, GgufWriter& w,
                                std::vector<std::string>* notes) {
  write_gguf_vocab(dir, vocab_size, w, notes);
}

GgufExportResult export_gguf(const GgufExportOptions& o, const GgufExportProgress& progress) {
  if (o.format != "gguf" && o.format != "gguf-lora")
    fail(ErrorKind::Config, "--format", "unknown format '" + o.format + "'", "allowed: gguf, gguf-lora");
  const std::string outtype = o.outtype.empty() ? default_export_outtype(o.format) : o.outtype;
  const OutType& ot = find_outtype(outtype, o.format);
  if (o.model.empty()) fail(ErrorKind::Config, "--model", "no base model given");
  check_out_path(o.out);
  GgufExportResult res = o.format == "gguf" ? export_merged(o, ot, progress) : export_lora(o, ot, progress);
  res.path = o.out;
  res.outtype = outtype;
  return res;
}

}  // namespace qlora
