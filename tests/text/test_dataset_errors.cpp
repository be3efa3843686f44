// Bad dataset input: every problem names where it is and what is wrong; skip_bad_rows counts
// instead of stopping; truncation policies and rows without loss are counted, never silent.
#include <gtest/gtest.h>

#include "test_dataset_util.h"

#include "text/chat_template.h"

namespace qlora {
namespace {

using namespace dataset_test;

DatasetOptions chat_options(ChatRenderFn fn = smollm2_chatml) {
  DatasetOptions o;
  o.render = std::move(fn);
  return o;
}

const char* kGoodAlpaca = R"({"instruction": "Say hi.", "output": "Hi!"})";

TEST(DatasetErrors, MalformedJsonNamesLineColumnAndReason) {
  const std::string path = temp_file("bad_json.jsonl", std::string(kGoodAlpaca) + "\n" +
                                                           R"({"instruction": "x", "output": "y",})" + "\n");
  Error e = expect_error([&] { load_dataset({path}, &smollm2(), chat_options(), nullptr); }, ErrorKind::Data);
  // Line 2, the '}' after the trailing comma is character 36 of the line.
  EXPECT_EQ(e.where(), path + ":2:36");
  EXPECT_NE(e.message().find("malformed JSON"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("object key"), std::string::npos) << e.message();
}

TEST(DatasetErrors, NumberTooLargeForADoubleNamesTheRow) {
  const std::string path = temp_file("overflow.jsonl", std::string(kGoodAlpaca) + "\n" +
                                                           R"({"instruction": "x", "output": "y", "score": 1e999})" + "\n");
  Error e = expect_error([&] { load_dataset({path}, &smollm2(), chat_options(), nullptr); }, ErrorKind::Data);
  EXPECT_EQ(e.where(), path + ":2");
  EXPECT_NE(e.message().find("malformed JSON: number overflow parsing '1e999'"), std::string::npos) << e.message();
  // A bad row like any other: skip_bad_rows counts it and keeps the rest.
  DatasetOptions o = chat_options();
  o.skip_bad_rows = true;
  DatasetStats st;
  EXPECT_EQ(load_dataset({path}, &smollm2(), o, &st).size(), 1u);
  EXPECT_EQ(st.bad_rows, 1);
}

TEST(DatasetErrors, MalformedJsonArrayFileNamesLineAndColumn) {
  const std::string path = temp_file("bad_array.json", "[\n  {\"text\": \"a\"},\n  {\"text\": b}\n]\n");
  Error e = expect_error([&] { load_dataset({path}, &smollm2(), DatasetOptions{}, nullptr); }, ErrorKind::Data);
  EXPECT_EQ(e.where(), path + ":3:12");
}

TEST(DatasetErrors, InvalidUtf8InARowNamesLineAndColumn) {
  const std::string path = temp_file("utf8.jsonl", std::string(kGoodAlpaca) + "\n" +
                                                       "{\"instruction\": \"caf\xe9\", \"output\": \"y\"}\n");
  Error e = expect_error([&] { load_dataset({path}, &smollm2(), chat_options(), nullptr); }, ErrorKind::Data);
  EXPECT_EQ(e.where(), path + ":2:22");  // 0xE9 is column 21; the byte after it shows the sequence is broken
  EXPECT_NE(e.message().find("malformed JSON"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("ill-formed UTF-8 byte"), std::string::npos) << e.message();
}

TEST(DatasetErrors, WrongJsonTypesNameTheFieldAndTheFormat) {
  struct Case {
    std::string row, where_suffix, needle;
  } cases[] = {
      {R"({"instruction": "y", "output": 5})", ":1", "row has 'output' that is not a string (format alpaca"},
      {R"({"messages": "hello"})", ":1", "'messages'"},
      {R"({"messages": [{"role": "user", "content": 3}]})", ":1", "content"},
      {R"({"text": ["a", "b"]})", ":1", "'text'"},
      {std::string(kGoodAlpaca) + "\n\"just a string\"", ":2", "not a JSON object"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.row);
    const std::string path = temp_file("types" + std::to_string(i++) + ".jsonl", c.row + "\n");
    Error e = expect_error([&] { load_dataset({path}, &smollm2(), chat_options(), nullptr); }, ErrorKind::Data);
    EXPECT_EQ(e.where(), path + c.where_suffix);
    EXPECT_NE(e.message().find(c.needle), std::string::npos) << e.message();
  }
}

TEST(DatasetErrors, MissingFieldNamesTheDetectedFormatAndFields) {
  const std::string path =
      temp_file("missing.jsonl", std::string(kGoodAlpaca) + "\n" + R"({"instruction": "No output here."})" + "\n");
  Error e = expect_error([&] { load_dataset({path}, &smollm2(), chat_options(), nullptr); }, ErrorKind::Data);
  EXPECT_EQ(e.where(), path + ":2");
  for (const char* part : {"has no 'output'", "format alpaca", "'instruction' and 'output'", "detected from " })
    EXPECT_NE(e.message().find(part), std::string::npos) << part << " in: " << e.message();
  EXPECT_NE(e.message().find(path + ":1"), std::string::npos) << e.message();
}

TEST(DatasetErrors, RowMatchingNoFormatListsItsKeys) {
  const std::string path = temp_file("nofmt.jsonl", R"({"instrution": "typo", "output": "x"})" "\n");
  Error e = expect_error([&] { load_dataset({path}, &smollm2(), chat_options(), nullptr); }, ErrorKind::Data);
  EXPECT_NE(e.message().find("instrution, output"), std::string::npos) << e.message();
}

TEST(DatasetErrors, RoleTheTemplateRejectsCarriesTheTemplateMessage) {
  const std::string path = temp_file(
      "roles.jsonl",
      R"({"messages": [{"role": "assistant", "content": "I speak first"}, {"role": "user", "content": "odd"}]})" "\n");
  Error e = expect_error([&] { load_dataset({path}, &smollm2(), chat_options(strict_template), nullptr); },
                         ErrorKind::Data);
  EXPECT_EQ(e.where(), path + ":1");
  EXPECT_NE(e.message().find("chat template rejected"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("Conversation roles must alternate"), std::string::npos) << e.message();
}

TEST(DatasetErrors, RaiseExceptionFromARealTemplateNamesTheRow) {
  const std::string path = temp_file(
      "mistral.jsonl",
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})" "\n"
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "again"}, {"role": "assistant", "content": "b"}]})" "\n");
  auto t = std::make_shared<ChatTemplate>(ChatTemplate::builtin("mistral"));
  DatasetOptions o = chat_options([t](const RowJson& m, bool g, const RowJson& e) {
    RowJson ctx = {{"bos_token", "<|im_start|>"}, {"eos_token", "<|im_end|>"}};
    ctx.update(e);
    return t->render(m, g, ctx);
  });
  Error e = expect_error([&] { load_dataset({path}, &smollm2(), o, nullptr); }, ErrorKind::Data);
  EXPECT_EQ(e.where(), path + ":2");
  EXPECT_NE(e.message().find("roles must alternate"), std::string::npos) << e.message();
}

