// `qlora merge --model BASE --adapter DIR --out DIR`: the base with a PEFT adapter folded in, written
// as a Hugging Face model directory (config.json, generation_config.json, tokenizer files,
// safetensors sharded past --max-shard-size with transformers' index). The merge runs on the
// dequantized base in fp32 (model/merge.h) and is cast to --dtype; a quantized base is never
// re-quantized. Tensor by tensor: each shard's header is known from the config before any data, so
// every merged tensor is appended to its file as soon as it exists and memory stays near one tensor.
// The directory is built under a temporary name and renamed: it appears complete or not at all.
#include "tasks/merge_model.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/gguf.h"
#include "io/json_util.h"
#include "io/safetensors.h"
#include "model/merge.h"
#include "train/model_source.h"
#include "train/progress.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace qlora {

namespace {


struct OutDType {
  DType dtype;
  std::string torch, short_name;
};

OutDType parse_dtype(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return {DType::BF16, "bfloat16", "bf16"};
  if (s == "fp16" || s == "float16" || s == "f16") return {DType::F16, "float16", "fp16"};
  if (s == "fp32" || s == "float32" || s == "f32") return {DType::F32, "float32", "fp32"};
  const std::string near = closest_name({"bf16", "fp16", "fp32", "bfloat16", "float16", "float32"}, s, 3);
  fail(ErrorKind::Config, "--dtype", "unknown output dtype '" + s + "'",
       (near.empty() ? "" : "did you mean '" + near + "'? ") + "allowed: bf16, fp16, fp32 (or bfloat16, float16, float32)");
}

// "5GB" (10^9, as transformers reads it), "500MB", "2GiB", "1000000" (bytes).
int64_t parse_size(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) i++;
  std::string unit = s.substr(i);
  for (auto& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},      {"B", 1},         {"KB", 1e3},      {"MB", 1e6},          {"GB", 1e9},
      {"TB", 1e12}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  const auto u = kUnits.find(unit);
  double v = 0;
  try {
    v = i ? std::stod(s.substr(0, i)) : 0;
  } catch (const std::exception&) {
    v = 0;
  }
  if (u == kUnits.end() || i == 0 || !(v * u->second >= 1) || v * u->second > 9e18)
    fail(ErrorKind::Config, "--max-shard-size", "cannot read '" + s + "' as a size",
         "a positive number of bytes with an optional unit: 5GB, 500MB, 2GiB, 1000000");
  return int64_t(v * u->second);
}

// Refuse to overwrite user data: an existing non-empty --out needs --force, and never one that
// holds the base or the adapter (replacing it would delete the inputs).
void check_out_dir(const MergeOptions& o) {
  std::error_code ec;
  if (!fs::exists(o.out, ec)) return;
  if (!fs::is_directory(o.out, ec))
    fail(ErrorKind::Io, o.out, "exists and is not a directory", "choose another --out");
  const fs::path out = fs::weakly_canonical(o.out, ec);
  for (const std::string& in : {o.model, o.adapter}) {
    const fs::path p = fs::weakly_canonical(in, ec);
    auto [a, b] = std::mismatch(out.begin(), out.end(), p.begin(), p.end());
    if (a == out.end())
      fail(ErrorKind::Config, "--out " + o.out, "contains the input " + in + "; writing there would replace it",
           "choose an output directory outside the base model and the adapter");
  }
  if (!fs::is_empty(o.out, ec) && !o.force)
    fail(ErrorKind::Config, "--out " + o.out, "exists and is not empty",
         "choose another directory, or pass --force to replace it (its current files are deleted)");
}

// How the base stores its weights: the float dtype to keep by default, or the quantized format.
struct BaseStorageInfo {
  bool quantized = false;
  std::string what;   // "nf4 (double quant)", "GGUF Q4_1", "float32" ...
  std::string torch;  // float bases: the dtype the output keeps by default
};

