// Model sources: Hugging Face directories (config.json + safetensors, sharded or not).
#include "train/model_source.h"

#include <filesystem>

#include "core/error.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace qlora {

TextEncoder byte_level_encoder() {
  TextEncoder e;
  e.encode = [](const std::string& s) {
    std::vector<int32_t> ids(s.size());
    for (size_t i = 0; i < s.size(); i++) ids[i] = int32_t(static_cast<unsigned char>(s[i]));
    return ids;
  };
  e.bos = 256;
  e.eos = 257;
  e.vocab_size = 258;
  e.name = "byte-level (no tokenizer.json)";
  return e;
}

ModelSource open_model_source(const std::string& path) {
  if (path.empty())
    fail(ErrorKind::Config, "model_name_or_path", "not set", "point it at a Hugging Face model directory");
  if (!fs::exists(path)) {
    std::string hint = has_preset(path) ? "'" + path + "' is a shape preset for `qlora plan`; training needs weights"
                                        : "expected a directory with config.json and *.safetensors";
    fail(ErrorKind::Io, path, "model path does not exist", hint);
  }
  if (!fs::is_directory(path))
    fail(ErrorKind::Unsupported, path, "not a model directory", "expected a directory with config.json and *.safetensors");
  ModelSource src;
  src.config = load_hf_config(path + "/config.json");
  src.config.name = path;
  auto ar = std::make_shared<SafetensorsArchive>(path);
  src.keepalive = ar;
  src.tensors.description = "model dir " + path;
  src.tensors.has = [ar](const std::string& n) { return ar->has(n); };
  src.tensors.read_f32 = [ar](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    ar->read_f32(n, dst, shape);
  };
  if (fs::exists(path + "/tokenizer.json")) {
    fail(ErrorKind::Unsupported, path + "/tokenizer.json", "tokenizer.json support is not wired in yet");
  }
  src.encoder = byte_level_encoder();
  if (src.config.vocab_size < src.encoder.vocab_size) {
    // Pre-tokenized data still works; only text rows need an encoder.
    const std::string msg = "no tokenizer.json and the vocabulary (" + std::to_string(src.config.vocab_size) +
                            ") is too small for the byte-level fallback (258)";
    src.encoder.encode = [path, msg](const std::string&) -> std::vector<int32_t> {
      fail(ErrorKind::Config, path, msg, "add the model's tokenizer.json or use pre-tokenized data");
    };
    src.encoder.bos = src.encoder.eos = -1;
    src.encoder.vocab_size = src.config.vocab_size;
    src.encoder.name = "none (pre-tokenized data only)";
  }
  return src;
}

}  // namespace qlora