TEST(DatasetErrors, UnknownShareGptRoleIsNamed) {
  const std::string path = temp_file(
      "sg.jsonl", R"({"conversations": [{"from": "narrator", "value": "Once"}, {"from": "gpt", "value": "upon"}]})" "\n");
  Error e = expect_error([&] { load_dataset({path}, &smollm2(), chat_options(), nullptr); }, ErrorKind::Data);
  EXPECT_NE(e.message().find("'narrator'"), std::string::npos) << e.message();
  EXPECT_NE(e.hint().find("human"), std::string::npos) << e.hint();
}

TEST(DatasetErrors, RowsWithoutTrainedTokensAreCountedAndAllOfThemIsAnError) {
  const std::string user_only = R"({"messages": [{"role": "user", "content": "anyone?"}]})";
  const std::string good = R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})";
  DatasetStats st;
  auto ex = load_dataset({temp_file("some.jsonl", user_only + "\n" + good + "\n" + user_only + "\n")}, &smollm2(),
                         chat_options(), &st);
  EXPECT_EQ(ex.size(), 1u);
  EXPECT_EQ(st.no_loss, 2);
  EXPECT_EQ(st.rows, 3);
  Error e = expect_error(
      [&] { load_dataset({temp_file("none.jsonl", user_only + "\n" + user_only + "\n")}, &smollm2(), chat_options(), nullptr); },
      ErrorKind::Data);
  EXPECT_NE(e.message().find("2 without a trained token"), std::string::npos) << e.message();
  EXPECT_NE(e.hint().find("roles_to_train"), std::string::npos);
}