BaseStorageInfo base_storage(const std::string& path, const ModelSource& src, const MergedModel& m) {
  BaseStorageInfo b;
  if (src.format == "gguf") {
    GgufFile g(path);
    std::set<std::string> types;
    bool quant = false;
    for (const auto& t : g.tensors()) {
      if (t.ne.size() < 2) continue;  // norms stay F32 in every GGUF; the matrices tell the precision
      // gpt-oss's MXFP4 experts are the format it ships in, as from its checkpoint: the rest tells.
      if (src.tensors.stored_expert_quant && t.name.find("_exps.") != std::string::npos) continue;
      types.insert(ggml_type_name(t.type));
      quant |= t.type != GgmlType::F32 && t.type != GgmlType::F16 && t.type != GgmlType::BF16;
    }
    std::string list;
    for (const auto& t : types) list += (list.empty() ? "" : "/") + t;
    b.quantized = quant;
    b.what = "GGUF " + list;
    b.torch = types.size() == 1 && *types.begin() == "F16"    ? "float16"
              : types.size() == 1 && *types.begin() == "BF16" ? "bfloat16"
                                                              : "float32";
    return b;
  }
  b.quantized = m.base_quantized();
  b.what = m.base_precision();
  b.torch = src.config.torch_dtype == "bfloat16" || src.config.torch_dtype == "float16" ? src.config.torch_dtype
                                                                                         : "float32";
  return b;
}

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // into the output list
  int64_t bytes = 0;
};

// One tensor of the output: its name in the files written, its shape, and its f32 values.
struct OutTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::function<void(float*)> read;
};

// What `qlora merge` writes: the merged model's tensors in state-dict order and, for a multimodal
// checkpoint, its text model under the checkpoint's own names followed by every other tensor of the
// checkpoint (the vision tower, the projector) as it is, by name.
std::vector<OutTensor> output_tensors(const std::string& model, const ModelSource& src, const MergedModel& m) {
  std::vector<OutTensor> out;
  std::set<std::string> claimed;
  for (const auto& n : m.names()) {
    const std::string name = src.file_name ? src.file_name(n) : n;
    out.push_back({name, m.shape(n), [&m, n](float* dst) { m.read(n, dst); }});
    claimed.insert(name);
  }
  if (src.config.multimodal.empty()) return out;
  auto all = std::make_shared<SafetensorsArchive>(model);
  for (const auto& name : all->names()) {
    if (claimed.count(name)) continue;
    const std::vector<int64_t> shape = all->get(name).shape;
    out.push_back({name, shape, [all, name, shape](float* dst) { all->read_f32(name, dst, shape); }});
  }
  return out;
}

// transformers' split: tensors in state-dict order fill a shard until the next would pass the
// limit; a tensor larger than the limit gets a shard of its own.
std::vector<Shard> plan_shards(const std::vector<OutTensor>& tensors, DType dt, int64_t max_bytes) {
  std::vector<Shard> shards;
  for (size_t i = 0; i < tensors.size(); i++) {
    int64_t bytes = dtype_size(dt);
    for (int64_t d : tensors[i].shape) bytes *= d;
    if (shards.empty() || (shards.back().bytes > 0 && shards.back().bytes + bytes > max_bytes)) shards.emplace_back();
    shards.back().tensors.push_back(i);
    shards.back().bytes += bytes;
  }
  char buf[64];
  for (size_t i = 0; i < shards.size(); i++) {
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    shards[i].file = shards.size() == 1 ? "model.safetensors" : buf;
  }
  return shards;
}

// stderr progress: a redrawn line on a terminal, otherwise a line at most every 10 seconds.
class MergeProgress {
 public:
  MergeProgress(size_t n_tensors, int64_t total_bytes)
      : n_(n_tensors), total_(total_bytes), tty_(::isatty(2) != 0), t0_(std::chrono::steady_clock::now()) {}
  void tensor_done(size_t i, int64_t bytes_done) {
    const double el = elapsed();
    if (i < n_ && el - last_ < (tty_ ? 0.2 : 10.0)) return;
    last_ = el;
    const double eta = bytes_done > 0 ? el / double(bytes_done) * double(total_ - bytes_done) : -1;
    std::fprintf(stderr, "%smerge: tensor %zu/%zu | %s of %s written | %s elapsed, ETA %s%s", tty_ ? "\r\033[K" : "", i,
                 n_, format_bytes(double(bytes_done)).c_str(), format_bytes(double(total_)).c_str(),
                 format_duration(el).c_str(), format_duration(eta).c_str(), tty_ && i < n_ ? "" : "\n");
    std::fflush(stderr);
  }
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  size_t n_;
  int64_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_;
  double last_ = 0;
};

const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                 "chat_template.jinja", "tokenizer.model", "vocab.json", "merges.txt",
                                 "added_tokens.json"};

