// `qlora quantize --model IN --quant FMT --out DIR`: writes a pre-quantized checkpoint. nf4/fp4 use
// the bitsandbytes-4bit layout transformers loads unchanged; other formats the layout documented in
// model/bnb_checkpoint.h. Prints size and error per layer, and perplexity before/after on request.
#include "tasks/quantize_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_util.h"
#include "io/safetensors.h"
#include "model/bnb_checkpoint.h"
#include "model/engine_spec.h"
#include "model/lora.h"
#include "model/quant_bytes.h"
#include "train/model_source.h"
#include "train/progress.h"

namespace fs = std::filesystem;

namespace qlora {

namespace {


QuantParams parse_quant(const QuantizeOptions& o) {
  static const std::vector<std::string> kNames = {"nf4", "fp4", "nvfp4", "mxfp4", "fp8", "fp8_e4m3", "fp8_e5m2", "mxfp8_e4m3"};
  if (std::find(kNames.begin(), kNames.end(), o.quant) == kNames.end()) {
    const std::string near = closest_name(kNames, o.quant, 3);
    fail(ErrorKind::Config, "--quant", "unknown format '" + o.quant + "'",
         (near.empty() ? "" : "did you mean '" + near + "'? ") + "choose nf4, fp4, nvfp4, mxfp4 or fp8");
  }
  const bool bnb = o.quant == "nf4" || o.quant == "fp4";
  if (!bnb && o.double_quant)
    fail(ErrorKind::Config, "--double-quant", "double quantization is defined for nf4 and fp4 only",
         "drop --double-quant for " + o.quant);
  if (!bnb && o.blocksize != 0)
    fail(ErrorKind::Config, "--blocksize", "--blocksize applies to nf4 and fp4 only",
         o.quant + " has a fixed block (nvfp4 16, mxfp4 32, fp8 one scale per tensor)");
  QuantParams p;  // "fp8" is e4m3 with one scale per tensor, as the engine's fp8 base
  p.format = o.quant == "fp8" ? QuantFormat::FP8_E4M3 : *quant_format_from_name(o.quant);
  if (bnb) {
    p.blocksize = o.blocksize;
    p.double_quant = o.double_quant;
  }
  validate_quant_params(p);
  p.blocksize = quant_blocksize(p);
  return p;
}

// Torch spelling of the dtype unquantized tensors are written in.
std::string output_dtype(const QuantizeOptions& o, const LlamaConfig& c) {
  std::string d = o.dtype == "auto" ? c.torch_dtype : o.dtype;
  if (d == "float32" || d == "bfloat16" || d == "float16") return d;
  if (o.dtype == "auto") return "float32";
  fail(ErrorKind::Config, "--dtype", "unknown dtype '" + o.dtype + "'", "auto, float32, bfloat16 or float16");
}

DType dtype_of(const std::string& torch) {
  return torch == "bfloat16" ? DType::BF16 : torch == "float16" ? DType::F16 : DType::F32;
}

bool is_projection(const std::string& plan_name) {
  for (const auto& t : all_linear_targets())
    if (plan_name.size() > t.size() && plan_name.compare(plan_name.size() - t.size(), t.size(), t) == 0 &&
        plan_name[plan_name.size() - t.size() - 1] == '.')
      return true;
  return false;
}

// The frozen tensors of the model, in the engine's order (the same list load_base walks).
std::vector<PlannedBuffer> weight_list(const LlamaConfig& c) {
  MemoryPlan plan;
  EngineSpec spec;
  spec.base_precision = BasePrecision::Fp32;
  spec.micro_batch = 1;
  spec.seq_len = 1;
  plan_model_buffers(plan, c, resolve_engine(spec, {}));
  std::vector<PlannedBuffer> w;
  for (const auto& b : plan.buffers)
    if (b.category == MemCategory::Weights) w.push_back(b);
  return w;
}

struct ErrStats {
  double sq = 0, max_abs = 0, ref_sq = 0;
  int64_t n = 0, bytes_in = 0, bytes_out = 0;
  void add(const ErrStats& o) {
    sq += o.sq, ref_sq += o.ref_sq, n += o.n, bytes_in += o.bytes_in, bytes_out += o.bytes_out;
    max_abs = std::max(max_abs, o.max_abs);
  }
  double rmse() const { return n ? std::sqrt(sq / double(n)) : 0.0; }
  double rel() const { return ref_sq > 0 ? std::sqrt(sq / ref_sq) : 0.0; }
};

std::string line(const char* label, const ErrStats& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-10s %10s -> %10s  rmse %.3e  max %.3e  (rel rmse %.2f%%)", label,
                format_bytes(double(s.bytes_in)).c_str(), format_bytes(double(s.bytes_out)).c_str(), s.rmse(),
                s.max_abs, 100.0 * s.rel());
  return buf;
}

// Mean token loss -> perplexity of `model_dir` on the text, in rows of at most seq_len tokens.
double perplexity(const ModelSource& src, const std::vector<int32_t>& ids, int64_t seq_len, Backend& be) {
  EngineSpec spec;
  spec.micro_batch = 1;
  spec.seq_len = seq_len;
  ModelPlanOptions po = resolve_engine(spec, {be.compute_dtype()});
  adopt_stored_quantization(po, src.tensors);
  LoraSpec lora;  // no adapters: the base alone
  DecoderModel m(src.config, be, po, lora);
  m.load_base(src.tensors);
  double loss = 0;
  int64_t counted = 0;
  for (size_t at = 0; at + 1 < ids.size(); at += size_t(seq_len)) {
    const int64_t t = std::min<int64_t>(seq_len, int64_t(ids.size() - at));
    if (t < 2) break;
    std::vector<int32_t> row(ids.begin() + long(at), ids.begin() + long(at) + t);
    Batch b = Batch::from_hf(1, t, row, row);
    loss += m.forward_loss(b);
    counted += b.n_trained();
  }
  return std::exp(loss / double(counted));
}

// Refuses the models whose quantized checkpoint transformers could not load as this one.
void check_quantizable(const QuantizeOptions& o, const LlamaConfig& cfg) {
  if (cfg.fused_qkv || cfg.fused_gate_up)  // the output would name the seven projections transformers does not know
    fail(ErrorKind::Unsupported, o.model + ": model_type '" + cfg.model_type + "'",
         "`qlora quantize` does not write fused projections (qkv_proj, gate_up_proj)",
         "train on the model as it is: base_precision nf4 quantizes it when it is loaded");
  if (cfg.moe())
    fail(ErrorKind::Unsupported, o.model + ": model_type '" + cfg.model_type + "'",
         "`qlora quantize` does not write mixture-of-experts models", "train on the model's own bf16 weights");
  if (!cfg.multimodal.empty())
    fail(ErrorKind::Unsupported, o.model + ": model_type '" + cfg.multimodal + "' (multimodal)",
         "`qlora quantize` writes text models only, and this checkpoint's vision tower would be lost",
         "train on the model as it is: base_precision nf4 quantizes its text model when it is loaded");
}

// The error of the n values of `deq` against `ref`.
ErrStats quantization_error(const std::vector<float>& ref, const std::vector<float>& deq, int64_t n) {
  ErrStats s;
  for (int64_t i = 0; i < n; i++) {
    const double e = double(deq[size_t(i)]) - double(ref[size_t(i)]);
    s.sq += e * e;
    s.ref_sq += double(ref[size_t(i)]) * ref[size_t(i)];
    s.max_abs = std::max(s.max_abs, std::fabs(e));
  }
  s.n = n;
  return s;
}

// The projections' error and size per layer: a line on stdout as each layer ends, with progress
// and ETA, and the totals over all layers.
class LayerReport {
 public:
  explicit LayerReport(int64_t n_layer) : n_layer_(n_layer), t0_(std::chrono::steady_clock::now()) {}
  // Before a projection of layer l: ends the layer before it.
  void enter(int64_t l) {
    if (l != cur_layer_) {
      end_layer();
      cur_layer_ = l;
    }
  }
  void add(const ErrStats& s) { layer_.add(s); }
  // Ends the last layer; the totals.
  const ErrStats& finish() {
    end_layer();
    return total_;
  }

