// Train/eval data for a run: tokenizer and chat template from the config, weighted file mixes,
// eval split, packing, and the summary the user sees before training starts.
#include "train/train_data.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <mutex>
#include <optional>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/gguf.h"
#include "train/data_cache.h"
#include "train/data_report.h"
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
  const DatasetFormat global = cfg.dataset_format;
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
  RowJson specials = RowJson::object();
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
  return [t, specials](const RowJson& msgs, bool gen, const RowJson& extra) {
    RowJson ctx = specials;
    ctx.update(extra);
    return t->render_with_spans(msgs, gen, ctx);
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
  return [t, for_alpaca](const RowJson& m, bool g, const RowJson& e) {
    t->resolve();
    if (t->render) return t->render(m, g, e);
    if (for_alpaca && t->alpaca) return t->alpaca(m, g, e);
    fail(ErrorKind::Config, "chat_template",
         "chat rows need a chat template, but the tokenizer has none and chat_template is not set",
         "set chat_template: chatml (or llama3, mistral, alpaca, gemma, or a path to a .jinja file)");
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
  o.mask.prompt_nll = cfg.rl == Objective::Orpo;  // ORPO's NLL also scores the prompt
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

// A file's rows must be what the objective trains on: SFT rows for sft, chosen/rejected pairs for
// dpo/orpo/simpo, rated completions for kto.
void check_objective_row(const TrainConfig& cfg, Objective obj, const Example& e, const std::string& path) {
  const bool pref = !e.roles.empty();
  const bool unpaired = pref && (e.roles.back() == DocRole::Desirable || e.roles.back() == DocRole::Undesirable);
  if (!is_preference(obj) && pref)
    fail(ErrorKind::Config, path, std::string("the file holds preference rows (") +
                                      (unpaired ? "prompt/completion/label" : "chosen/rejected") +
                                      ") but the objective is rl: sft",
         unpaired ? "set rl: kto to train on them" : "set rl: dpo, orpo or simpo to train on them");
  if (is_preference(obj) && !pref)
    fail(ErrorKind::Config, path, std::string("rl: ") + objective_name(cfg.rl) + " trains on preference rows, and this file's are not",
         obj == Objective::Kto ? "rows need 'prompt', 'completion' and a boolean 'label'"
                               : "rows need 'chosen' and 'rejected' (and optionally 'prompt')");
  if (obj == Objective::Kto && pref && !unpaired)
    fail(ErrorKind::Config, path, "rl: kto trains on rated completions (prompt/completion/label), and this file has pairs",
         "use rl: dpo, orpo or simpo for chosen/rejected rows");
  if (is_preference(obj) && obj != Objective::Kto && unpaired)
    fail(ErrorKind::Config, path, std::string("rl: ") + objective_name(cfg.rl) + " trains on chosen/rejected pairs, and this file has "
                                      "rated completions (prompt/completion/label)",
         "use rl: kto for them");
}

// Reads one file into the writer (each example checked against the objective as it comes);
// returns its records [first, end).
std::pair<int64_t, int64_t> load_into(ExampleWriter& w, const TrainConfig& cfg, const DatasetSpec& spec,
                                      const TokenizerSource& ts, DatasetOptions opt, DatasetStats* stats) {
  const Objective obj = cfg.rl;
  const int64_t first = int64_t(w.count());
  opt.sink = [&](Example&& e) {
    check_objective_row(cfg, obj, e, spec.path);
    w.add(e);
  };
  load_dataset(spec, ts.tokenizer.get(), opt, stats);
  return {first, int64_t(w.count())};
}

// KTO's KL probes, paired within runs of the train batch size as TRL pairs them: the examples are
// read back, given their probe and stored again as new records.
std::vector<int64_t> with_objective_docs(const TrainConfig& cfg, ExampleWriter& w, std::vector<int64_t> recs) {
  if (cfg.rl != Objective::Kto) return recs;
  std::vector<Example> ex;
  for (int64_t r : recs) ex.push_back(w.get(size_t(r)));
  add_kl_probes(ex, cfg.per_device_train_batch_size, cfg.max_length, cfg.truncation);
  std::vector<int64_t> out;
  for (const Example& e : ex) out.push_back(w.add(e));
  return out;
}

// The rows of a set: packed by first-fit decreasing (pack_examples' bins, from the records'
// lengths alone) or one record each.
RowPlan plan_rows(const ExampleWriter& w, const std::vector<int64_t>& recs, bool pack, int64_t capacity, uint64_t seed,
                  PackStats* stats) {
  RowPlan p;
  p.packed = pack && !recs.empty();
  if (!p.packed) {
    for (int64_t r : recs) p.add_row({r});
    return p;
  }
  std::vector<int64_t> lengths(recs.size());
  for (size_t i = 0; i < recs.size(); i++) lengths[i] = w.tokens(size_t(recs[i]));
  PackStats st;
  st.documents = int64_t(recs.size());
  st.capacity = capacity;
  std::vector<int64_t> row;
  for (const auto& bin : pack_ffd(lengths, capacity, seed)) {
    row.clear();
    for (int64_t d : bin) row.push_back(recs[size_t(d)]), st.tokens += lengths[size_t(d)];
    p.add_row(row);
  }
  st.rows = int64_t(p.rows());
  if (stats) *stats = st;
  return p;
}

int32_t pad_id_of(const TokenizerSource& ts) { return ts.tokenizer && ts.tokenizer->eos_id() ? *ts.tokenizer->eos_id() : 0; }

// ---- the note stored with the prepared data: what the report needs, without preparing again

nlohmann::json stats_json(const DatasetStats& s) {
  return {{"rows", s.rows},           {"examples", s.examples},
          {"tokens", s.tokens},       {"trained_tokens", s.trained_tokens},
          {"longest", s.longest},     {"truncated", s.truncated},
          {"dropped", s.dropped},     {"no_loss", s.no_loss},
          {"bad_rows", s.bad_rows},   {"split_mismatch", s.split_mismatch},
          {"double_bos", s.double_bos}, {"eos_added", s.eos_added}, {"generation_marked", s.generation_marked},
          {"bad_row_messages", s.bad_row_messages}, {"format", s.format}};
}

DatasetStats stats_from(const nlohmann::json& j) {
  DatasetStats s;
  s.rows = j.at("rows"), s.examples = j.at("examples"), s.tokens = j.at("tokens");
  s.trained_tokens = j.at("trained_tokens"), s.longest = j.at("longest"), s.truncated = j.at("truncated");
  s.dropped = j.at("dropped"), s.no_loss = j.at("no_loss"), s.bad_rows = j.at("bad_rows");
  s.split_mismatch = j.at("split_mismatch"), s.double_bos = j.at("double_bos"), s.eos_added = j.at("eos_added");
  s.generation_marked = j.at("generation_marked");
  s.bad_row_messages = j.at("bad_row_messages").get<std::vector<std::string>>();
  s.format = j.at("format");
  return s;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json train_meta(const TrainData& d, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  nlohmann::json files = nlohmann::json::array();
  for (size_t i = 0; i < d.files.size(); i++) {
    const DataFileReport& f = d.files[i];
    files.push_back({{"path", f.spec.path}, {"weight", f.spec.weight}, {"format", format_name(f.spec.format)},
                     {"stats", stats_json(f.stats)}, {"weighted", f.weighted},
                     {"records", {ranges[i].first, ranges[i].second}}});
  }
  return {{"kind", "train"},
          {"stats", stats_json(d.stats)},
          {"files", files},
          {"pack", {{"documents", d.pack.documents}, {"rows", d.pack.rows}, {"tokens", d.pack.tokens},
                    {"capacity", d.pack.capacity}}},
          {"longest", d.longest},
          {"tokenizer", d.tokenizer_name},
          {"template", d.template_name},
          {"prepare_seconds", d.prepare_s},
          {"pack_seconds", d.pack_s},
          {"threads", d.threads},
          {"prepared_at", d.cache.prepared_at}};
}

TrainData train_from_store(const std::shared_ptr<const ExampleStore>& store) {
  const nlohmann::json& m = store->meta();
  if (m.value("kind", "") != "train") fail(ErrorKind::Data, store->path(), "prepared data for another purpose");
  TrainData d;
  d.stats = stats_from(m.at("stats"));
  for (const auto& f : m.at("files")) {
    DataFileReport r;
    r.spec.path = f.at("path");
    r.spec.weight = f.at("weight");
    r.spec.format = parse_format(f.at("format").get<std::string>(), store->path());
    r.stats = stats_from(f.at("stats"));
    r.weighted = f.at("weighted");
    const int64_t first = f.at("records").at(0), end = f.at("records").at(1);
    for (int64_t k = first; k < end && size_t(k) < store->count(); k++) d.stats.lengths.push_back(int32_t(store->tokens(size_t(k))));
    d.files.push_back(std::move(r));
  }
  const auto& p = m.at("pack");
  d.pack.documents = p.at("documents"), d.pack.rows = p.at("rows"), d.pack.tokens = p.at("tokens");
  d.pack.capacity = p.at("capacity");
  d.longest = m.at("longest");
  d.tokenizer_name = m.at("tokenizer");
  d.template_name = m.at("template");
  d.prepare_s = m.at("prepare_seconds");
  d.pack_s = m.at("pack_seconds");
  d.threads = m.at("threads");
  d.cache.prepared_at = m.at("prepared_at");
  d.train = ExampleSet(store, store->plan(0));
  d.eval = ExampleSet(store, store->plan(1));
  return d;
}

int64_t longest_row(const ExampleSet& s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); i++) n = std::max(n, s.length(i));
  return n;
}

// The cache file of a key, or "" (with the reason in `note`) when caching is off or its folder
// cannot be made.
std::string cache_file(const TrainConfig& cfg, const std::string& key, std::string* note) {
  const std::string dir = data_cache_dir(cfg);
  if (dir.empty()) {
    *note = cfg.dataset_prepared_path == "none" ? "dataset_prepared_path: none" : "no cache folder (HOME is not set)";
    return "";
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    *note = "cannot create the cache folder " + dir + ": " + ec.message() + " (set dataset_prepared_path)";
    return "";
  }
  // A preparation that was killed leaves its temporary file: gone after a day (one still being
  // written by another run is younger).
  const auto day_ago = fs::file_time_type::clock::now() - std::chrono::hours(24);
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".qlora-data.tmp-") != std::string::npos && e.last_write_time(ec) < day_ago)
      fs::remove(e.path(), ec);
  return (fs::path(dir) / (key + ".qlora-data")).string();
}

