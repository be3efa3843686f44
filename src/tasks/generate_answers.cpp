// `qlora generate --model M [--adapter DIR] --prompt TEXT`: greedy answers from a model, optionally
// with a trained PEFT adapter, through the training forward with a KV cache (CPU or CUDA).
#include "tasks/generate_answers.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/json_util.h"
#include "model/engine_spec.h"
#include "model/generate.h"
#include "model/peft_io.h"
#include "train/model_source.h"
#include "train/sample_answers.h"
#include "train/train_data.h"

namespace fs = std::filesystem;

namespace qlora {

namespace {


// The model (base + adapter) as training holds it, planned with a KV cache of kv_tokens positions
// and activations for prompts of up to seq_len tokens at a time.
std::unique_ptr<DecoderModel> load_model(const GenerateOptions& o, const ModelSource& src, Backend& be, int64_t seq_len,
                                       int64_t kv_tokens) {
  LoraSpec lora;  // no adapter: the base alone
  if (!o.adapter.empty()) {
    if (!fs::is_directory(o.adapter))
      fail(ErrorKind::Io, o.adapter, "adapter directory does not exist",
           "pass a directory with adapter_config.json and adapter_model.safetensors (a run's output_dir)");
    lora = read_peft_adapter_config(o.adapter + "/adapter_config.json");
  }
  EngineSpec spec;
  spec.base_precision = optional_base_precision(o.base_precision, "--base-precision");
  spec.method = default_method(spec.base_precision);
  spec.lora = lora;
  spec.micro_batch = 1;
  spec.seq_len = seq_len;
  spec.ce_chunk = 1;  // the LM head runs on the last token only
  spec.kv_cache_tokens = kv_tokens;
  ModelPlanOptions po = resolve_engine(spec, {be.compute_dtype()});
  adopt_stored_quantization(po, src.tensors);
  auto m = std::make_unique<DecoderModel>(src.config, be, po, lora);
  m->load_base(src.tensors);
  if (!o.adapter.empty()) {
    try {
      load_peft_adapter(o.adapter, *m);
    } catch (const Error& e) {
      // A tensor of the wrong shape or a missing layer: an adapter trained on another model.
      if (e.kind() != ErrorKind::Shape && e.message().rfind("not found", 0) != 0) throw;
      fail(e.kind(), e.where(), e.message() + ": the adapter does not fit model " + o.model,
           "use the adapter with the base model it was trained on");
    }
  }
  return m;
}

}  // namespace

void generate_answers(const GenerateOptions& o, const std::function<std::unique_ptr<Backend>()>& make_backend) {
  const auto t0 = std::chrono::steady_clock::now();
  ModelSource src = open_model_source(o.model);
  if (!src.tokenizer)
    fail(ErrorKind::Config, o.model, "the model has no tokenizer to encode the prompt with", "add its tokenizer.json");
  ChatRenderFn render;
  if (!o.raw) {
    render = resolve_chat_template(o.chat_template, src.tokenizer.get());
    if (!render && o.chat)
      fail(ErrorKind::Config, "--chat", "the model has no chat template", "pass --chat-template chatml (or another), or --raw");
  }
  // The KV cache holds the longest prompt and its answer; prompts go through in chunks of at most 512.
  int64_t longest = 1;
  for (const std::string& p : o.prompts) longest = std::max<int64_t>(longest, int64_t(encode_prompt(p, render, *src.tokenizer).size()));
  auto be = make_backend();
  std::unique_ptr<DecoderModel> model = load_model(o, src, *be, std::min<int64_t>(longest, 512), longest + o.max_new_tokens);
  auto gen = std::make_unique<Generator>(*model);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "model: %s%s | %s | backend %s | loaded in %.1f s\n", src.tensors.description.c_str(),
               o.adapter.empty() ? "" : (" + adapter " + o.adapter).c_str(),
               render ? ("chat template: " + chat_template_label(o.chat_template, src.tokenizer.get())).c_str()
                      : "raw prompt (no chat template)",
               be->name().c_str(), load_s);

  const auto answers = sample_answers(*gen, *src.tokenizer, render, o.prompts, o.max_new_tokens);
  std::printf("%s", format_sample_answers(answers).c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", sample_answers_speed(answers).c_str());
}

}  // namespace qlora