TEST(DatasetErrors, SkipBadRowsCountsEveryKind) {
  const std::string rows = std::string(kGoodAlpaca) + "\n" +                   // good
                           "{\"instruction\": \"x\",\n" +                       // malformed
                           R"({"instruction": "no output"})" + "\n" +           // missing field
                           R"({"instruction": "y", "output": 5})" + "\n" +      // wrong type
                           R"({"instruction": "Again.", "output": "Sure."})" + "\n";  // good
  DatasetOptions o = chat_options();
  o.skip_bad_rows = true;
  DatasetStats st;
  auto ex = load_dataset({temp_file("skip.jsonl", rows)}, &smollm2(), o, &st);
  EXPECT_EQ(ex.size(), 2u);
  EXPECT_EQ(st.bad_rows, 3);
  EXPECT_EQ(st.rows, 5);
  ASSERT_EQ(st.bad_row_messages.size(), 3u);
  EXPECT_NE(st.bad_row_messages[0].find("malformed JSON"), std::string::npos);

  // Rejected roles are skippable too; a template that is missing is not.
  const std::string chat = R"({"messages": [{"role": "assistant", "content": "first"}]})" "\n"
                           R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})" "\n";
  DatasetOptions strict = chat_options(strict_template);
  strict.skip_bad_rows = true;
  DatasetStats st2;
  EXPECT_EQ(load_dataset({temp_file("skip2.jsonl", chat)}, &smollm2(), strict, &st2).size(), 1u);
  EXPECT_EQ(st2.bad_rows, 1);
  DatasetOptions none;
  none.skip_bad_rows = true;
  expect_error([&] { load_dataset({temp_file("skip3.jsonl", chat)}, &smollm2(), none, nullptr); }, ErrorKind::Config);
}

// Five text rows of known lengths under each truncation policy.
TEST(DatasetErrors, TruncationPoliciesAreCountedAndExact) {
  std::string rows;
  for (int n : {2, 5, 9, 14, 30}) {
    std::string t;
    for (int i = 0; i < n; i++) t += " a";
    rows += R"({"text": ")" + t + "\"}\n";
  }
  const std::string path = temp_file("trunc.jsonl", rows);
  auto load = [&](Truncation policy, DatasetStats* st) {
    DatasetOptions o;
    o.max_length = 10;
    o.truncation = policy;
    return load_dataset({path}, &smollm2(), o, st);
  };
  // " a" is one token; + EOS: lengths 3, 6, 10, 15, 31.
  DatasetStats st;
  auto right = load(Truncation::TruncateRight, &st);
  EXPECT_EQ(st.truncated, 2);
  EXPECT_EQ(right.size(), 5u);
  EXPECT_EQ(right[3].ids.size(), 10u);
  EXPECT_NE(right[3].ids.back(), *smollm2().eos_id());  // the end (and EOS) is cut
  auto left = load(Truncation::TruncateLeft, &st);
  EXPECT_EQ(st.truncated, 2);
  EXPECT_EQ(left[4].ids.size(), 10u);
  EXPECT_EQ(left[4].ids.back(), *smollm2().eos_id());  // the start is cut
  auto drop = load(Truncation::Drop, &st);
  EXPECT_EQ(drop.size(), 3u);
  EXPECT_EQ(st.dropped, 2);
  EXPECT_EQ(st.truncated, 0);
  Error e = expect_error([&] { load(Truncation::Error, nullptr); }, ErrorKind::Data);
  EXPECT_EQ(e.where(), path + ":4");
  EXPECT_NE(e.message().find("15 tokens, above max_length 10"), std::string::npos) << e.message();
}