// An existing cache file of `key`, checked whole; null (and `note` says why) when there is none
// usable.
std::shared_ptr<const ExampleStore> open_cached(const std::string& path, const std::string& key, std::string* note) {
  std::error_code ec;
  if (path.empty() || !fs::exists(path, ec)) return nullptr;
  std::string why;
  auto store = ExampleStore::open(path, key, &why);
  if (!store) *note = path + " was not used: " + why + "; prepared again";
  return store;
}

TrainData prepare_train(const TrainConfig& cfg, const TokenizerSource& ts, const std::string& path, const std::string& key,
                        const std::function<void(const std::string&)>& log,
                        const std::function<void(const std::string&)>& progress) {
  TrainData d;
  d.tokenizer_name = ts.name;
  d.template_name = chat_template_label(cfg.chat_template, ts.tokenizer.get());
  d.threads = omp_get_max_threads();
  d.cache.prepared_at = utc_now();
  DatasetOptions opt = dataset_options(cfg, ts);
  const std::vector<DatasetSpec> specs = dataset_specs(cfg);
  ExampleWriter w(path, key);
  std::vector<std::pair<int64_t, int64_t>> ranges;
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
    ranges.push_back(load_into(w, cfg, spec, ts, opt, &fr.stats));
    d.stats.add(fr.stats);    // the lengths move to the whole set's stats
    fr.stats.lengths.clear();
    d.files.push_back(std::move(fr));
  }
  const int64_t total = int64_t(w.count());
  // The eval split comes before the weights, so a repeated row never lands on both sides.
  std::vector<bool> to_eval;
  if (cfg.eval_file.empty() && cfg.val_set_size > 0) {
    const int64_t n_eval = cfg.val_set_size < 1 ? std::max<int64_t>(1, int64_t(cfg.val_set_size * double(total)))
                                                : int64_t(cfg.val_set_size);
    to_eval = eval_mask(size_t(total), n_eval, uint64_t(cfg.seed));
  }
  std::vector<int64_t> train_recs, eval_recs;
  for (size_t i = 0; i < specs.size(); i++) {
    std::vector<int64_t> keep;
    for (int64_t r = ranges[i].first; r < ranges[i].second; r++)
      (!to_eval.empty() && to_eval[size_t(r)] ? eval_recs : keep).push_back(r);
    const std::vector<int64_t> pick = weight_indices(keep.size(), specs[i].weight, uint64_t(cfg.seed) + 7919 * i);
    d.files[i].weighted = int64_t(pick.size());
    for (int64_t k : pick) train_recs.push_back(keep[size_t(k)]);
  }
  train_recs = with_objective_docs(cfg, w, std::move(train_recs));
  if (cfg.eval_file.empty()) eval_recs = with_objective_docs(cfg, w, std::move(eval_recs));
  d.prepare_s = std::chrono::duration<double>(clock::now() - t0).count();
  opt.progress = nullptr;
  if (!cfg.eval_file.empty()) {
    DatasetStats es;
    const auto [first, end] = load_into(w, cfg, DatasetSpec{cfg.eval_file, 1.0, specs[0].format}, ts, opt, &es);
    for (int64_t r = first; r < end; r++) eval_recs.push_back(r);
    eval_recs = with_objective_docs(cfg, w, std::move(eval_recs));
  }
  const auto t_pack = clock::now();
  const RowPlan train = plan_rows(w, train_recs, cfg.packing, cfg.max_length, uint64_t(cfg.seed), &d.pack);
  d.pack_s = std::chrono::duration<double>(clock::now() - t_pack).count();
  // Eval rows are packed with their own seed, so the train packing never changes them.
  const RowPlan eval = plan_rows(w, eval_recs, cfg.packing, cfg.max_length, uint64_t(cfg.seed) + 1, nullptr);
  for (const RowPlan* p : {&train, &eval})
    for (size_t r = 0; r < p->rows(); r++) {
      int64_t n = 0;
      for (int64_t k = p->row_off[r]; k < p->row_off[r + 1]; k++) n += w.tokens(size_t(p->items[size_t(k)]));
      d.longest = std::max(d.longest, n);
    }
  const auto t_write = clock::now();
  auto store = w.finish(train, eval, train_meta(d, ranges));
  d.write_s = std::chrono::duration<double>(clock::now() - t_write).count();
  d.train = ExampleSet(store, train);
  d.eval = ExampleSet(store, eval);
  d.cache.path = path;
  d.cache.bytes = int64_t(store->bytes());
  return d;
}

}  // namespace

