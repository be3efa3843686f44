// The prepared-data cache: a second load maps the file the first wrote and gives the same rows; a
// change of the data, tokenizer, template or an option makes a new file; a cut, damaged or foreign
// file is prepared again with a note; the rows equal the in-memory preparation (load_dataset +
// pack_examples) for any thread count.
#include <gtest/gtest.h>

#include <omp.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "text/example_store.h"
#include "text/packing.h"
#include "train/data.h"
#include "train/data_cache.h"
#include "train/train_config.h"
#include "train/train_data.h"

namespace qlora {
namespace {

namespace fs = std::filesystem;

const std::string kTok = std::string(QLORA_FIXTURES) + "/text/tok/smollm2";

// A chat set of `n` rows (1-3 turns, words from a seeded generator) and a copy of the SmolLM2
// tokenizer folder, so a test can change either.
struct Workspace {
  std::string dir, data, model, cache;
  explicit Workspace(const std::string& name, int n = 240) {
    dir = (fs::temp_directory_path() / ("qlora_cache_" + name + "_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir);
    fs::create_directories(dir);
    data = dir + "/chat.jsonl";
    model = dir + "/model";
    cache = dir + "/cache";
    fs::create_directories(model);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(kTok + "/" + f, model + "/" + f);
    std::mt19937 rng(7);
    const char* words[] = {"harbor", "river", "quick", "fox", "alpha", "beta", "the", "of", "über", "42", "don't"};
    std::ofstream out(data);
    for (int i = 0; i < n; i++) {
      std::string row = "{\"messages\": [";
      const int turns = 1 + int(rng() % 3);
      for (int t = 0; t < turns; t++) {
        std::string u, a;
        for (int k = 0, m = 2 + int(rng() % 8); k < m; k++) u += std::string(k ? " " : "") + words[rng() % 11];
        for (int k = 0, m = 3 + int(rng() % 20); k < m; k++) a += std::string(k ? " " : "") + words[rng() % 11];
        row += std::string(t ? ", " : "") + "{\"role\": \"user\", \"content\": \"" + u +
               "\"}, {\"role\": \"assistant\", \"content\": \"" + a + "\"}";
      }
      out << row << "]}\n";
    }
  }
  ~Workspace() { fs::remove_all(dir); }
  // `extra`: "key: value", applied as an override.
  TrainConfig config(const std::string& extra = "") const {
    std::vector<std::string> over;
    if (!extra.empty()) over.push_back(extra.substr(0, extra.find(':')) + "=" + extra.substr(extra.find(':') + 2));
    return parse_train_config("model_name_or_path: " + model + "\ntrain_file: " + data +
                                  "\nmax_length: 96\npacking: true\nval_set_size: 0.1\nseed: 5\ndataset_prepared_path: " +
                                  cache + "\n",
                              "cfg.yaml", over, nullptr, false);
  }
  size_t files() const {
    size_t n = 0;
    if (fs::exists(cache))
      for (const auto& e : fs::directory_iterator(cache)) n += e.path().extension() == ".qlora-data";
    return n;
  }
};

TrainData load(const TrainConfig& c, std::vector<std::string>* log = nullptr) {
  return load_train_data(c, open_tokenizer_source(c.model_name_or_path), [&](const std::string& l) {
    if (log) log->push_back(l);
  });
}

void expect_same_rows(const ExampleSet& a, const ExampleSet& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) {
    const Example x = a[i], y = b[i];
    ASSERT_EQ(x.ids, y.ids) << "row " << i;
    ASSERT_EQ(x.labels, y.labels) << "row " << i;
    ASSERT_EQ(x.doc_lens, y.doc_lens) << "row " << i;
    ASSERT_EQ(x.roles, y.roles) << "row " << i;
  }
}

bool logged(const std::vector<std::string>& log, const std::string& s) {
  for (const auto& l : log)
    if (l.find(s) != std::string::npos) return true;
  return false;
}

TEST(DataCache, SecondLoadMapsTheFileAndGivesTheSameRows) {
  Workspace w("reuse");
  const TrainConfig c = w.config();
  std::vector<std::string> log1, log2;
  const TrainData a = load(c, &log1);
  EXPECT_FALSE(a.cache.reused);
  ASSERT_FALSE(a.cache.path.empty());
  EXPECT_TRUE(fs::exists(a.cache.path));
  EXPECT_TRUE(logged(log1, "cached in " + a.cache.path));
  const TrainData b = load(c, &log2);
  EXPECT_TRUE(b.cache.reused);
  EXPECT_EQ(b.cache.path, a.cache.path);
  EXPECT_TRUE(logged(log2, "reused from the cache " + a.cache.path));
  EXPECT_EQ(w.files(), 1u);
  expect_same_rows(a.train, b.train);
  expect_same_rows(a.eval, b.eval);
  EXPECT_GT(a.train.size(), 10u);
  EXPECT_GT(a.eval.size(), 0u);
  // The report is the same: counts, lengths, packing.
  EXPECT_EQ(b.stats.rows, a.stats.rows);
  EXPECT_EQ(b.stats.tokens, a.stats.tokens);
  EXPECT_EQ(b.stats.trained_tokens, a.stats.trained_tokens);
  EXPECT_EQ(b.stats.lengths, a.stats.lengths);
  EXPECT_EQ(b.pack.rows, a.pack.rows);
  EXPECT_EQ(b.longest, a.longest);
  EXPECT_EQ(b.files.size(), 1u);
  EXPECT_EQ(b.files[0].weighted, a.files[0].weighted);
  // Without a cache, in memory: the same rows.
  const TrainData m = load(w.config("dataset_prepared_path: none"));
  EXPECT_TRUE(m.cache.path.empty());
  expect_same_rows(a.train, m.train);
  expect_same_rows(a.eval, m.eval);
}

// The plan-based packing and split equal the example-based ones (load_dataset, eval_mask,
// pack_examples), which the packing and batch tests check on their own.
TEST(DataCache, RowsEqualTheExamplePipeline) {
  Workspace w("pipeline");
  const TrainConfig c = w.config();
  const TrainData d = load(c);
  const TokenizerSource ts = open_tokenizer_source(c.model_name_or_path);
  DatasetOptions opt = dataset_options(c, ts);
  std::vector<Example> all = load_dataset(dataset_specs(c)[0], ts.tokenizer.get(), opt, nullptr);
  const std::vector<bool> is_eval = eval_mask(all.size(), std::max<int64_t>(1, int64_t(0.1 * double(all.size()))), 5);
  std::vector<Example> train, eval;
  for (size_t i = 0; i < all.size(); i++) (is_eval[i] ? eval : train).push_back(all[i]);
  expect_same_rows(d.train, ExampleSet::of(pack_examples(train, 96, 5, nullptr)));
  expect_same_rows(d.eval, ExampleSet::of(pack_examples(eval, 96, 6, nullptr)));
}

TEST(DataCache, RowsDoNotDependOnTheThreadCount) {
  Workspace w("threads", 600);
  const int saved = omp_get_max_threads();
  std::vector<TrainData> runs;
  for (int t : {1, 2, 7}) {
    omp_set_num_threads(t);
    runs.push_back(load(w.config("dataset_prepared_path: " + w.cache + std::to_string(t))));
    EXPECT_FALSE(runs.back().cache.reused);
  }
  omp_set_num_threads(saved);
  for (size_t k = 1; k < runs.size(); k++) {
    expect_same_rows(runs[0].train, runs[k].train);
    expect_same_rows(runs[0].eval, runs[k].eval);
  }
}

TEST(DataCache, AChangedInputMakesANewFile) {
  Workspace w("inputs");
  const TrainData base = load(w.config());
  ASSERT_EQ(w.files(), 1u);
  // max_length
  EXPECT_FALSE(load(w.config("max_length: 80")).cache.reused);
  EXPECT_EQ(w.files(), 2u);
  // the chat template
  const TrainData chatml = load(w.config("chat_template: chatml"));
  EXPECT_FALSE(chatml.cache.reused);
  EXPECT_EQ(w.files(), 3u);
  // a byte of the data: the first word of the first row
  {
    std::ifstream in(w.data);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const size_t at = text.find("\"content\": \"");
    ASSERT_NE(at, std::string::npos);
    text[at + 12] = 'X';
    std::ofstream(w.data, std::ios::trunc) << text;
  }
  const TrainData edited = load(w.config());
  EXPECT_FALSE(edited.cache.reused);
  EXPECT_EQ(w.files(), 4u);
  auto ids = [](const TrainData& d) {
    std::vector<int32_t> v;
    for (const ExampleSet* s : {&d.train, &d.eval})
      for (const Example& e : *s) v.insert(v.end(), e.ids.begin(), e.ids.end());
    return v;
  };
  EXPECT_NE(ids(edited), ids(base));  // the edited row's tokens changed
  // the tokenizer: its files' bytes (here the template it carries)
  {
    std::ifstream in(w.model + "/tokenizer_config.json");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(w.model + "/tokenizer_config.json", std::ios::trunc) << text << "\n";
  }
  EXPECT_FALSE(load(w.config()).cache.reused);
  EXPECT_EQ(w.files(), 5u);
  // and nothing changed: reused
  EXPECT_TRUE(load(w.config()).cache.reused);
  EXPECT_EQ(w.files(), 5u);
  // Options that do not change the data (the learning rate) keep the key.
  EXPECT_EQ(data_cache_key(w.config(), open_tokenizer_source(w.model), DataPurpose::Train),
            data_cache_key(w.config("learning_rate: 0.5"), open_tokenizer_source(w.model), DataPurpose::Train));
}

TEST(DataCache, CutDamagedOrForeignFilesArePreparedAgainWithANote) {
  Workspace w("damage");
  const TrainConfig c = w.config();
  // The rows copied to memory: damaging a file in place under a live mapping would fault it (the
  // engine itself only ever replaces cache files by renaming a new one over them).
  std::string path;
  ExampleSet ref;
  {
    const TrainData first = load(c);
    path = first.cache.path;
    ref = ExampleSet::of(first.train.materialize());
  }
  const auto size = fs::file_size(path);
  struct Case {
    const char* name;
    std::function<void()> spoil;
    const char* why;
  };
  const std::vector<Case> cases = {
      {"cut", [&] { fs::resize_file(path, size / 2); }, "no end marker"},
      {"flipped byte",
       [&] {
         std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
         f.seekg(std::streamoff(size / 3));
         char ch;
         f.get(ch);
         f.seekp(std::streamoff(size / 3));
         f.put(char(ch ^ 0x10));
       },
       "checksum"},
      {"foreign", [&] { std::ofstream(path, std::ios::trunc) << "{\"not\": \"ours\"}"; }, "shorter than any"},
      {"empty", [&] { std::ofstream(path, std::ios::trunc); }, "shorter than any"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    k.spoil();
    std::vector<std::string> log;
    const TrainData again = load(c, &log);
    EXPECT_FALSE(again.cache.reused);
    EXPECT_NE(again.cache.note.find("was not used"), std::string::npos) << again.cache.note;
    EXPECT_NE(again.cache.note.find(k.why), std::string::npos) << again.cache.note;
    EXPECT_TRUE(logged(log, "prepared-data cache: " + path + " was not used"));
    expect_same_rows(ref, again.train);
    // and it is whole again (its note's timings may differ in length)
    EXPECT_TRUE(load(c).cache.reused);
  }
  // A valid file of another key at this key's name is not trusted either.
  fs::copy_file(load(w.config("max_length: 80")).cache.path, path, fs::copy_options::overwrite_existing);
  const TrainData swapped = load(c);
  EXPECT_FALSE(swapped.cache.reused);
  EXPECT_NE(swapped.cache.note.find("made for other inputs"), std::string::npos) << swapped.cache.note;
  expect_same_rows(ref, swapped.train);
}

TEST(DataCache, EvalFileAloneIsCachedForQloraEval) {
  Workspace w("eval");
  TrainConfig c = w.config();
  c.val_set_size = 0;
  c.eval_file = w.data;
  c.train_file = "/nonexistent/train.jsonl";  // qlora eval --data reads only the eval file
  const TokenizerSource ts = open_tokenizer_source(c.model_name_or_path);
  const EvalData a = load_eval_data(c, ts, [](const std::string&) {});
  EXPECT_FALSE(a.cache.reused);
  const EvalData b = load_eval_data(c, ts, [](const std::string&) {});
  EXPECT_TRUE(b.cache.reused);
  EXPECT_EQ(b.examples, a.examples);
  EXPECT_EQ(a.examples, 240);
  expect_same_rows(a.rows, b.rows);
  // The same rows as training's eval set from that file.
  c.train_file = w.data;
  expect_same_rows(load(c).eval, a.rows);
}

TEST(DataCache, StoreKeepsEveryLabelKind) {
  // Labels that are their token or -100 are stored as bits; others (pre-tokenized rows may carry
  // any label) as they are; roles and document lengths travel too; packed rows cut the first label.
  std::vector<Example> rows(3);
  rows[0].ids = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  rows[0].labels = {-100, 6, 7, -100, 9, 10, 11, 12, 13};
  rows[1].ids = {1, 2, 3};
  rows[1].labels = {-100, 42, 3};
  rows[2].ids = {4, 4, 4, 4};
  rows[2].labels = {-100, -100, 4, 4};
  rows[2].doc_lens = {2, 2};
  rows[2].roles = {DocRole::Prompt, DocRole::Chosen, DocRole::Prompt, DocRole::Rejected};
  const ExampleSet set = ExampleSet::of(rows);
  for (size_t i = 0; i < rows.size(); i++) {
    const Example e = set[i];
    EXPECT_EQ(e.ids, rows[i].ids);
    EXPECT_EQ(e.labels, rows[i].labels);
    EXPECT_EQ(e.doc_lens, rows[i].doc_lens);
    EXPECT_EQ(e.roles, rows[i].roles);
  }
  std::vector<Example> docs = {rows[0], rows[1]};
  const std::vector<Example> packed = pack_examples(docs, 16, 1, nullptr);
  RowPlan plan;
  plan.packed = true;
  plan.add_row({0, 1});
  const Example row = ExampleSet(set.store(), plan)[0];
  ASSERT_EQ(packed.size(), 1u);
  EXPECT_EQ(row.ids, packed[0].ids);
  EXPECT_EQ(row.labels, packed[0].labels);
  EXPECT_EQ(row.doc_lens, (std::vector<int32_t>{9, 3}));
  EXPECT_EQ(row.labels, (std::vector<int32_t>{-100, 6, 7, -100, 9, 10, 11, 12, 13, -100, 42, 3}));
}

TEST(DataCache, StoreRefusesOutOfBoundsPlans) {
  // A file whose checksum is right but whose plan points past its records is refused, not read.
  ExampleWriter wr("", "k");
  Example e;
  e.ids = {1, 2, 3};
  e.labels = {-100, 2, 3};
  wr.add(e);
  RowPlan bad;
  bad.add_row({5});
  EXPECT_THROW(wr.finish(bad, RowPlan{}, nlohmann::json::object()), Error);
}

}  // namespace
}  // namespace qlora
