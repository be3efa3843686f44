// JSONL example loading, truncation policy, eval split and the shuffled micro-batch stream.
#include "train/data.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"

namespace qlora {

int64_t Example::n_trained() const {
  int64_t k = 0;
  for (size_t i = 1; i < labels.size(); i++) k += labels[i] != kIgnoreIndex;
  return k;
}

static std::vector<int32_t> int_array(const nlohmann::json& j, const std::string& where, const char* key) {
  if (!j.is_array()) fail(ErrorKind::Data, where, std::string("'") + key + "' must be an array of integers");
  std::vector<int32_t> v;
  v.reserve(j.size());
  for (const auto& x : j) {
    if (!x.is_number_integer()) fail(ErrorKind::Data, where, std::string("'") + key + "' holds a non-integer value");
    v.push_back(x.get<int32_t>());
  }
  return v;
}

std::vector<Example> load_jsonl_examples(const std::string& path, const TextEncoder& enc, int64_t max_length,
                                         const std::string& truncation, DataStats* stats) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::Io, path, "cannot open dataset file");
  DataStats st;
  std::vector<Example> out;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    lineno++;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      fail(ErrorKind::Data, where + ":" + std::to_string(e.byte), "malformed JSON", e.what());
    }
    if (!row.is_object()) fail(ErrorKind::Data, where, "row is not a JSON object");
    Example ex;
    if (row.contains("input_ids")) {
      ex.ids = int_array(row["input_ids"], where, "input_ids");
      ex.labels = row.contains("labels") ? int_array(row["labels"], where, "labels") : ex.ids;
      if (ex.labels.size() != ex.ids.size())
        fail(ErrorKind::Data, where, "'labels' has " + std::to_string(ex.labels.size()) + " entries but 'input_ids' has " +
                                         std::to_string(ex.ids.size()));
    } else if (row.contains("text")) {
      if (!row["text"].is_string()) fail(ErrorKind::Data, where, "'text' must be a string");
      if (enc.bos >= 0) ex.ids.push_back(enc.bos);
      auto t = enc.encode(row["text"].get<std::string>());
      ex.ids.insert(ex.ids.end(), t.begin(), t.end());
      if (enc.eos >= 0) ex.ids.push_back(enc.eos);
      ex.labels = ex.ids;
    } else {
      std::string keys;
      for (auto it = row.begin(); it != row.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
      fail(ErrorKind::Data, where, "row has neither 'text' nor 'input_ids' (keys: " + keys + ")",
           "rows must be {\"text\": ...} or pre-tokenized {\"input_ids\": [...], \"labels\": [...]}");
    }
    for (int32_t id : ex.ids)
      if (id < 0 || (enc.vocab_size > 0 && id >= enc.vocab_size))
        fail(ErrorKind::Data, where, "token id " + std::to_string(id) + " is outside the vocabulary of " +
                                         std::to_string(enc.vocab_size));
    st.rows++;
    if (int64_t(ex.ids.size()) > max_length) {
      if (truncation == "error")
        fail(ErrorKind::Data, where, "row has " + std::to_string(ex.ids.size()) + " tokens, above max_length " +
                                         std::to_string(max_length), "raise max_length or set truncation");
      if (truncation == "drop") { st.dropped++; continue; }
      st.truncated++;
      if (truncation == "truncate_left") {
        ex.ids.erase(ex.ids.begin(), ex.ids.end() - max_length);
        ex.labels.erase(ex.labels.begin(), ex.labels.end() - max_length);
      } else {
        ex.ids.resize(size_t(max_length));
        ex.labels.resize(size_t(max_length));
      }
    }
    if (ex.n_trained() == 0) { st.skipped_no_loss++; continue; }
    st.tokens += int64_t(ex.ids.size());
    st.trained_tokens += ex.n_trained();
    st.longest = std::max<int64_t>(st.longest, int64_t(ex.ids.size()));
    out.push_back(std::move(ex));
  }
  if (stats) *stats = st;
  if (out.empty())
    fail(ErrorKind::Data, path, st.rows ? "no row has a trained token" : "dataset is empty",
         st.rows ? "check the labels / max_length" : "expected one JSON object per line");
  return out;
}

