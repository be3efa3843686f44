#include "train/data_report.h"

#include <cstdio>

#include "model/modes.h"

namespace qlora {

using json = nlohmann::json;

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
                (is_preference(cfg.rl) ? " (a row: two sequences)" : "") + " | max_length " +
                std::to_string(cfg.max_length) + ": truncated " + std::to_string(st.truncated) + " (" + truncation_name(cfg.truncation) +
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
  if (st.generation_marked)
    out.push_back("data: " + std::to_string(st.generation_marked) +
                  " chat rows have loss on the text the template marks with {% generation %}");
  if (st.eos_added)
    out.push_back("data: " + std::to_string(st.eos_added) +
                  " EOS tokens inserted after trained turns that the template does not end with a special token");
  if (d.pack.rows)
    out.push_back("data: packing " + std::to_string(d.pack.documents) + " examples into " + std::to_string(d.pack.rows) +
                  " rows of " + std::to_string(d.pack.capacity) + " tokens (efficiency " +
                  pct(d.pack.tokens, d.pack.rows * d.pack.capacity) + ")");
  {
    char t[300];
    std::snprintf(t, sizeof t, "%.2f s (%.0f rows/s on %d thread%s)", d.prepare_s,
                  d.prepare_s > 0 ? double(st.rows) / d.prepare_s : 0.0, d.threads, d.threads == 1 ? "" : "s");
    std::string line = std::string(d.cache.reused ? "data: prepared " + d.cache.prepared_at + " in " : "data: prepared in ") + t;
    if (d.pack.rows) {
      std::snprintf(t, sizeof t, ", packed in %.2f s", d.pack_s);
      line += t;
    }
    const double mb = double(d.cache.bytes) / 1e6;
    if (d.cache.reused) {
      std::snprintf(t, sizeof t, "; reused from the cache %s (%.1f MB, checked and mapped in %.2f s)", d.cache.path.c_str(),
                    mb, d.cache.load_s);
      line += t;
    } else if (!d.cache.path.empty()) {
      std::snprintf(t, sizeof t, "; cached in %s (%.1f MB, finished in %.2f s)", d.cache.path.c_str(), mb, d.write_s);
      line += t;
    }
    out.push_back(line);
    if (!d.cache.note.empty()) out.push_back("data: prepared-data cache: " + d.cache.note);
  }
  if (!d.eval.empty()) out.push_back("data: eval " + std::to_string(d.eval.size()) + (cfg.packing ? " packed rows" : " examples"));
  return out;
}

std::vector<LengthBucket> length_histogram(const DatasetStats& st) {
  std::vector<LengthBucket> b;
  for (int64_t lo = 1, hi = 16; lo <= std::max<int64_t>(1, st.longest); lo = hi + 1, hi *= 2) b.push_back({lo, hi, 0});
  for (int32_t n : st.lengths)
    for (auto& k : b)
      if (n >= k.lo && n <= k.hi) {
        k.count++;
        break;
      }
  return b;
}

PackStats packing_of(const TrainData& d, const TrainConfig& cfg) {
  if (cfg.packing) return d.pack;
  PackStats pack;
  std::vector<int64_t> lens;
  for (size_t i = 0; i < d.train.size(); i++) lens.push_back(d.train.length(i)), pack.tokens += lens.back();
  pack.documents = int64_t(lens.size());
  pack.capacity = cfg.max_length;
  pack.rows = int64_t(pack_ffd(lens, cfg.max_length, uint64_t(cfg.seed)).size());
  return pack;
}

nlohmann::json train_data_json(const TrainData& d, const TrainConfig& cfg) {
  const DatasetStats& st = d.stats;
  const PackStats pack = packing_of(d, cfg);
  json j;
  j["tokenizer"] = d.tokenizer_name;
  j["chat_template"] = d.template_name;
  j["rows"] = st.rows;
  j["examples"] = st.examples;
  j["train_examples"] = pack.documents;  // after weights and the eval split
  j["eval_examples"] = int64_t(d.eval.size());
  j["tokens"] = st.tokens;
  j["trained_tokens"] = st.trained_tokens;
  j["trained_share"] = st.tokens ? double(st.trained_tokens) / double(st.tokens) : 0.0;
  j["longest"] = st.longest;
  j["max_length"] = cfg.max_length;
  j["truncation"] = truncation_name(cfg.truncation);
  j["truncated"] = st.truncated;
  j["dropped"] = st.dropped;
  j["no_trained_token"] = st.no_loss;
  j["bad_rows"] = st.bad_rows;
  j["bad_row_messages"] = st.bad_row_messages;
  j["split_mismatch"] = st.split_mismatch;
  j["double_bos"] = st.double_bos;
  j["eos_added"] = st.eos_added;
  j["generation_marked"] = st.generation_marked;
  j["threads"] = d.threads;
  j["prepare_seconds"] = d.prepare_s;  // reading, templating and tokenizing the train files
  j["pack_seconds"] = d.pack_s;
  j["cache"] = {{"path", d.cache.path}, {"reused", d.cache.reused}, {"bytes", d.cache.bytes},
                {"load_seconds", d.cache.load_s}, {"write_seconds", d.write_s}, {"note", d.cache.note},
                {"prepared_at", d.cache.prepared_at}};
  j["files"] = json::array();
  for (const auto& f : d.files)
    j["files"].push_back({{"path", f.spec.path}, {"format", f.stats.format}, {"weight", f.spec.weight},
                          {"rows", f.stats.rows}, {"examples", f.stats.examples}, {"weighted", f.weighted}});
  j["histogram"] = json::array();
  for (const auto& b : length_histogram(st)) j["histogram"].push_back({{"lo", b.lo}, {"hi", b.hi}, {"count", b.count}});
  j["packing"] = {{"enabled", cfg.packing}, {"documents", pack.documents}, {"rows", pack.rows},
                  {"capacity", pack.capacity}, {"efficiency", pack.efficiency()}};
  return j;
}

}  // namespace qlora