EvalData load_eval_data(const TrainConfig& cfg, const TokenizerSource& ts,
                        const std::function<void(const std::string&)>& log) {
  EvalData e;
  e.tokenizer_name = ts.name;
  e.template_name = chat_template_label(cfg.chat_template, ts.tokenizer.get());
  e.pad_id = pad_id_of(ts);
  if (!cfg.eval_file.empty()) {
    e.source = cfg.eval_file;
    const std::string key = data_cache_key(cfg, ts, DataPurpose::EvalFile);
    const std::string path = cache_file(cfg, key, &e.cache.note);
    const auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<const ExampleStore> store = open_cached(path, key, &e.cache.note);
    if (store && store->meta().value("kind", "") == "eval") {
      e.cache.reused = true;
      e.cache.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      ExampleWriter w(path, key);
      DatasetStats es;
      const auto [first, end] = load_into(w, cfg, DatasetSpec{cfg.eval_file, 1.0, dataset_specs(cfg)[0].format}, ts,
                                          dataset_options(cfg, ts), &es);
      std::vector<int64_t> recs;
      for (int64_t r = first; r < end; r++) recs.push_back(r);
      recs = with_objective_docs(cfg, w, std::move(recs));
      const RowPlan plan = plan_rows(w, recs, cfg.packing, cfg.max_length, uint64_t(cfg.seed) + 1, nullptr);
      store = w.finish(RowPlan{}, plan, {{"kind", "eval"}, {"examples", recs.size()}, {"prepared_at", utc_now()}});
    }
    e.cache.path = path;
    e.cache.bytes = int64_t(store->bytes());
    e.cache.prepared_at = store->meta().value("prepared_at", "");
    e.examples = store->meta().at("examples");
    e.rows = ExampleSet(store, store->plan(1));
  } else if (cfg.val_set_size > 0) {
    TrainData d = load_train_data(cfg, ts, log);
    e.rows = d.eval;
    e.examples = int64_t(d.eval.plan().items.size());
    e.cache = d.cache;
    std::string files;
    for (const DatasetSpec& s : dataset_specs(cfg)) files += (files.empty() ? "" : ", ") + s.path;
    e.source = "val_set_size split of " + files;
  } else {
    fail(ErrorKind::Config, "eval_file", "the config has no eval data (neither eval_file nor val_set_size is set)",
         "pass --data FILE, or set eval_file: or val_set_size: in the config");
  }
  if (e.rows.empty())
    fail(ErrorKind::Data, e.source, "no eval examples (every row was empty, dropped or without a trained token)");
  e.longest = longest_row(e.rows);
  log("data: eval " + e.source + ": " + std::to_string(e.examples) + " examples" +
      (cfg.packing ? " in " + std::to_string(e.rows.size()) + " packed rows" : std::string()) + " [tokenizer: " +
      e.tokenizer_name + "; chat template: " + e.template_name + "]");
  if (!e.cache.note.empty()) log("data: prepared-data cache: " + e.cache.note);
  else if (e.cache.reused) log("data: eval rows read from the prepared-data cache " + e.cache.path);
  return e;
}

