// Model resolution for the planner: presets, HF directories, config.json files, GGUF headers.
#include "plan/model_presets.h"

#include <filesystem>

#include "core/error.h"
#include "io/gguf.h"
#include "io/json_util.h"
#include "model/gguf_model.h"

namespace qlora {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

LlamaConfig from_gguf(const std::string& path) {
  GgufFile f(path);  // maps the file; only header, metadata and tensor infos are touched
  LlamaConfig c = gguf_llama_config(f);
  c.name = path;
  return c;
}

}  // namespace

LlamaConfig resolve_model(const std::string& spec) {
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    const fs::path cfg = fs::path(spec) / "config.json";
    if (fs::exists(cfg, ec)) {
      LlamaConfig c = load_hf_config(cfg.string());
      c.name = spec;
      return c;
    }
    for (const auto& e : fs::directory_iterator(spec, ec))
      if (e.is_regular_file() && e.path().extension() == ".gguf") return from_gguf(e.path().string());
    fail(ErrorKind::Io, spec, "directory has neither config.json nor a .gguf file",
         "point --model at a Hugging Face model directory, a config.json, a .gguf file or a preset name");
  }
  if (fs::is_regular_file(spec, ec)) {
    if (ends_with(spec, ".gguf")) return from_gguf(spec);
    LlamaConfig c = load_hf_config(spec);
    c.name = spec;
    return c;
  }
  if (spec.find('/') != std::string::npos || ends_with(spec, ".json") || ends_with(spec, ".gguf"))
    fail(ErrorKind::Io, spec, "no such file or directory",
         "give an existing HF model directory, config.json or .gguf file, or a preset name");
  if (has_preset(spec)) {
    LlamaConfig c = preset_config(spec);
    if (c.name.empty()) c.name = spec;
    return c;
  }
  std::string close = closest_name(preset_names(), spec, 4);
  std::string list;
  for (const auto& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
  fail(ErrorKind::Config, "--model " + spec, "unknown model '" + spec + "'",
       (close.empty() ? std::string() : "did you mean '" + close + "'? ") + "known presets: " + list +
           "; or give a Hugging Face model directory, a config.json or a .gguf file");
}

}  // namespace qlora
