// Preference rows (text/preference_rows.cpp): format detection, the row errors a user sees, TRL's
// implicit-prompt extraction, per-sequence truncation and KTO's KL probes. The token ids against
// TRL's own are checked in tests/train/test_preference_parity.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_dataset_util.h"

namespace qlora {
namespace {

using json = nlohmann::json;
using namespace dataset_test;

// Whole documents of an example.
std::vector<std::vector<int32_t>> docs(const Example& e) {
  std::vector<std::vector<int32_t>> out;
  size_t at = 0;
  for (int32_t n : e.doc_lens) {
    out.emplace_back(e.ids.begin() + std::ptrdiff_t(at), e.ids.begin() + std::ptrdiff_t(at + size_t(n)));
    at += size_t(n);
  }
  return out;
}

Example encode(const json& row, int64_t max_length = 4096, Truncation truncation = Truncation::TruncateRight) {
  const DatasetFormat f = detect_format(row, FieldMap{});
  Row r = parse_row(row, f, FieldMap{}, MaskOptions{}, "rows.jsonl:1");
  Example e = encode_row(r, &smollm2(), MaskOptions{}, smollm2_chatml, "rows.jsonl:1", nullptr);
  if (fit_preference(e, max_length, truncation, "rows.jsonl:1") == PrefFit::Dropped) e = Example{};
  return e;
}

TEST(PreferenceRows, FormatsAreDetectedFromTheirKeys) {
  EXPECT_EQ(detect_format(json{{"prompt", "a"}, {"chosen", "b"}, {"rejected", "c"}}, {}), DatasetFormat::Preference);
  EXPECT_EQ(detect_format(json{{"chosen", "b"}, {"rejected", "c"}}, {}), DatasetFormat::Preference);
  EXPECT_EQ(detect_format(json{{"prompt", "a"}, {"completion", "b"}, {"label", true}}, {}), DatasetFormat::Unpaired);
  EXPECT_EQ(detect_format(json{{"prompt", "a"}, {"completion", "b"}}, {}), DatasetFormat::PromptCompletion);
}

TEST(PreferenceRows, TextRowsEndWithEosAndShareThePrompt) {
  const Example e = encode({{"prompt", "The sky is"}, {"chosen", " blue."}, {"rejected", " green."}});
  const auto d = docs(e);
  ASSERT_EQ(d.size(), 2u);
  const std::vector<int32_t> prompt = smollm2().encode("The sky is", true);
  const int32_t eos = *smollm2().eos_id();
  for (size_t k = 0; k < 2; k++) {
    ASSERT_GT(d[k].size(), prompt.size());
    EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), d[k].begin())) << "document " << k;
    EXPECT_EQ(d[k].back(), eos) << "document " << k << " ends with EOS";
  }
  // Labels on the completions only, roles per token.
  size_t at = 0;
  for (size_t k = 0; k < 2; k++) {
    for (size_t i = 0; i < d[k].size(); i++, at++) {
      const bool completion = i >= prompt.size();
      EXPECT_EQ(e.labels[at] != kNoLoss, completion) << "document " << k << " token " << i;
      EXPECT_EQ(e.roles[at], completion ? (k ? DocRole::Rejected : DocRole::Chosen) : DocRole::Prompt);
    }
  }
  // A completion already ending with the EOS text gets no second one.
  const Example f = encode({{"prompt", "The sky is"}, {"chosen", " blue.<|im_end|>"}, {"rejected", " green."}});
  EXPECT_EQ(docs(f)[0], d[0]);
}

// TRL's extract_prompt: the shared start; a string prompt leaves its trailing space to the
// completions; message lists split at whole messages.
TEST(PreferenceRows, ImplicitPromptIsTheSharedStart) {
  const Example text = encode({{"chosen", "Q: sky? A: blue"}, {"rejected", "Q: sky? A: green"}});
  const Example expl = encode({{"prompt", "Q: sky? A:"}, {"chosen", " blue"}, {"rejected", " green"}});
  EXPECT_EQ(text.ids, expl.ids);
  EXPECT_EQ(text.labels, expl.labels);
  const json user = {{"role", "user"}, {"content", "What color is the sky?"}};
  const json blue = {{"role", "assistant"}, {"content", "Blue."}}, green = {{"role", "assistant"}, {"content", "Green."}};
  const Example chat = encode({{"chosen", {user, blue}}, {"rejected", {user, green}}});
  const Example chat_expl = encode({{"prompt", {user}}, {"chosen", {blue}}, {"rejected", {green}}});
  EXPECT_EQ(chat.ids, chat_expl.ids);
  EXPECT_EQ(chat.labels, chat_expl.labels);
  // The completion is the assistant turn after the generation prompt, through its end of turn.
  const std::vector<int32_t> chosen = docs(chat)[0];
  const std::string c = smollm2().decode(std::vector<int32_t>(chosen.end() - 4, chosen.end()));
  EXPECT_NE(c.find("Blue.<|im_end|>"), std::string::npos) << c;
}

