// Config -> data: dataset keys and aliases (mixes with weights, field mappings, roles), the tokenizer
// a model path names, and load_train_data's counts, packing and report.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "text/tokenizer.h"
#include "train/train_config.h"
#include "train/train_data.h"

#include "text/chat_template.h"

namespace qlora {
namespace {

const std::string kText = std::string(QLORA_FIXTURES) + "/text";
const std::string kSets = kText + "/datasets";

TrainConfig parse(const std::string& yaml, std::vector<std::string>* notes = nullptr) {
  return parse_train_config(yaml, "cfg.yaml", {}, notes, false);
}

bool has_note(const std::vector<std::string>& notes, const std::string& s) {
  for (const auto& n : notes)
    if (n.find(s) != std::string::npos) return true;
  return false;
}

TEST(DataConfig, DatasetsListBecomesAWeightedMix) {
  std::vector<std::string> notes;
  TrainConfig c = parse("datasets:\n  - path: a.jsonl\n    type: alpaca\n    weight: 2\n  - path: b.jsonl\n", &notes);
  EXPECT_TRUE(c.train_file.empty());
  EXPECT_EQ(c.dataset_mix, (std::vector<std::string>{"a.jsonl weight=2 format=alpaca", "b.jsonl"}));
  EXPECT_TRUE(has_note(notes, "datasets -> dataset_mix (2 files)"));
  auto specs = dataset_specs(c);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].path, "a.jsonl");
  EXPECT_DOUBLE_EQ(specs[0].weight, 2.0);
  EXPECT_EQ(specs[0].format, DatasetFormat::Alpaca);
  EXPECT_EQ(specs[1].format, DatasetFormat::Auto);
  // The effective config round-trips.
  EXPECT_EQ(parse(dump_train_config(c)), c);
  // One plain entry is still train_file.
  TrainConfig one = parse("datasets:\n  - path: a.jsonl\n    type: sharegpt\n");
  EXPECT_EQ(one.train_file, "a.jsonl");
  EXPECT_EQ(one.dataset_format, DatasetFormat::ShareGpt);
}

TEST(DataConfig, MaskingAndFieldKeysWithAliases) {
  std::vector<std::string> notes;
  TrainConfig c = parse(
      "roles_to_train: [assistant, human]\nskip_bad_rows: true\ncompletion_only_loss: false\n"
      "field_messages: chat\nmessage_property_mappings:\n  role: speaker\n  content: text\n"
      "dataset_format: input_output\nchat_template: tokenizer_default\n",
      &notes);
  EXPECT_EQ(c.roles_to_train, (std::vector<std::string>{"assistant", "user"}));
  EXPECT_TRUE(c.skip_bad_rows);
  EXPECT_TRUE(c.train_on_inputs);
  EXPECT_EQ(c.field_messages, "chat");
  EXPECT_EQ(c.message_field_role, "speaker");
  EXPECT_EQ(c.message_field_content, "text");
  EXPECT_EQ(c.dataset_format, DatasetFormat::Segments);
  EXPECT_EQ(c.chat_template, "");
  EXPECT_TRUE(has_note(notes, "completion_only_loss: false -> train_on_inputs: true"));
  EXPECT_EQ(TrainConfig().roles_to_train, (std::vector<std::string>{"assistant"}));
  EXPECT_THROW(parse("roles_to_train: [narrator]\n"), Error);
  EXPECT_THROW(parse("train_file: a.jsonl\ndatasets:\n  - path: b.jsonl\n  - path: c.jsonl\n"), Error);
  TrainConfig bad = parse("datasets:\n  - a.jsonl weight=-1\n  - b.jsonl\n");
  EXPECT_THROW(dataset_specs(bad), Error);
  EXPECT_THROW(parse("datasets:\n  - path: a.jsonl\n    weight: zero\n"), Error);
}

TEST(DataConfig, TokenizerSourcesWithoutWeights) {
  TokenizerSource a = open_tokenizer_source(kText + "/tok/smollm2");
  ASSERT_TRUE(a.tokenizer);
  EXPECT_EQ(a.vocab_size, 49152);
  EXPECT_FALSE(a.tokenizer->chat_template().empty());
  TokenizerSource b = open_tokenizer_source(kText + "/tok/smollm2/tokenizer.json");
  EXPECT_EQ(b.tokenizer->encode("hello"), a.tokenizer->encode("hello"));
  // A model directory without tokenizer.json falls back to bytes, as training does.
  TokenizerSource c = open_tokenizer_source(std::string(QLORA_FIXTURES) + "/models/tiny_byte");
  ASSERT_TRUE(c.tokenizer);
  EXPECT_EQ(c.tokenizer->encode("ab", false), (std::vector<int32_t>{'a', 'b'}));
  EXPECT_THROW(open_tokenizer_source("/nonexistent/model"), Error);
}