TrainData load_train_data(const TrainConfig& cfg, const TokenizerSource& ts,
                          const std::function<void(const std::string&)>& log,
                          const std::function<void(const std::string&)>& progress) {
  const std::string key = data_cache_key(cfg, ts, DataPurpose::Train);
  std::string note;
  const std::string path = cache_file(cfg, key, &note);
  const auto t0 = std::chrono::steady_clock::now();
  TrainData d;
  if (auto store = open_cached(path, key, &note)) {
    d = train_from_store(store);
    d.cache.path = path;
    d.cache.reused = true;
    d.cache.bytes = int64_t(store->bytes());
    d.cache.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else {
    d = prepare_train(cfg, ts, path, key, log, progress);
  }
  d.cache.note = note;
  d.pad_id = pad_id_of(ts);
  for (const std::string& line : describe_train_data(d, cfg)) log(line);
  return d;
}

TrainData load_train_data(const TrainConfig& cfg, const ModelSource& src,
                          const std::function<void(const std::string&)>& log, Comm* comm) {
  TokenizerSource ts{src.tokenizer, src.encoder.name, src.config.vocab_size};
  if (!comm || comm->size() == 1 || data_cache_dir(cfg).empty()) return load_train_data(cfg, ts, log);
  // Rank 0 prepares; the others wait for its word (a broadcast under the Comm's timeout), then map
  // the file it wrote. A rank that does not see it (node-local folders) prepares its own copy.
  int32_t ok = 0;
  std::optional<TrainData> d;
  std::optional<Error> error;
  if (comm->rank() == 0) {
    try {
      d = load_train_data(cfg, ts, log);
      ok = 1;
    } catch (const Error& e) {
      error = e;
    }
  }
  comm->broadcast(&ok, sizeof ok, 0);
  if (error) throw *error;
  if (!ok)
    fail(ErrorKind::Data, "rank " + std::to_string(comm->rank()), "rank 0 could not prepare the training data",
         "its output says why");
  if (comm->rank() == 0) return std::move(*d);
  return load_train_data(cfg, ts, [](const std::string&) {});
}

std::vector<Example> preview_examples(const TrainConfig& cfg, const TokenizerSource& ts, int64_t n) {
  std::vector<Example> out;
  DatasetOptions o = dataset_options(cfg, ts);
  for (const DatasetSpec& s : dataset_specs(cfg)) {
    if (int64_t(out.size()) >= n) break;
    o.limit_rows = n - int64_t(out.size());
    for (auto& e : load_dataset(s, ts.tokenizer.get(), o, nullptr)) out.push_back(std::move(e));
  }
  return out;
}

}  // namespace qlora
