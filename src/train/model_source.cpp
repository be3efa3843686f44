// Model sources: Hugging Face directories (config.json + safetensors, sharded or not, tokenizer.json;
// pre-quantized bitsandbytes-4bit or `qlora quantize` checkpoints included) and GGUF files
// (weights dequantized on load, tokenizer from the GGUF vocabulary).
#include "train/model_source.h"

#include <filesystem>

#include "core/error.h"
#include "io/gguf.h"
#include "io/json_util.h"
#include "io/safetensors.h"
#include "model/bnb_checkpoint.h"
#include "model/gguf_model.h"
#include "model/mxfp4_experts.h"

namespace fs = std::filesystem;

namespace qlora {

TextEncoder text_encoder(std::shared_ptr<const Tokenizer> tok, const std::string& name) {
  TextEncoder e;
  e.name = name;
  e.vocab_size = tok->vocab_size();
  e.encode = [tok](const std::string& s) { return tok->encode(s, true); };
  e.bos = -1;  // added by encode() when the tokenizer's post-processor adds it
  e.eos = tok->eos_id().value_or(-1);
  return e;
}

static void attach_tokenizer(ModelSource& src, std::shared_ptr<const Tokenizer> tok, const std::string& name,
                             const std::string& where) {
  if (tok && tok->vocab_size() > src.config.vocab_size)
    fail(ErrorKind::Config, where, "tokenizer has " + std::to_string(tok->vocab_size()) +
                                       " ids but the model's vocabulary is " + std::to_string(src.config.vocab_size));
  if (!tok && src.config.vocab_size >= 258) {
    tok = std::make_shared<const Tokenizer>(Tokenizer::byte_level());
    src.tokenizer = tok;
    src.encoder = text_encoder(tok, "byte-level (no tokenizer.json)");
    return;
  }
  src.tokenizer = tok;
  if (tok) {
    src.encoder = text_encoder(tok, name);
    return;
  }
  const std::string msg = "no tokenizer.json and the vocabulary (" + std::to_string(src.config.vocab_size) +
                          ") is too small for the byte-level fallback (258)";
  src.encoder.encode = [where, msg](const std::string&) -> std::vector<int32_t> {
    fail(ErrorKind::Config, where, msg, "add the model's tokenizer.json or use pre-tokenized data");
  };
  src.encoder.vocab_size = src.config.vocab_size;
  src.encoder.name = "none (pre-tokenized data only)";
}

// A multimodal checkpoint's text model (LlamaConfig::multimodal): the engine's names ("model.X",
// "lm_head.weight") under the prefix the file uses: "language_model.model.X", as the Hub's
// Gemma 3 checkpoints and transformers' save_pretrained write them, or "model.language_model.X".
static std::function<std::string(const std::string&)> text_model_names(const TensorSource& in) {
  return [has = in.has](const std::string& n) {
    const std::vector<std::string> cand =
        n.rfind("model.", 0) == 0 ? std::vector<std::string>{"language_model." + n, "model.language_model." + n.substr(6)}
                                  : std::vector<std::string>{"language_model." + n, n};
    for (const auto& c : cand)
      if (has(c)) return c;
    return cand.front();  // absent: the source's error names the expected tensor
  };
}

static ModelSource open_hf_dir(const std::string& path) {
  ModelSource src;
  src.format = "hf";
  src.config = load_hf_config(path + "/config.json");
  src.config.name = path;
  auto ar = std::make_shared<SafetensorsArchive>(path);
  src.keepalive = ar;
  src.tensors.description = "model dir " + path;
  src.tensors.has = [ar](const std::string& n) { return ar->has(n); };
  src.tensors.read_f32 = [ar](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    ar->read_f32(n, dst, shape);
    ar->release_pages(n);  // copied: the mapped pages need not stay beside the copy
  };
  // Pre-quantized checkpoints (bitsandbytes 4-bit, `qlora quantize` output) name their layout in config.json.
  // gpt-oss ships its experts as MXFP4 blocks beside float weights.
  if (auto cq = read_checkpoint_quant(read_json_file(path + "/config.json"), *ar, path + "/config.json")) {
    if (cq->method == "mxfp4" && src.config.model_type != "gpt_oss")
      fail(ErrorKind::Unsupported, path + "/config.json: quantization_config: key 'quant_method'",
           "'mxfp4' checkpoints are read for gpt-oss only (its experts' blocks), not for " + src.config.model_type);
    src.tensors = cq->method == "mxfp4"
                      ? mxfp4_experts_source(ar, "model dir " + path + " (MXFP4 experts)")
                      : quantized_checkpoint_source(ar, *cq, "model dir " + path + " (" + cq->method + " " +
                                                                 quant_format_name(cq->params.format) + ")");
  }
  if (!src.config.multimodal.empty()) {
    src.file_name = text_model_names(src.tensors);
    src.tensors = renamed_source(src.tensors, src.file_name, src.tensors.description + " (its text model)");
  }
  std::shared_ptr<const Tokenizer> tok;
  if (fs::exists(path + "/tokenizer.json"))
    tok = std::make_shared<const Tokenizer>(Tokenizer::from_file(path + "/tokenizer.json"));
  attach_tokenizer(src, tok, path + "/tokenizer.json", path);
  return src;
}

static ModelSource open_gguf(const std::string& path) {
  ModelSource src;
  src.format = "gguf";
  auto g = std::make_shared<GgufFile>(path);
  src.keepalive = g;
  src.config = gguf_llama_config(*g);
  src.config.name = path;
  src.config.validate(path);
  const LlamaConfig cfg = src.config;
  src.tensors.description = "GGUF " + path;
  src.tensors.has = [g, cfg](const std::string& n) { return gguf_has_hf_tensor(*g, cfg, n); };
  src.tensors.read_f32 = [g, cfg, path](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    const auto got = gguf_hf_shape(*g, cfg, n);
    if (got != shape)
      fail(ErrorKind::Shape, path + ": tensor '" + n + "'", "has shape " + shape_str(got) + ", expected " + shape_str(shape));
    gguf_read_hf_tensor(*g, cfg, n, dst);
    gguf_release_hf_tensor(*g, cfg, n);  // copied: the mapped pages need not stay beside the copy
  };
  if (cfg.experts_stored == "mxfp4") {  // gpt-oss's MXFP4 experts, held as the file ships them
    src.tensors.description += " (MXFP4 experts)";
    src.tensors.stored_expert_quant = mxfp4_expert_params();
    src.tensors.read_quantized = [g, cfg](const std::string& n, int64_t rows, int64_t cols, QuantizedTensor& q) {
      return gguf_read_hf_quantized(*g, cfg, n, rows, cols, q);
    };
  }
  attach_tokenizer(src, std::make_shared<const Tokenizer>(Tokenizer::from_gguf(*g)), "GGUF vocabulary", path);
  return src;
}

ModelSource open_model_source(const std::string& path) {
  if (path.empty())
    fail(ErrorKind::Config, "model_name_or_path", "not set", "point it at a Hugging Face model directory or a .gguf file");
  if (!fs::exists(path)) {
    std::string hint = has_preset(path) ? "'" + path + "' is a shape preset for `qlora plan`; training needs weights"
                                        : "expected a directory with config.json and *.safetensors, or a .gguf file";
    fail(ErrorKind::Io, path, "model path does not exist", hint);
  }
  if (fs::is_directory(path)) return open_hf_dir(path);
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0) return open_gguf(path);
  fail(ErrorKind::Unsupported, path, "not a model directory or a .gguf file",
       "expected a directory with config.json and *.safetensors, or a .gguf file");
}

}  // namespace qlora
