// Train/eval data for a run: tokenizer and chat template from the config, weighted file mixes,
// eval split, packing, and the summary the user sees before training starts.
#include "train/train_data.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/gguf.h"
#include "model/llama_config.h"
#include "model/modes.h"
#include "text/tokenizer.h"

#include "text/chat_template.h"

namespace fs = std::filesystem;

namespace qlora {

using json = nlohmann::json;

TokenizerSource open_tokenizer_source(const std::string& path) {
  if (path.empty())
    fail(ErrorKind::Config, "model_name_or_path", "not set", "point it at a model directory, a tokenizer.json or a .gguf file");
  if (!fs::exists(path)) fail(ErrorKind::Io, path, "model path does not exist");
  TokenizerSource ts;
  auto ends_with = [&](const char* suf) {
    const std::string s = suf;
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  if (fs::is_directory(path)) {
    const bool has_cfg = fs::exists(path + "/config.json");
    const int64_t model_vocab = has_cfg ? load_hf_config(path + "/config.json").vocab_size : 0;
    if (fs::exists(path + "/tokenizer.json")) {
      ts.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::from_file(path + "/tokenizer.json"));
      ts.name = path + "/tokenizer.json";
    } else if (model_vocab >= 258) {
      ts.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::byte_level());
      ts.name = "byte-level (no tokenizer.json)";
    } else {
      if (!has_cfg) fail(ErrorKind::Io, path, "no tokenizer.json or config.json in the directory");
      ts.name = "none (pre-tokenized data only)";
    }
    ts.vocab_size = std::max<int64_t>(model_vocab, ts.tokenizer ? ts.tokenizer->vocab_size() : 0);
    return ts;
  }
  if (ends_with(".gguf")) {
    GgufFile g(path);
    ts.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::from_gguf(g));
    ts.name = "GGUF vocabulary";
  } else {
    ts.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::from_file(path));
    ts.name = path;
  }
  ts.vocab_size = ts.tokenizer->vocab_size();
  return ts;
}

std::vector<DatasetSpec> dataset_specs(const TrainConfig& cfg) {
  const DatasetFormat global = parse_format(cfg.dataset_format, "config key 'dataset_format'");
  if (cfg.dataset_mix.empty()) return {DatasetSpec{cfg.train_file, 1.0, global}};
  std::vector<DatasetSpec> out;
  for (const std::string& entry : cfg.dataset_mix) {
    const std::string where = "config key 'dataset_mix' entry '" + entry + "'";
    DatasetSpec s{entry, 1.0, global};
    // Options are "key=value" words at the end; everything before them is the path.
    for (;;) {
      const size_t sp = s.path.find_last_of(' ');
      if (sp == std::string::npos) break;
      const std::string word = s.path.substr(sp + 1);
      if (word.rfind("weight=", 0) == 0) {
        char* end = nullptr;
        s.weight = std::strtod(word.c_str() + 7, &end);
        if (*end != '\0' || !(s.weight > 0))
          fail(ErrorKind::Config, where, "'" + word + "' is not a positive weight", "e.g. weight=2 or weight=0.5");
      } else if (word.rfind("format=", 0) == 0) {
        s.format = parse_format(word.substr(7), where);
      } else if (!word.empty()) {
        break;
      }
      s.path.erase(sp);
    }
    if (s.path.empty()) fail(ErrorKind::Config, where, "has no path");
    out.push_back(s);
  }
  return out;
}

namespace {

enum class TemplateKind { None, Tokenizer, Inline, File, Builtin };

TemplateKind template_kind(const std::string& value, const Tokenizer* tok) {
  if (value.empty() || value == "tokenizer_default")
    return tok && !tok->chat_template().empty() ? TemplateKind::Tokenizer : TemplateKind::None;
  if (value.find("{%") != std::string::npos || value.find("{{") != std::string::npos) return TemplateKind::Inline;
  if ((value.size() > 6 && value.compare(value.size() - 6, 6, ".jinja") == 0) || fs::is_regular_file(value))
    return TemplateKind::File;
  return TemplateKind::Builtin;
}

}  // namespace

std::string chat_template_label(const std::string& value, const Tokenizer* tok) {
  switch (template_kind(value, tok)) {
    case TemplateKind::None: return "none (alpaca rows use the built-in alpaca format)";
    case TemplateKind::Tokenizer: return "the tokenizer's chat_template";
    case TemplateKind::Inline: return "chat_template (inline Jinja)";
    case TemplateKind::File: return value;
    case TemplateKind::Builtin: break;
  }
  return "built-in " + value;
}