// truncation: drop and every row is too long: the error says so, with the shortest row and its length.
TEST(DatasetErrors, AllRowsLongerThanMaxLengthIsAnError) {
  std::string rows;
  for (int n : {30, 12, 20}) {
    std::string t;
    for (int i = 0; i < n; i++) t += " a";
    rows += R"({"text": ")" + t + "\"}\n";
  }
  const std::string path = temp_file("all_long.jsonl", rows);
  DatasetOptions o;
  o.max_length = 10;
  o.truncation = Truncation::Drop;
  Error e = expect_error([&] { load_dataset({path}, &smollm2(), o, nullptr); }, ErrorKind::Data);
  EXPECT_EQ(e.where(), path);
  EXPECT_EQ(e.message(), "no usable example: all 3 rows are longer than max_length 10 and truncation is 'drop' "
                         "(the shortest, 13 tokens, is " + path + ":2)");
  EXPECT_EQ(e.hint(), "raise max_length to at least 13, or set truncation: truncate_right | truncate_left");
}

TEST(DatasetErrors, PretokenizedIdsAreChecked) {
  const std::string path = temp_file("ids.jsonl", R"({"input_ids": [1, 2, 3], "labels": [1, 2]})" "\n");
  Error e = expect_error([&] { load_dataset({path}, nullptr, DatasetOptions{}, nullptr); }, ErrorKind::Data);
  EXPECT_NE(e.message().find("'labels' has 2 entries but 'input_ids' has 3"), std::string::npos);
  DatasetOptions o;
  o.vocab_size = 100;
  const std::string big = temp_file("big.jsonl", R"({"input_ids": [1, 200, 3]})" "\n");
  Error v = expect_error([&] { load_dataset({big}, nullptr, o, nullptr); }, ErrorKind::Data);
  EXPECT_NE(v.message().find("token id 200"), std::string::npos);
  // Text rows need a tokenizer; pre-tokenized rows do not.
  Error t = expect_error([&] { load_dataset({datasets() + "/text.jsonl"}, nullptr, DatasetOptions{}, nullptr); },
                         ErrorKind::Config);
  EXPECT_EQ(load_dataset({datasets() + "/pretokenized.jsonl"}, nullptr, DatasetOptions{}, nullptr).size(), 2u);
}

TEST(DatasetErrors, EmptyAndMissingFiles) {
  const std::string empty = temp_file("empty.jsonl", "\n\n");
  Error e = expect_error([&] { load_dataset({empty}, &smollm2(), DatasetOptions{}, nullptr); }, ErrorKind::Data);
  EXPECT_EQ(e.where(), empty);
  EXPECT_EQ(e.message(), "dataset is empty");
  Error m = expect_error([&] { load_dataset({"/nonexistent/x.jsonl"}, &smollm2(), DatasetOptions{}, nullptr); }, ErrorKind::Io);
  EXPECT_EQ(m.where(), "/nonexistent/x.jsonl");
  Error c = expect_error([] { parse_format("alpacca", "config key 'dataset_format'"); }, ErrorKind::Config);
  EXPECT_NE(c.hint().find("alpaca"), std::string::npos);
}

}  // namespace
}  // namespace qlora