TEST(PreferenceRows, BadRowsNameWhatIsWrong) {
  struct Case {
    json row;
    const char* says;
  };
  const json msg = {{{"role", "assistant"}, {"content", "x"}}};
  const std::vector<Case> cases = {
      {{{"prompt", "p"}, {"chosen", "a"}, {"rejected", nullptr}}, "has no 'rejected'"},
      {{{"prompt", "p"}, {"chosen", ""}, {"rejected", "b"}}, "has an empty 'chosen'"},
      {{{"prompt", "p"}, {"chosen", "a"}, {"rejected", "a"}}, "'chosen' equal to 'rejected'"},
      {{{"chosen", "same"}, {"rejected", "same"}}, "'chosen' equal to 'rejected'"},
      {{{"prompt", "p"}, {"chosen", msg}, {"rejected", "b"}}, "'rejected' that is not a message list"},
      {{{"prompt", "p"}, {"chosen", 3}, {"rejected", "b"}}, "neither a string nor a message list"},
      {{{"prompt", "p"}, {"chosen", json::array({{{"content", "x"}}})}, {"rejected", msg}}, "without a string 'role'"},
      {{{"prompt", "p"}, {"completion", "a"}, {"label", "yes"}}, "no boolean 'label'"},
      {{{"prompt", "p"}, {"completion", ""}, {"label", true}}, "an empty 'completion'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.row.dump());
    DatasetFormat f = detect_format(c.row, FieldMap{});
    if (f == DatasetFormat::Auto) f = DatasetFormat::Preference;  // a row missing its key: the file's format
    try {
      parse_row(c.row, f, FieldMap{}, MaskOptions{}, "rows.jsonl:7");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Data);
      EXPECT_EQ(e.where(), "rows.jsonl:7");
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
    }
  }
}

// Each sequence (prompt + one completion) is cut to max_length: keep_start cuts the end and drops a
// row whose prompt fills it; keep_end keeps the end; drop and error act on any long sequence.
TEST(PreferenceRows, TruncationIsPerSequence) {
  const json row = {{"prompt", "one two three four five six"}, {"chosen", " seven"}, {"rejected", " eight nine ten eleven"}};
  const Example whole = encode(row);
  const auto d = docs(whole);
  const int64_t prompt = int64_t(smollm2().encode("one two three four five six", true).size());
  const int64_t cap = int64_t(std::max(d[0].size(), d[1].size())) - 1;  // cuts the longer sequence only
  const Example start = encode(row, cap, Truncation::TruncateRight);
  ASSERT_EQ(start.doc_lens.size(), 2u);
  EXPECT_EQ(docs(start)[0], d[0]);
  EXPECT_EQ(docs(start)[1], std::vector<int32_t>(d[1].begin(), d[1].begin() + cap));
  const Example end = encode(row, cap, Truncation::TruncateLeft);
  EXPECT_EQ(docs(end)[1], std::vector<int32_t>(d[1].end() - cap, d[1].end()));
  EXPECT_EQ(end.labels[size_t(end.doc_lens[0])], kNoLoss) << "a cut document's first token scores nothing";
  EXPECT_TRUE(encode(row, cap, Truncation::Drop).ids.empty());
  EXPECT_THROW(encode(row, cap, Truncation::Error), Error);
  // keep_start with a prompt that fills max_length: nothing of the completions would be left.
  EXPECT_TRUE(encode(row, prompt, Truncation::TruncateRight).ids.empty());
  EXPECT_FALSE(encode(row, prompt, Truncation::TruncateLeft).ids.empty());
}

// KTO: within each run of batch-size examples, example i's probe is its prompt followed by the
// previous example's completion (the first takes the run's last), scored but only measured.
TEST(PreferenceRows, KlProbesPairWithinBatchSizeRuns) {
  std::vector<Example> ex;
  std::vector<std::vector<int32_t>> prompts, completions;
  for (int i = 0; i < 5; i++) {
    const Example e = encode({{"prompt", "question " + std::to_string(i)}, {"completion", " answer " + std::to_string(i)},
                              {"label", i % 2 == 0}});
    ASSERT_EQ(e.doc_lens.size(), 1u);
    size_t p = 0;
    while (e.roles[p] == DocRole::Prompt) p++;
    prompts.emplace_back(e.ids.begin(), e.ids.begin() + std::ptrdiff_t(p));
    completions.emplace_back(e.ids.begin() + std::ptrdiff_t(p), e.ids.end());
    EXPECT_EQ(e.roles.back(), i % 2 == 0 ? DocRole::Desirable : DocRole::Undesirable);
    ex.push_back(e);
  }
  add_kl_probes(ex, 3, 4096, Truncation::TruncateRight);  // runs {0,1,2} and {3,4}
  const int from[] = {2, 0, 1, 4, 3};
  for (int i = 0; i < 5; i++) {
    SCOPED_TRACE("example " + std::to_string(i));
    ASSERT_EQ(ex[size_t(i)].doc_lens.size(), 2u);
    std::vector<int32_t> want = prompts[size_t(i)];
    want.insert(want.end(), completions[size_t(from[i])].begin(), completions[size_t(from[i])].end());
    EXPECT_EQ(docs(ex[size_t(i)])[1], want);
    EXPECT_EQ(ex[size_t(i)].roles.back(), DocRole::KlProbe);
  }
}

}  // namespace
}  // namespace qlora
