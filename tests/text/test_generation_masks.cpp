// Loss masks from a chat template's {% generation %} marks, against transformers'
// apply_chat_template(return_assistant_tokens_mask=True) (tools/make_chat_template_fixtures.py,
// assistant_masks.json): multi-turn Qwen3 and gpt-oss conversations whose earlier turns render
// differently once later turns follow, which rendering prefixes cannot mask. The templates are the
// ones examples/chat_templates/ ships.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "chat_template_test_util.h"
#include "core/error.h"
#include "io/json_util.h"
#include "test_dataset_util.h"
#include "text/chat_template.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace qlora {
namespace {

using json = nlohmann::json;
using chat_test::ojson;

// SmolLM2's tokenizer with `added` as special tokens numbered from the end of its vocabulary, as the
// fixture script builds it.
Tokenizer smollm2_with(const std::vector<std::string>& added) {
  json doc = json::parse(read_text_file(dataset_test::fixtures() + "/tok/smollm2/tokenizer.json"));
  int64_t next = int64_t(doc["model"]["vocab"].size());
  for (const json& t : doc["added_tokens"]) next = std::max<int64_t>(next, t["id"].get<int64_t>() + 1);
  for (const std::string& content : added)
    doc["added_tokens"].push_back({{"id", next++}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", true}});
  return Tokenizer::from_json(doc.dump(), "smollm2 tokenizer.json + added");
}

ChatTemplate template_of(const ojson& c, const std::tm& now, bool marked) {
  const std::string file = marked ? std::string(QLORA_SOURCE_DIR) + "/" + c["template_file"].get<std::string>()
                                  : chat_test::kDir + "/" + c["original"].get<std::string>() + ".jinja";
  ChatTemplate t = ChatTemplate::from_source(read_text_file(file), file);
  t.set_clock([now] { return now; });
  return t;
}

Row chat_row(const ojson& c) {
  Row r;
  r.kind = Row::Chat;
  r.messages = c["messages"];
  r.extra = c["extra_context"];
  for (const RowJson& m : r.messages) r.trained.push_back(m["role"] == "assistant");
  return r;
}

TEST(GenerationMasks, LossIsOnTheMarkedTextAsTransformersMasksIt) {
  const ojson doc = chat_test::load("assistant_masks.json");
  const std::tm now = chat_test::parse_now(doc["fixed_now"].get<std::string>());
  std::set<std::string> templates;
  for (const ojson& c : doc["cases"]) {
    SCOPED_TRACE(c["template"].get<std::string>() + " / " + c["case"].get<std::string>());
    const Tokenizer tok = smollm2_with(c["added_special_tokens"].get<std::vector<std::string>>());
    auto t = std::make_shared<const ChatTemplate>(template_of(c, now, true));
    ASSERT_TRUE(t->marks_generation());
    const Row row = chat_row(c);
    EncodeInfo info;
    const Example ex = encode_row(row, &tok, MaskOptions{}, dataset_test::render_with(t), "case", &info);
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto mask = c["assistant_masks"].get<std::vector<int>>();
    ASSERT_EQ(ex.ids, ids);
    std::vector<int32_t> labels(ids.size());
    for (size_t i = 0; i < ids.size(); i++) labels[i] = mask[i] ? ids[i] : kNoLoss;
    EXPECT_EQ(ex.labels, labels);
    EXPECT_TRUE(info.generation_marks);
    EXPECT_FALSE(info.split_mismatch);
    EXPECT_EQ(info.eos_added, 0);

    // The model's own template renders the same text but cannot place a mask by prefixes: earlier
    // turns change once later ones follow. The error points at the marked template.
    auto plain = std::make_shared<const ChatTemplate>(template_of(c, now, false));
    EXPECT_FALSE(plain->marks_generation());
    EXPECT_EQ(plain->render(row.messages, false, row.extra), c["text"].get<std::string>());
    try {
      encode_row(row, &tok, MaskOptions{}, dataset_test::render_with(plain), "data.jsonl:3", nullptr);
      ADD_FAILURE() << "the unmarked template placed a mask";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Data);
      EXPECT_EQ(e.where(), "data.jsonl:3");
      EXPECT_NE(e.message().find("differently from the start of the whole conversation"), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("{% generation %}"), std::string::npos) << e.what();
    }
    templates.insert(c["template"].get<std::string>());
  }
  EXPECT_EQ(templates, (std::set<std::string>{"qwen3_assistant_mask", "gpt_oss_assistant_mask"}));
}

TEST(GenerationMasks, OtherRolesToTrainFallBackToRenderingPrefixes) {
  // The marks say what the assistant writes; a row that trains other roles (or not every assistant
  // turn) is masked by rendering prefixes, which a template rendering turns incrementally allows.
  const std::string src =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n"
      "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}"
      "{% else %}{{ m.content }}<|im_end|>{% endif %}\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  auto t = std::make_shared<const ChatTemplate>(ChatTemplate::from_source(src, "marked chatml"));
  Row row;
  row.kind = Row::Chat;
  row.messages = RowJson::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                                 {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Ciao"}])");
  const Tokenizer& tok = dataset_test::smollm2();
  auto trained_text = [&](const Example& ex) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < ex.ids.size(); i++)
      if (ex.labels[i] != kNoLoss) ids.push_back(ex.ids[i]);
    return tok.decode(ids, false);
  };
  const ChatRenderFn render = dataset_test::render_with(t);
  EncodeInfo info;
  row.trained = {0, 1, 0, 1};
  EXPECT_EQ(trained_text(encode_row(row, &tok, MaskOptions{}, render, "r", &info)), "Hello<|im_end|>Ciao<|im_end|>");
  EXPECT_TRUE(info.generation_marks);
  row.trained = {1, 1, 1, 1};  // roles_to_train: [user, assistant]
  const Example all = encode_row(row, &tok, MaskOptions{}, render, "r", &info);
  EXPECT_FALSE(info.generation_marks);
  EXPECT_EQ(trained_text(all), "Hi<|im_end|>Hello<|im_end|>Bye<|im_end|>Ciao<|im_end|>");
  row.trained = {0, 0, 0, 1};  // the completion of a conversational prompt/completion row
  EXPECT_EQ(trained_text(encode_row(row, &tok, MaskOptions{}, render, "r", &info)), "Ciao<|im_end|>");
  EXPECT_FALSE(info.generation_marks);
}