// Notes on stderr where the merged weights are stored otherwise than the base's.
void note_precision(const MergeOptions& o, const ModelSource& src, const BaseStorageInfo& bp, const OutDType& odt) {
  if (bp.quantized)
    std::fprintf(stderr,
                 "note: the base is quantized (%s); the output is the dequantized base plus the adapter in %s, "
                 "not re-quantized (`qlora quantize --model %s` can quantize it again)\n",
                 bp.what.c_str(), odt.short_name.c_str(), o.out.c_str());
  else if (odt.torch != bp.torch)
    std::fprintf(stderr, "note: the base is %s; the merged weights are written in %s\n", bp.torch.c_str(),
                 odt.torch.c_str());
  if (src.tensors.stored_expert_quant)  // gpt-oss: the experts' adapters change every expert weight
    std::fprintf(stderr, "note: the experts are stored in %s; the merged model holds them dequantized in %s\n",
                 quant_format_name(src.tensors.stored_expert_quant->format), odt.short_name.c_str());
}

// The directory --out is created in (--out itself is built under a temporary name beside it).
void create_parent_dir(const std::string& out) {
  const fs::path parent = fs::path(out).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) fail(ErrorKind::Io, parent.string(), "cannot create directory: " + ec.message());
  }
}

// Writes the shards into `dir`, each tensor cast to `dt` and appended as soon as it is read, with
// progress on stderr; returns the index's weight_map (tensor name -> shard file). The buffers, as
// large as the largest tensor, are freed on return, before the tokenizer files.
json write_shards(const AtomicDir& dir, const std::vector<Shard>& shards, const std::vector<OutTensor>& tensors,
                  DType dt, int64_t total, const std::string& out) {
  MergeProgress progress(tensors.size(), total);
  std::vector<float> f32;
  std::vector<uint8_t> bytes;
  size_t done = 0;
  int64_t written = 0;
  json weight_map = json::object();
  for (const auto& s : shards) {
    SafetensorsWriter w;
    std::map<std::string, size_t> by_name;
    for (size_t i : s.tensors) {
      w.declare(tensors[i].name, dt, tensors[i].shape);
      by_name[tensors[i].name] = i;
    }
    w.set_metadata({{"format", "pt"}});
    AtomicFile f(dir.path(s.file));
    f.append(w.header());
    for (const auto& n : w.data_order_names()) {
      const OutTensor& t = tensors[by_name.at(n)];
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      f32.resize(size_t(numel));
      t.read(f32.data());
      bytes.resize(size_t(numel * dtype_size(dt)));
      convert_from_f32(dt, f32.data(), bytes.data(), numel);
      f.append(bytes.data(), bytes.size());
      written += int64_t(bytes.size());
      weight_map[n] = s.file;
      progress.tensor_done(++done, written);
      if (g_stop_requested) fail(ErrorKind::Io, out, "interrupted");  // the temporary files go with dir
    }
    f.commit();
  }
  return weight_map;
}

// config.json: the base's own (quantization_config dropped, dtype set), or one from the GGUF.
json merged_config(const std::string& model, bool hf_dir, const LlamaConfig& cfg, const std::string& torch) {
  json config;
  if (hf_dir) {
    config = read_json_file(model + "/config.json");
    config.erase("quantization_config");
    if (!config.contains("dtype") && !config.contains("torch_dtype")) config["torch_dtype"] = torch;
    for (json* c : {&config, config.contains("text_config") ? &config["text_config"] : nullptr,
                     config.contains("vision_config") ? &config["vision_config"] : nullptr})
      for (const char* k : {"dtype", "torch_dtype"})  // transformers 5 / 4 spelling: set whichever is there
        if (c && c->is_object() && c->contains(k)) (*c)[k] = torch;
  } else {
    config = hf_config_json(cfg, torch);
  }
  return config;
}

// generation_config.json: the base's own, else one with the config's bos and eos ids.
void write_generation_config(const AtomicDir& dir, const std::string& model, bool hf_dir, const LlamaConfig& cfg) {
  if (hf_dir && fs::exists(model + "/generation_config.json")) {
    dir.write("generation_config.json", read_text_file(model + "/generation_config.json"));
  } else {
    json gen = json::object();
    if (cfg.bos_token_id >= 0) gen["bos_token_id"] = cfg.bos_token_id;
    if (cfg.eos_token_id >= 0) gen["eos_token_id"] = cfg.eos_token_id;
    dir.write("generation_config.json", gen.dump(2) + "\n");
  }
}

// The tokenizer files written, and why none were when there are none.
struct TokenizerFiles {
  std::vector<std::string> written;
  std::string note;
};