ChatRenderFn resolve_chat_template(const std::string& value, const Tokenizer* tok) {
  const TemplateKind kind = template_kind(value, tok);
  const std::string label = chat_template_label(value, tok);
  const bool builtin = kind == TemplateKind::Builtin;
  std::string src;
  if (kind == TemplateKind::None) return {};
  if (kind == TemplateKind::Tokenizer) src = tok->chat_template();
  if (kind == TemplateKind::Inline) src = value;
  if (kind == TemplateKind::File) {
    std::ifstream in(value, std::ios::binary);
    if (!in) fail(ErrorKind::Io, value, "cannot read chat template file", "chat_template names a .jinja file that must exist");
    std::stringstream ss;
    ss << in.rdbuf();
    src = ss.str();
  }
  auto t = std::make_shared<const ChatTemplate>(builtin ? ChatTemplate::builtin(value) : ChatTemplate::from_source(src, label));
  // Templates read the special tokens as variables, as transformers passes them. A token whose
  // text does not encode back to it (the raw byte-level fallback) is passed as "": printing "</s>"
  // as bytes would train on text, not on the EOS token, which the data layer then inserts itself.
  json specials = json::object();
  if (tok) {
    auto put = [&](const char* key, std::optional<int32_t> id) {
      if (!id) return;
      const auto s = tok->id_to_token(*id);
      specials[key] = s && tok->encode(*s, false) == std::vector<int32_t>{*id} ? *s : std::string();
    };
    put("bos_token", tok->bos_id());
    put("eos_token", tok->eos_id());
    put("pad_token", tok->pad_id());
    put("unk_token", tok->unk_id());
  }
  return [t, specials](const json& msgs, bool gen, const json& extra) {
    json ctx = specials;
    ctx.update(extra);
    return t->render(msgs, gen, ctx);
  };
}

namespace {

// Templates are resolved at the first chat row: text-only data never needs one. Problems with
// the template itself are Config errors, which no row-skipping hides; every row that needs the
// template then gets the same error. Rows are prepared on several threads (load_dataset): the
// first to arrive resolves, under a lock, and the others wait for it.
struct LazyTemplates {
  std::string value;
  const Tokenizer* tok = nullptr;
  std::mutex mu;
  std::atomic<bool> done{false};
  std::optional<Error> error;  // resolving failed: rethrown to every caller
  ChatRenderFn render, alpaca;
  void resolve() {
    if (!done.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mu);
      if (!done.load(std::memory_order_relaxed)) {
        try {
          render = resolve_chat_template(value, tok);
        } catch (const Error& e) {
          error = Error(ErrorKind::Config, e.where(), "chat_template: " + e.message(), e.hint());
        }
        if (!error && !render) {
          try {
            alpaca = resolve_chat_template("alpaca", tok);
          } catch (const Error&) {
            alpaca = nullptr;  // alpaca rows then fail like other chat rows, naming the missing template
          }
        }
        done.store(true, std::memory_order_release);
      }
    }
    if (error) throw *error;
  }
};

ChatRenderFn lazy_render(std::shared_ptr<LazyTemplates> t, bool for_alpaca) {
  return [t, for_alpaca](const json& m, bool g, const json& e) {
    t->resolve();
    if (t->render) return t->render(m, g, e);
    if (for_alpaca && t->alpaca) return t->alpaca(m, g, e);
    fail(ErrorKind::Config, "chat_template",
         "chat rows need a chat template, but the tokenizer has none and chat_template is not set",
         "set chat_template: chatml (or llama3, mistral, alpaca, or a path to a .jinja file)");
  };
}

}  // namespace

DatasetOptions dataset_options(const TrainConfig& cfg, const TokenizerSource& ts) {
  DatasetOptions o;
  o.fields.text = cfg.dataset_text_field;
  o.fields.messages = cfg.field_messages;
  o.fields.role = cfg.message_field_role;
  o.fields.content = cfg.message_field_content;
  o.mask.train_on_inputs = cfg.train_on_inputs;
  o.mask.roles_to_train = cfg.roles_to_train;
  o.mask.prompt_nll = parse_objective(cfg.rl, "rl") == Objective::Orpo;  // ORPO's NLL also scores the prompt
  o.max_length = cfg.max_length;
  o.truncation = cfg.truncation;
  o.skip_bad_rows = cfg.skip_bad_rows;
  o.vocab_size = ts.vocab_size;
  auto t = std::make_shared<LazyTemplates>();
  t->value = cfg.chat_template;
  t->tok = ts.tokenizer.get();
  o.render = lazy_render(t, false);
  o.alpaca_render = lazy_render(t, true);
  return o;
}