 private:
  void end_layer() {
    if (cur_layer_ < 0) return;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const double eta = el / double(cur_layer_ + 1) * double(n_layer_ - cur_layer_ - 1);
    const std::string label = "layer " + std::to_string(cur_layer_);
    std::printf("%s  [%lld/%lld, %s elapsed, eta %s]\n", line(label.c_str(), layer_).c_str(),
                (long long)(cur_layer_ + 1), (long long)n_layer_, format_duration(el).c_str(),
                format_duration(eta).c_str());
    std::fflush(stdout);
    total_.add(layer_);
    layer_ = ErrStats{};
  }

  int64_t n_layer_;
  std::chrono::steady_clock::time_point t0_;
  int64_t cur_layer_ = -1;
  ErrStats layer_, total_;
};

// Every frozen tensor of the model into `w`: the projections quantized by `qp` (their error per
// layer on stdout), the rest in `odt`. `in_elem`: bytes per value of the input. The totals over
// the projections.
ErrStats write_weights(SafetensorsWriter& w, const ModelSource& src, const QuantParams& qp, const std::string& odt,
                       int64_t in_elem) {
  const LlamaConfig& cfg = src.config;
  std::vector<float> host, deq;
  LayerReport report(cfg.n_layer);
  for (const auto& b : weight_list(cfg)) {
    const std::string hf = hf_weight_name(b.name);
    int64_t n = 1;
    for (int64_t s : b.shape) n *= s;
    host.resize(size_t(n));
    src.tensors.read_f32(hf, b.shape, host.data());
    if (!is_projection(b.name)) {
      w.add_from_f32(hf, dtype_of(odt), b.shape, host.data());
      continue;
    }
    report.enter(std::stoll(b.name.substr(7, b.name.find('.', 7) - 7)));
    QuantizedTensor q = quantize_ref(host.data(), b.shape[0], b.shape[1], qp);
    deq.resize(size_t(n));
    dequantize_ref(q, deq.data());
    ErrStats s = quantization_error(host, deq, n);
    s.bytes_in = n * in_elem;
    s.bytes_out = q.nbytes();
    report.add(s);
    add_quantized_weight(w, hf, q, odt);
  }
  return report.finish();
}

// config.json: the input's own (or one from the GGUF's metadata) with the quantization_config and
// the dtype of the unquantized tensors.
void write_config(const AtomicDir& dir, const QuantizeOptions& o, bool hf_dir, const LlamaConfig& cfg,
                  const QuantParams& qp, const std::string& odt) {
  json config = hf_dir ? read_json_file(o.model + "/config.json") : hf_config_json(cfg, odt);
  config["quantization_config"] = quantization_config_json(qp, odt);
  config[config.contains("dtype") ? "dtype" : "torch_dtype"] = odt;  // transformers 5 / 4 spelling
  dir.write("config.json", config.dump(2) + "\n");
}

// Prints the perplexity on o.eval_text of the input and of the checkpoint written to `dir`.
void print_perplexity_change(const QuantizeOptions& o, const ModelSource& src, const std::string& text,
                             const AtomicDir& dir, Backend& be) {
  std::vector<int32_t> ids = src.encoder.encode(text);
  if (int64_t(ids.size()) > o.eval_max_tokens) ids.resize(size_t(o.eval_max_tokens));
  if (ids.size() < 2) fail(ErrorKind::Data, o.eval_text, "the text encodes to fewer than 2 tokens");
  const int64_t seq = std::min(o.eval_seq_len, src.config.max_position_embeddings);
  const double before = perplexity(src, ids, seq, be);
  const double after = perplexity(open_model_source(dir.temp_path()), ids, seq, be);
  std::printf("perplexity on %s (%zu tokens): before %.4f  after %.4f  (%+.2f%%)\n", o.eval_text.c_str(), ids.size(),
              before, after, 100.0 * (after / before - 1.0));
}

void copy_side_files(const std::string& from, const AtomicDir& d) {
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                        "generation_config.json", "chat_template.jinja", "vocab.json", "merges.txt", "added_tokens.json"})
    if (fs::exists(from + "/" + f)) d.write(f, read_text_file(from + "/" + f));
}

}  // namespace