void split_eval(std::vector<Example>& train, std::vector<Example>& eval, int64_t n_eval, uint64_t seed) {
  if (n_eval <= 0) return;
  if (n_eval >= int64_t(train.size()))
    fail(ErrorKind::Config, "val_set_size", "asks for " + std::to_string(n_eval) + " eval rows but the dataset has only " +
                                                std::to_string(train.size()));
  std::vector<int64_t> idx(train.size());
  for (size_t i = 0; i < idx.size(); i++) idx[i] = int64_t(i);
  Rng rng(seed ^ 0x5eedull);
  for (size_t i = idx.size() - 1; i > 0; i--) std::swap(idx[i], idx[rng.below(i + 1)]);
  std::vector<bool> is_eval(train.size(), false);
  for (int64_t i = 0; i < n_eval; i++) is_eval[size_t(idx[size_t(i)])] = true;
  std::vector<Example> keep;
  for (size_t i = 0; i < train.size(); i++) (is_eval[i] ? eval : keep).push_back(std::move(train[i]));
  train = std::move(keep);
}

static Batch pad_batch(const std::vector<const Example*>& rows, int32_t pad) {
  int64_t t = 0;
  for (auto* e : rows) t = std::max<int64_t>(t, int64_t(e->ids.size()));
  const int64_t b = int64_t(rows.size());
  std::vector<int32_t> ids(size_t(b * t), pad), labels(size_t(b * t), kIgnoreIndex);
  for (int64_t i = 0; i < b; i++) {
    std::copy(rows[size_t(i)]->ids.begin(), rows[size_t(i)]->ids.end(), ids.begin() + i * t);
    std::copy(rows[size_t(i)]->labels.begin(), rows[size_t(i)]->labels.end(), labels.begin() + i * t);
  }
  return Batch::from_hf(b, t, ids, labels);
}

DataStream::DataStream(const std::vector<Example>* ex, int64_t bs, uint64_t seed, int32_t pad)
    : ex_(ex), bs_(bs), seed_(seed), pad_(pad) {
  shuffle();
}

void DataStream::shuffle() {
  order_.resize(ex_->size());
  for (size_t i = 0; i < order_.size(); i++) order_[i] = int64_t(i);
  Rng rng(seed_ * 1000003ull + uint64_t(epoch_));
  for (size_t i = order_.size() - 1; i > 0; i--) std::swap(order_[i], order_[rng.below(i + 1)]);
}

int64_t DataStream::batches_per_epoch() const { return (int64_t(ex_->size()) + bs_ - 1) / bs_; }

void DataStream::seek(int64_t epoch, int64_t index) {
  epoch_ = epoch;
  index_ = index;
  shuffle();
}

Batch DataStream::next() {
  if (index_ >= int64_t(order_.size())) {
    epoch_++;
    index_ = 0;
    shuffle();
  }
  std::vector<const Example*> rows;
  while (int64_t(rows.size()) < bs_ && index_ < int64_t(order_.size())) rows.push_back(&(*ex_)[size_t(order_[size_t(index_++)])]);
  return pad_batch(rows, pad_);
}

std::vector<Batch> make_batches(const std::vector<Example>& ex, int64_t bs, int32_t pad) {
  std::vector<Batch> out;
  for (size_t i = 0; i < ex.size(); i += size_t(bs)) {
    std::vector<const Example*> rows;
    for (size_t j = i; j < std::min(ex.size(), i + size_t(bs)); j++) rows.push_back(&ex[j]);
    out.push_back(pad_batch(rows, pad));
  }
  return out;
}

}  // namespace qlora