// The base directory's tokenizer files as they are, or tokenizer.json and tokenizer_config.json
// made from a GGUF's vocabulary.
TokenizerFiles write_tokenizer_files(const AtomicDir& dir, const std::string& model, bool hf_dir) {
  TokenizerFiles out;
  if (hf_dir) {
    for (const char* f : kTokenizerFiles)
      if (fs::exists(model + "/" + f)) {
        dir.write(f, read_text_file(model + "/" + f));
        out.written.push_back(f);
      }
    if (out.written.empty()) out.note = "the base has no tokenizer files; none were written";
  } else {
    std::optional<Tokenizer::HfFiles> t;
    try {
      t = Tokenizer::hf_files_from_gguf(GgufFile(model));
    } catch (const Error& e) {  // a vocabulary we cannot express (not gpt2-style BPE)
      out.note = std::string("no tokenizer files were written: ") + e.what();
    }
    if (t) {
      dir.write("tokenizer.json", t->tokenizer_json);
      dir.write("tokenizer_config.json", t->tokenizer_config_json);
      out.written = {"tokenizer.json", "tokenizer_config.json"};
    }
  }
  return out;
}

}  // namespace

void merge_model(const MergeOptions& o) {
  // Argument errors before any work.
  std::optional<OutDType> asked;
  if (!o.dtype.empty()) asked = parse_dtype(o.dtype);
  const int64_t max_shard = parse_size(o.max_shard_size);
  check_out_dir(o);

  ModelSource src = open_model_source(o.model);
  const LlamaConfig& cfg = src.config;
  PeftAdapter adapter = open_peft_adapter(o.adapter, cfg);
  const LoraSpec spec = adapter.spec;
  MergedModel m(cfg, src.tensors, std::move(adapter));
  // A multimodal checkpoint's other tensors are copied as they are: a quantized one's would be
  // the quantized bytes' companions (absmax, quant_map) beside a dequantized text model.
  if (!cfg.multimodal.empty() && m.base_quantized())
    fail(ErrorKind::Unsupported, o.model + ": model_type '" + cfg.multimodal + "' (multimodal), quantized",
         "`qlora merge` of a quantized multimodal checkpoint is not implemented",
         "merge into the unquantized checkpoint, or load the adapter with PEFT and merge there (merge_and_unload)");
  const std::vector<OutTensor> tensors = output_tensors(o.model, src, m);
  const BaseStorageInfo bp = base_storage(o.model, src, m);
  const OutDType odt = asked ? *asked : parse_dtype(bp.quantized ? "bf16" : bp.torch);
  note_precision(o, src, bp, odt);

  const std::vector<Shard> shards = plan_shards(tensors, odt.dtype, max_shard);
  int64_t total = 0;
  for (const auto& s : shards) total += s.bytes;
  int merged = 0;
  for (const auto& n : m.names()) merged += m.merged(n);
  std::printf("merging %s + %s (r=%lld, scale %g, %d projections) -> %s as %s, %zu file%s\n", o.model.c_str(),
              o.adapter.c_str(), (long long)spec.r, double(spec.scale()), merged, o.out.c_str(), odt.short_name.c_str(),
              shards.size(), shards.size() == 1 ? "" : "s");
  std::fflush(stdout);

  create_parent_dir(o.out);
  AtomicDir dir(o.out);
  TokenizerFiles tok;
  try {
    const json weight_map = write_shards(dir, shards, tensors, odt.dtype, total, o.out);
    if (shards.size() > 1)
      dir.write("model.safetensors.index.json",
                json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
    const bool hf_dir = src.format == "hf";
    dir.write("config.json", merged_config(o.model, hf_dir, cfg, odt.torch).dump(2) + "\n");
    write_generation_config(dir, o.model, hf_dir, cfg);
    tok = write_tokenizer_files(dir, o.model, hf_dir);
    dir.commit();
  } catch (const Error& e) {
    // Name the file by its final path (the temporary directory is deleted on the way out).
    if (e.kind() != ErrorKind::Io) throw;
    std::string where = e.where();
    if (where.rfind(dir.temp_path(), 0) == 0) where = dir.final_path() + where.substr(dir.temp_path().size());
    fail(ErrorKind::Io, where, e.message() + "; nothing was written to " + o.out, e.hint());
  }
  if (!tok.note.empty()) std::fprintf(stderr, "note: %s\n", tok.note.c_str());

  std::string files;
  for (const auto& f : tok.written) files += (files.empty() ? "" : ", ") + f;
  std::printf("wrote %s: %s, %s in %zu safetensors file%s%s, %d projections merged, base %s (%s); %s\n", o.out.c_str(),
              odt.short_name.c_str(), format_bytes(double(total)).c_str(), shards.size(), shards.size() == 1 ? "" : "s",
              shards.size() > 1 ? " + index" : "", merged, o.model.c_str(), bp.what.c_str(),
              files.empty() ? "no tokenizer files" : ("tokenizer: " + files).c_str());
}

}  // namespace qlora