TEST(DataConfig, LoadTrainDataMixesPacksAndReports) {
  TrainConfig c = parse("datasets:\n  - path: " + kSets + "/text.jsonl\n    weight: 2\n  - path: " + kSets +
                        "/prompt_completion.jsonl\n    weight: 0.5\nmax_length: 40\npacking: true\nseed: 3\n");
  TokenizerSource ts = open_tokenizer_source(kText + "/tok/smollm2");
  std::vector<std::string> log;
  // prompt_completion.jsonl has two conversational rows: they need the template (the tokenizer's).
  try {
    TrainData d = load_train_data(c, ts, [&](const std::string& l) { log.push_back(l); });
    ASSERT_EQ(d.files.size(), 2u);
    EXPECT_EQ(d.files[0].stats.examples, 3);
    EXPECT_EQ(d.files[0].weighted, 6);
    EXPECT_EQ(d.files[1].stats.examples, 4);
    EXPECT_EQ(d.files[1].weighted, 2);
    EXPECT_EQ(d.pack.documents, 8);
    int64_t docs = 0, tokens = 0;
    for (const Example& e : d.train) {
      EXPECT_LE(int64_t(e.ids.size()), 40);
      docs += int64_t(e.doc_lens.size());
      tokens += int64_t(e.ids.size());
    }
    EXPECT_EQ(docs, 8);
    EXPECT_EQ(tokens, d.pack.tokens);
    std::string all;
    for (const auto& l : log) all += l + "\n";
    for (const char* part : {"text.jsonl (text, 3 examples, weight 2 -> 6)", "packing 8 examples into", "truncated 0"})
      EXPECT_NE(all.find(part), std::string::npos) << part << " in:\n" << all;
  } catch (const Error& e) {
    // Builds without the Jinja engine cannot render conversational rows; say so, not crash.
    EXPECT_EQ(int(e.kind()), int(ErrorKind::Config)) << e.what();
    EXPECT_NE(std::string(e.what()).find("chat_template"), std::string::npos) << e.what();
  }
}

TEST(DataConfig, ValSplitAndTruncationReachTheLog) {
  TrainConfig c = parse("train_file: " + kSets + "/text.jsonl\nmax_length: 8\ntruncation: truncate_left\nval_set_size: 1\n");
  std::vector<std::string> log;
  TrainData d = load_train_data(c, open_tokenizer_source(kText + "/tok/smollm2"),
                                [&](const std::string& l) { log.push_back(l); });
  EXPECT_EQ(d.train.size(), 2u);
  EXPECT_EQ(d.eval.size(), 1u);
  EXPECT_EQ(d.stats.truncated, 3);  // each text row is longer than 8 tokens
  EXPECT_EQ(d.longest, 8);
  std::string all;
  for (const auto& l : log) all += l + "\n";
  EXPECT_NE(all.find("truncated 3 (truncate_left)"), std::string::npos) << all;
}

TEST(DataConfig, EvalSplitComesBeforeWeightsSoNoRowLeaks) {
  TrainConfig c = parse("datasets:\n  - path: " + kSets + "/text.jsonl\n    weight: 3\nval_set_size: 1\n");
  TrainData d = load_train_data(c, open_tokenizer_source(kText + "/tok/smollm2"), [](const std::string&) {});
  ASSERT_EQ(d.eval.size(), 1u);
  EXPECT_EQ(d.train.size(), 6u);  // the two other rows, three times each
  for (const Example& e : d.train) EXPECT_NE(e.ids, d.eval[0].ids);
}

TEST(DataConfig, AlpacaWithoutAnyTemplateUsesTheBuiltinAlpacaFormat) {
  // tiny_byte has no tokenizer.json (byte-level fallback, no chat template) and chat_template is unset.
  const std::string data = kSets + "/alpaca.jsonl";
  TrainConfig c = parse("train_file: " + data + "\nmax_length: 4096\n");
  TokenizerSource ts = open_tokenizer_source(std::string(QLORA_FIXTURES) + "/models/tiny_byte");
  ASSERT_TRUE(ts.tokenizer && ts.tokenizer->chat_template().empty());
  TrainData d = load_train_data(c, ts, [](const std::string&) {});
  EXPECT_NE(d.template_name.find("alpaca"), std::string::npos) << d.template_name;
  // Row 3 of alpaca.jsonl: system "You answer in one word.", instruction "What colour is the sky?", output "Blue."
  const nlohmann::json msgs = {{{"role", "system"}, {"content", "You answer in one word."}},
                               {{"role", "user"}, {"content", "What colour is the sky?"}},
                               {{"role", "assistant"}, {"content", "Blue."}}};
  // The byte-level fallback cannot turn "</s>" text into its EOS id, so the template gets
  // eos_token "" and the data layer inserts the EOS id after each response.
  const std::string text =
      ChatTemplate::builtin("alpaca").render(msgs, false, {{"bos_token", ""}, {"eos_token", ""}});
  const Tokenizer& tok = *ts.tokenizer;
  const size_t cut = text.rfind("Blue.") + 5;
  std::vector<int32_t> want = tok.encode(text.substr(0, cut), false);
  want.push_back(*tok.eos_id());
  for (int32_t id : tok.encode(text.substr(cut), false)) want.push_back(id);
  EXPECT_EQ(d.train[2].ids, want);
  std::vector<int32_t> trained;
  for (size_t i = 0; i < d.train[2].ids.size(); i++)
    if (d.train[2].labels[i] != -100) trained.push_back(d.train[2].ids[i]);
  EXPECT_EQ(tok.decode(trained), "Blue.</s>");
  EXPECT_EQ(d.stats.eos_added, 6);  // 6 assistant turns in alpaca.jsonl (one row has a history turn)
}

}  // namespace
}  // namespace qlora