namespace {

// The rows a file gave must be what the objective trains on: SFT rows for sft, chosen/rejected
// pairs for dpo/orpo/simpo, rated completions for kto.
void check_objective_rows(const TrainConfig& cfg, const std::vector<Example>& rows, const std::string& path) {
  const Objective obj = parse_objective(cfg.rl, "rl");
  for (const Example& e : rows) {
    const bool pref = !e.roles.empty();
    const bool unpaired = pref && (e.roles.back() == DocRole::Desirable || e.roles.back() == DocRole::Undesirable);
    if (!is_preference(obj) && pref)
      fail(ErrorKind::Config, path, std::string("the file holds preference rows (") +
                                        (unpaired ? "prompt/completion/label" : "chosen/rejected") +
                                        ") but the objective is rl: sft",
           unpaired ? "set rl: kto to train on them" : "set rl: dpo, orpo or simpo to train on them");
    if (is_preference(obj) && !pref)
      fail(ErrorKind::Config, path, std::string("rl: ") + cfg.rl + " trains on preference rows, and this file's are not",
           obj == Objective::Kto ? "rows need 'prompt', 'completion' and a boolean 'label'"
                                 : "rows need 'chosen' and 'rejected' (and optionally 'prompt')");
    if (obj == Objective::Kto && pref && !unpaired)
      fail(ErrorKind::Config, path, "rl: kto trains on rated completions (prompt/completion/label), and this file has pairs",
           "use rl: dpo, orpo or simpo for chosen/rejected rows");
    if (is_preference(obj) && obj != Objective::Kto && unpaired)
      fail(ErrorKind::Config, path, std::string("rl: ") + cfg.rl + " trains on chosen/rejected pairs, and this file has "
                                        "rated completions (prompt/completion/label)",
           "use rl: kto for them");
  }
}

// KTO's KL probes, paired within runs of the train batch size as TRL pairs them.
void add_objective_docs(const TrainConfig& cfg, std::vector<Example>& rows) {
  if (parse_objective(cfg.rl, "rl") == Objective::Kto)
    add_kl_probes(rows, cfg.per_device_train_batch_size, cfg.max_length, cfg.truncation);
}

std::vector<Example> load_eval_file(const TrainConfig& cfg, const TokenizerSource& ts, const DatasetOptions& opt,
                                    DatasetFormat format) {
  DatasetStats es;
  std::vector<Example> rows = load_dataset(DatasetSpec{cfg.eval_file, 1.0, format}, ts.tokenizer.get(), opt, &es);
  check_objective_rows(cfg, rows, cfg.eval_file);
  add_objective_docs(cfg, rows);
  return rows;
}

// Eval rows are packed with their own seed, so the train packing never changes them.
std::vector<Example> pack_eval(const TrainConfig& cfg, std::vector<Example> eval) {
  if (!cfg.packing || eval.empty()) return eval;
  return pack_examples(eval, cfg.max_length, uint64_t(cfg.seed) + 1, nullptr);
}

int32_t pad_id_of(const TokenizerSource& ts) { return ts.tokenizer && ts.tokenizer->eos_id() ? *ts.tokenizer->eos_id() : 0; }

}  // namespace

