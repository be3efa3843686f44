// Rows are prepared in parallel (a chunk at a time) and taken in file order: the examples, the
// counts, the bad-row messages and the first error are the same for 1, 2 and 7 threads. Runs the
// real Jinja interpreter (SmolLM2's template) and the SmolLM2 tokenizer from many threads at once.
#include <gtest/gtest.h>
#include <omp.h>

#include "core/rng.h"
#include "io/json_util.h"
#include "test_dataset_util.h"
#include "text/chat_template.h"

namespace qlora {
namespace {

using namespace dataset_test;
using json = nlohmann::json;

const char* const kWords[] = {"harbor", "the", "quick", "zebra", "naïve", "café", "東京", "42", "x", "\t", "tree's",
                              "über", "(parens)", "emoji 😀", "  ", "end.", "Q:", "<|im_end|>?"};

std::string words(Rng& rng, int n) {
  std::string s;
  for (int i = 0; i < n; i++) s += std::string(i ? " " : "") + kWords[rng.below(std::size(kWords))];
  return s;
}

// `n` chat rows (one to three turns, some with a system prompt; a few long enough to be truncated
// at max_length 96), with bad rows at the `bad` line numbers (1-based): malformed JSON on odd
// lines, messages that are not a list on even ones.
std::string chat_rows(int n, const std::vector<int>& bad, uint64_t seed) {
  Rng rng(seed);
  std::string out;
  for (int line = 1; line <= n; line++) {
    if (std::find(bad.begin(), bad.end(), line) != bad.end()) {
      out += line % 2 ? "{\"messages\": [\n" : "{\"messages\": 5}\n";  // malformed JSON, or not a list
      continue;
    }
    json msgs = json::array();
    if (rng.below(4) == 0) msgs.push_back({{"role", "system"}, {"content", words(rng, 3)}});
    const int turns = 1 + int(rng.below(3));
    for (int t = 0; t < turns; t++) {
      msgs.push_back({{"role", "user"}, {"content", words(rng, 1 + int(rng.below(8)))}});
      msgs.push_back({{"role", "assistant"}, {"content", words(rng, 1 + int(rng.below(rng.below(10) == 0 ? 60 : 8)))}});
    }
    out += json{{"messages", msgs}}.dump() + "\n";
  }
  return out;
}

struct Loaded {
  std::vector<Example> examples;
  DatasetStats stats;
};

Loaded load_with_threads(const std::string& path, const DatasetOptions& o, int threads) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  Loaded l;
  try {
    l.examples = load_dataset({path}, &smollm2(), o, &l.stats);
  } catch (...) {
    omp_set_num_threads(before);
    throw;
  }
  omp_set_num_threads(before);
  return l;
}

DatasetOptions jinja_options() {
  static const ChatTemplate tmpl =
      ChatTemplate::from_source(read_text_file(std::string(QLORA_FIXTURES) + "/text/chat_templates/smollm2.jinja"), "smollm2");
  DatasetOptions o;
  o.render = [](const RowJson& m, bool gen, const RowJson& extra) { return tmpl.render(m, gen, extra); };
  o.max_length = 96;
  o.skip_bad_rows = true;
  return o;
}

// 9,000 rows: two chunks and a part, with bad rows in each and across a chunk boundary.
TEST(DatasetParallel, SameExamplesCountsAndMessagesForAnyThreadCount) {
  const std::vector<int> bad = {3, 4096, 4097, 5000, 8999};
  const std::string path = temp_file("parallel_chat.jsonl", chat_rows(9000, bad, 11));
  const DatasetOptions o = jinja_options();
  const Loaded one = load_with_threads(path, o, 1);
  EXPECT_EQ(one.stats.rows, 9000);
  EXPECT_EQ(one.stats.bad_rows, int64_t(bad.size()));
  EXPECT_GT(one.stats.truncated, 0) << "some rows should exceed max_length";
  EXPECT_EQ(one.stats.examples + one.stats.bad_rows, 9000);
  ASSERT_EQ(one.stats.bad_row_messages.size(), 5u);
  EXPECT_NE(one.stats.bad_row_messages[0].find(path + ":3:"), std::string::npos) << one.stats.bad_row_messages[0];
  EXPECT_NE(one.stats.bad_row_messages[4].find(path + ":8999:"), std::string::npos) << one.stats.bad_row_messages[4];
  for (int threads : {2, 7}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    const Loaded l = load_with_threads(path, o, threads);
    ASSERT_EQ(l.examples.size(), one.examples.size());
    for (size_t i = 0; i < l.examples.size(); i++) {
      ASSERT_EQ(l.examples[i].ids, one.examples[i].ids) << "example " << i;
      ASSERT_EQ(l.examples[i].labels, one.examples[i].labels) << "example " << i;
    }
    EXPECT_EQ(l.stats.rows, one.stats.rows);
    EXPECT_EQ(l.stats.tokens, one.stats.tokens);
    EXPECT_EQ(l.stats.trained_tokens, one.stats.trained_tokens);
    EXPECT_EQ(l.stats.truncated, one.stats.truncated);
    EXPECT_EQ(l.stats.split_mismatch, one.stats.split_mismatch);
    EXPECT_EQ(l.stats.double_bos, one.stats.double_bos);
    EXPECT_EQ(l.stats.eos_added, one.stats.eos_added);
    EXPECT_EQ(l.stats.lengths, one.stats.lengths);
    EXPECT_EQ(l.stats.bad_row_messages, one.stats.bad_row_messages);
  }
}

// Without skip_bad_rows the first bad row in file order stops the load, whichever thread met a
// later one first; previews (limit_rows) stop at the same row.
TEST(DatasetParallel, FirstErrorAndRowLimitFollowFileOrder) {
  const std::string path = temp_file("parallel_bad.jsonl", chat_rows(6000, {4500, 4501}, 12));
  DatasetOptions o = jinja_options();
  o.skip_bad_rows = false;
  for (int threads : {1, 2, 7}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    Error e = expect_error([&] { load_with_threads(path, o, threads); }, ErrorKind::Data);
    EXPECT_EQ(e.where().rfind(path + ":4500", 0), 0u) << e.where();  // not 4501 (malformed JSON), the later one
    o.limit_rows = 37;
    const Loaded l = load_with_threads(path, o, threads);
    EXPECT_EQ(l.examples.size(), 37u);
    EXPECT_EQ(l.stats.rows, 37);
    o.limit_rows = 0;
  }
}

}  // namespace
}  // namespace qlora