void quantize_model(const QuantizeOptions& o, const std::function<std::unique_ptr<Backend>()>& eval_backend) {
  const QuantParams qp = parse_quant(o);
  if (o.eval_seq_len < 2) fail(ErrorKind::Config, "--eval-seq-len", "must be at least 2");
  const std::string text = o.eval_text.empty() ? "" : read_text_file(o.eval_text);  // fail before any work
  if (!o.eval_text.empty() && text.empty()) fail(ErrorKind::Data, o.eval_text, "the evaluation text is empty");

  ModelSource src = open_model_source(o.model);
  const LlamaConfig& cfg = src.config;
  check_quantizable(o, cfg);
  const bool hf_dir = fs::is_directory(o.model);
  const std::string odt = output_dtype(o, cfg);
  const int64_t in_elem = hf_dir ? dtype_size(dtype_of(cfg.torch_dtype)) : 4;
  if (src.tensors.stored_quant)
    std::fprintf(stderr, "note: %s is already quantized (%s); its dequantized weights are re-quantized\n",
                 o.model.c_str(), quant_format_name(src.tensors.stored_quant->format));
  std::printf("quantizing %s -> %s as %s%s, blocksize %d\n", o.model.c_str(), o.out.c_str(), o.quant.c_str(),
              qp.double_quant ? " + double quant" : "", quant_blocksize(qp));

  AtomicDir dir(o.out);
  SafetensorsWriter w;
  const ErrStats total = write_weights(w, src, qp, odt, in_elem);
  std::printf("%s\n", line("total", total).c_str());

  w.set_metadata({{"format", "pt"}});
  w.write(dir.path("model.safetensors"));
  write_config(dir, o, hf_dir, cfg, qp, odt);
  std::fflush(stdout);  // keep the notes below after the table when both streams share a terminal
  if (hf_dir) copy_side_files(o.model, dir);
  else std::fprintf(stderr, "note: GGUF input: the tokenizer stays in the GGUF file; no tokenizer files were written\n");

  if (!o.eval_text.empty()) {  // evaluates the written files before they are committed
    auto be = eval_backend();
    print_perplexity_change(o, src, text, dir, *be);
  }
  dir.commit();
  std::printf("wrote %s (%s)\n", o.out.c_str(), format_bytes(double(fs::file_size(o.out + "/model.safetensors"))).c_str());
}

}  // namespace qlora