TEST(GenerationMasks, JsonlRowsKeepTheirKeyOrderAndCountTheMarkedRows) {
  // Through the JSONL reader: tool schemas print in the row's key order (Qwen3 prints them with
  // tojson), so the ids are transformers' for tool rows too.
  const ojson doc = chat_test::load("assistant_masks.json");
  const std::tm now = chat_test::parse_now(doc["fixed_now"].get<std::string>());
  std::string jsonl;
  std::vector<const ojson*> cases;
  for (const ojson& c : doc["cases"]) {
    if (c["template"] != "qwen3_assistant_mask") continue;
    ojson row = {{"messages", c["messages"]}};
    if (c["extra_context"].contains("tools")) row["tools"] = c["extra_context"]["tools"];
    jsonl += row.dump() + "\n";
    cases.push_back(&c);
  }
  ASSERT_GE(cases.size(), 3u);
  const std::string path = dataset_test::temp_file("qwen3_marked.jsonl", jsonl);
  DatasetOptions o;
  o.max_length = 100000;
  o.render = dataset_test::render_with(std::make_shared<const ChatTemplate>(template_of(*cases[0], now, true)));
  DatasetStats st;
  const std::vector<Example> got = load_dataset(DatasetSpec{path, 1.0, DatasetFormat::Auto}, &dataset_test::smollm2(), o, &st);
  ASSERT_EQ(got.size(), cases.size());
  for (size_t i = 0; i < got.size(); i++) {
    SCOPED_TRACE((*cases[i])["case"].get<std::string>());
    EXPECT_EQ(got[i].ids, (*cases[i])["ids"].get<std::vector<int32_t>>());
    const auto mask = (*cases[i])["assistant_masks"].get<std::vector<int>>();
    for (size_t k = 0; k < mask.size() && k < got[i].labels.size(); k++)
      EXPECT_EQ(got[i].labels[k] != kNoLoss, bool(mask[k])) << "token " << k;
  }
  EXPECT_EQ(st.generation_marked, int64_t(cases.size()));
  EXPECT_EQ(st.split_mismatch, 0);
  // Without the marks the first row is refused, naming its line.
  o.render = dataset_test::render_with(std::make_shared<const ChatTemplate>(template_of(*cases[0], now, false)));
  try {
    load_dataset(DatasetSpec{path, 1.0, DatasetFormat::Auto}, &dataset_test::smollm2(), o, &st);
    ADD_FAILURE() << "the unmarked template placed masks";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Data);
    EXPECT_EQ(e.where(), path + ":1");
  }
}

}  // namespace
}  // namespace qlora