EvalData load_eval_data(const TrainConfig& cfg, const TokenizerSource& ts,
                        const std::function<void(const std::string&)>& log) {
  EvalData e;
  e.tokenizer_name = ts.name;
  e.template_name = chat_template_label(cfg.chat_template, ts.tokenizer.get());
  e.pad_id = pad_id_of(ts);
  std::vector<Example> rows;
  if (!cfg.eval_file.empty()) {
    rows = load_eval_file(cfg, ts, dataset_options(cfg, ts), dataset_specs(cfg)[0].format);
    e.source = cfg.eval_file;
  } else if (cfg.val_set_size > 0) {
    TrainConfig unpacked = cfg;  // split as training does; packing below, once
    unpacked.packing = false;
    rows = std::move(load_train_data(unpacked, ts, log).eval);
    std::string files;
    for (const DatasetSpec& s : dataset_specs(cfg)) files += (files.empty() ? "" : ", ") + s.path;
    e.source = "val_set_size split of " + files;
  } else {
    fail(ErrorKind::Config, "eval_file", "the config has no eval data (neither eval_file nor val_set_size is set)",
         "pass --data FILE, or set eval_file: or val_set_size: in the config");
  }
  if (rows.empty())
    fail(ErrorKind::Data, e.source, "no eval examples (every row was empty, dropped or without a trained token)");
  e.examples = int64_t(rows.size());
  e.rows = pack_eval(cfg, std::move(rows));
  for (const Example& x : e.rows) e.longest = std::max<int64_t>(e.longest, int64_t(x.ids.size()));
  log("data: eval " + e.source + ": " + std::to_string(e.examples) + " examples" +
      (cfg.packing ? " in " + std::to_string(e.rows.size()) + " packed rows" : std::string()) + " [tokenizer: " +
      e.tokenizer_name + "; chat template: " + e.template_name + "]");
  return e;
}

TrainData load_train_data(const TrainConfig& cfg, const TokenizerSource& ts,
                          const std::function<void(const std::string&)>& log,
                          const std::function<void(const std::string&)>& progress) {
  TrainData d;
  d.tokenizer_name = ts.name;
  DatasetOptions opt = dataset_options(cfg, ts);
  d.template_name = chat_template_label(cfg.chat_template, ts.tokenizer.get());
  d.threads = omp_get_max_threads();
  const std::vector<DatasetSpec> specs = dataset_specs(cfg);
  std::vector<std::vector<Example>> per_file;
  int64_t total = 0;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  for (const DatasetSpec& spec : specs) {
    DataFileReport fr;
    fr.spec = spec;
    // Progress on a long file: a line after 2 s, then every 10 s (rows/s and the ETA by bytes read).
    const auto start = clock::now();
    auto next = start + std::chrono::seconds(2);
    opt.progress = [&, start](int64_t rows, int64_t done, int64_t total_bytes) {
      const auto now = clock::now();
      if (now < next || total_bytes <= 0 || done >= total_bytes) return;
      next = now + std::chrono::seconds(10);
      const double s = std::chrono::duration<double>(now - start).count();
      char line[256];
      std::snprintf(line, sizeof line, "data: %s: %.0f%% (%lld rows, %.0f rows/s on %d thread%s), ETA %.0f s",
                    spec.path.c_str(), 100.0 * double(done) / double(total_bytes), (long long)rows, double(rows) / s,
                    d.threads, d.threads == 1 ? "" : "s", s * double(total_bytes - done) / double(std::max<int64_t>(done, 1)));
      (progress ? progress : log)(line);
    };
    per_file.push_back(load_dataset(spec, ts.tokenizer.get(), opt, &fr.stats));
    check_objective_rows(cfg, per_file.back(), spec.path);
    total += int64_t(per_file.back().size());
    d.stats.add(fr.stats);
    d.files.push_back(std::move(fr));
  }
  // The eval split comes before the weights, so a repeated row never lands on both sides.
  std::vector<bool> to_eval;
  if (cfg.eval_file.empty() && cfg.val_set_size > 0) {
    const int64_t n_eval = cfg.val_set_size < 1 ? std::max<int64_t>(1, int64_t(cfg.val_set_size * double(total)))
                                                : int64_t(cfg.val_set_size);
    to_eval = eval_mask(size_t(total), n_eval, uint64_t(cfg.seed));
  }
  size_t row = 0;
  for (size_t i = 0; i < specs.size(); i++) {
    std::vector<Example> keep;
    for (Example& e : per_file[i]) (!to_eval.empty() && to_eval[row++] ? d.eval : keep).push_back(std::move(e));
    keep = apply_weight(std::move(keep), specs[i].weight, uint64_t(cfg.seed) + 7919 * i);
    d.files[i].weighted = int64_t(keep.size());
    d.train.insert(d.train.end(), std::make_move_iterator(keep.begin()), std::make_move_iterator(keep.end()));
  }
  add_objective_docs(cfg, d.train);
  if (cfg.eval_file.empty()) add_objective_docs(cfg, d.eval);
  d.prepare_s = std::chrono::duration<double>(clock::now() - t0).count();
  opt.progress = nullptr;
  if (!cfg.eval_file.empty()) d.eval = load_eval_file(cfg, ts, opt, specs[0].format);
  const auto t_pack = clock::now();
  if (cfg.packing) d.train = pack_examples(d.train, cfg.max_length, uint64_t(cfg.seed), &d.pack);
  d.pack_s = std::chrono::duration<double>(clock::now() - t_pack).count();
  d.eval = pack_eval(cfg, std::move(d.eval));
  for (const auto* set : {&d.train, &d.eval})
    for (const Example& e : *set) d.longest = std::max<int64_t>(d.longest, int64_t(e.ids.size()));
  d.pad_id = pad_id_of(ts);
  for (const std::string& line : describe_train_data(d, cfg)) log(line);
  return d;
}

