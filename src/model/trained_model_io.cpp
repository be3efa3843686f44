#include "model/trained_model_io.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_util.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace qlora {

namespace {

// The files beside a Hugging Face checkpoint's weights that describe its tokenizer and generation.
const char* const kCarriedFiles[] = {"tokenizer.json",    "tokenizer_config.json", "special_tokens_map.json",
                                     "tokenizer.model",   "vocab.json",            "merges.txt",
                                     "added_tokens.json", "chat_template.jinja",   "generation_config.json"};

}  // namespace

std::vector<std::string> write_trained_model(const std::string& dir, DecoderModel& model, const std::string& base) {
  std::vector<std::string> notes;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(ErrorKind::Io, dir, "cannot create the output directory: " + ec.message());
  SafetensorsWriter w;
  std::vector<std::vector<float>> keep;
  for (auto& p : model.trainable_params()) {
    QLORA_ASSERT(p.w.dtype == DType::F32);
    keep.emplace_back(size_t(p.w.numel()));
    model.backend().copy_to_host(keep.back().data(), p.w.data, keep.back().size() * 4);
    w.add_ref(p.peft_key, DType::F32, std::vector<int64_t>(p.w.shape.begin(), p.w.shape.begin() + p.w.ndim),
              keep.back().data());
  }
  w.set_metadata({{"format", "pt"}});
  w.write(dir + "/model.safetensors");
  const bool hf_dir = fs::is_directory(base);
  nlohmann::json cfg;
  if (hf_dir && fs::exists(base + "/config.json")) {
    cfg = read_json_file(base + "/config.json");
    for (const char* key : {"torch_dtype", "dtype"})
      if (cfg.contains(key)) cfg[key] = "float32";
  } else {
    cfg = hf_config_json(model.config(), "float32");
  }
  write_file_atomic(dir + "/config.json", cfg.dump(2) + "\n");
  if (!hf_dir) {
    notes.push_back("the base " + base + " is not a Hugging Face directory: no tokenizer files copied to " + dir);
    return notes;
  }
  if (fs::absolute(base) == fs::absolute(dir)) return notes;  // training a run's own output further
  for (const char* f : kCarriedFiles)
    if (fs::exists(base + "/" + f)) write_file_atomic(dir + "/" + f, read_text_file(base + "/" + f));
  return notes;
}

}  // namespace qlora