TrainData load_train_data(const TrainConfig& cfg, const ModelSource& src,
                          const std::function<void(const std::string&)>& log) {
  TokenizerSource ts{src.tokenizer, src.encoder.name, src.config.vocab_size};
  return load_train_data(cfg, ts, log);
}

std::vector<std::string> describe_train_data(const TrainData& d, const TrainConfig& cfg) {
  const DatasetStats& st = d.stats;
  auto pct = [](int64_t a, int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", b ? 100.0 * double(a) / double(b) : 0.0);
    return std::string(buf);
  };
  std::vector<std::string> out;
  std::string files;
  for (const auto& f : d.files) {
    char w[32];
    std::snprintf(w, sizeof w, "%g", f.spec.weight);
    files += (files.empty() ? "" : ", ") + f.spec.path + " (" + f.stats.format + ", " + std::to_string(f.stats.examples) +
             " examples" + (f.spec.weight != 1.0 ? ", weight " + std::string(w) + " -> " + std::to_string(f.weighted) : "") +
             ")";
  }
  out.push_back("data: " + files + " [tokenizer: " + d.tokenizer_name + "; chat template: " + d.template_name + "]");
  int64_t weighted = 0;
  for (const auto& f : d.files) weighted += f.weighted;
  out.push_back("data: " + std::to_string(st.rows) + " rows -> " + std::to_string(st.examples) + " examples" +
                (weighted != st.examples ? " (" + std::to_string(weighted) + " with weights)" : std::string()) + ", " +
                std::to_string(st.tokens) + " tokens (" + std::to_string(st.trained_tokens) + " trained, " +
                pct(st.trained_tokens, st.tokens) + "), longest " + std::to_string(st.longest) +
                (is_preference(parse_objective(cfg.rl, "rl")) ? " (a row: two sequences)" : "") + " | max_length " +
                std::to_string(cfg.max_length) + ": truncated " + std::to_string(st.truncated) + " (" + cfg.truncation +
                "), dropped " + std::to_string(st.dropped) + " | skipped: " + std::to_string(st.no_loss) +
                " without a trained token, " + std::to_string(st.bad_rows) + " bad rows");
  for (const auto& m : st.bad_row_messages) out.push_back("data: skipped bad row: " + m);
  if (st.split_mismatch)
    out.push_back("data: warning: " + std::to_string(st.split_mismatch) +
                  " rows tokenize differently turn by turn than as one text; their ids follow the turn split "
                  "(the loss mask stays exact)");
  if (st.double_bos)
    out.push_back("data: warning: " + std::to_string(st.double_bos) +
                  " rows start with two BOS tokens (the template and the tokenizer both add one)");
  if (st.eos_added)
    out.push_back("data: " + std::to_string(st.eos_added) +
                  " EOS tokens inserted after trained turns that the template does not end with a special token");
  if (d.pack.rows)
    out.push_back("data: packing " + std::to_string(d.pack.documents) + " examples into " + std::to_string(d.pack.rows) +
                  " rows of " + std::to_string(d.pack.capacity) + " tokens (efficiency " +
                  pct(d.pack.tokens, d.pack.rows * d.pack.capacity) + ")");
  {
    char t[200];
    std::snprintf(t, sizeof t, "data: prepared in %.2f s (%.0f rows/s on %d thread%s)", d.prepare_s,
                  d.prepare_s > 0 ? double(st.rows) / d.prepare_s : 0.0, d.threads, d.threads == 1 ? "" : "s");
    std::string line = t;
    if (d.pack.rows) {
      std::snprintf(t, sizeof t, ", packed in %.2f s", d.pack_s);
      line += t;
    }
    out.push_back(line);
  }
  if (!d.eval.empty()) out.push_back("data: eval " + std::to_string(d.eval.size()) + (cfg.packing ? " packed rows" : " examples"));
  return out;
}

}  // namespace qlora
