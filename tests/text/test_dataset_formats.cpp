// Dataset formats against the transformers-based reference (tools/make_dataset_fixtures.py): ids and
// labels must match exactly for every format, mask option and template, with no turn-split mismatch.
#include <gtest/gtest.h>

#include "test_dataset_util.h"

#include "text/chat_template.h"

namespace qlora {
namespace {

using namespace dataset_test;
using json = nlohmann::json;

struct Renderer {
  std::string name;
  ChatRenderFn fn;
};

// Stand-ins always; the real Jinja engine too when it is built.
std::vector<Renderer> renderers(const json& options) {
  const bool plain = options.contains("chat_template");
  std::vector<Renderer> r = {{"stand-in", plain ? ChatRenderFn(plain_template) : ChatRenderFn(smollm2_chatml)}};
  const std::string src = plain ? options["chat_template"].get<std::string>() : smollm2().chat_template();
  auto t = std::make_shared<ChatTemplate>(ChatTemplate::from_source(src, "fixture template"));
  r.push_back({"jinja", [t](const RowJson& m, bool g, const RowJson& e) { return t->render(m, g, e); }});
  return r;
}

DatasetOptions options_for(const json& c) {
  DatasetOptions o;
  o.max_length = 100000;
  const json& opt = c["options"];
  o.mask.train_on_inputs = opt.value("train_on_inputs", false);
  if (opt.contains("roles_to_train")) o.mask.roles_to_train = opt["roles_to_train"].get<std::vector<std::string>>();
  return o;
}

TEST(DatasetFormats, MatchTheTransformersReference) {
  const json expected = read_json(datasets() + "/expected.json");
  ASSERT_EQ(expected["eos_token_id"].get<int>(), *smollm2().eos_id());
  int n_cases = 0;
  for (const json& c : expected["cases"]) {
    for (const Renderer& r : renderers(c["options"])) {
      SCOPED_TRACE(c["name"].get<std::string>() + " / " + r.name);
      DatasetOptions o = options_for(c);
      o.render = r.fn;
      DatasetStats st;
      const DatasetSpec spec{datasets() + "/" + c["file"].get<std::string>(), 1.0,
                             parse_format(c["format"].get<std::string>(), "test")};
      const std::vector<Example> got = load_dataset(spec, &smollm2(), o, &st);
      ASSERT_EQ(got.size(), c["rows"].size());
      for (size_t i = 0; i < got.size(); i++) {
        EXPECT_EQ(got[i].ids, c["rows"][i]["ids"].get<std::vector<int32_t>>()) << "row " << i;
        EXPECT_EQ(got[i].labels, c["rows"][i]["labels"].get<std::vector<int32_t>>()) << "row " << i;
      }
      EXPECT_EQ(st.split_mismatch, 0);
      EXPECT_EQ(st.format, c["format"].get<std::string>());
      n_cases++;
    }
  }
  EXPECT_EQ(n_cases, 2 * int(expected["cases"].size()));  // stand-in and Jinja engine
}

TEST(DatasetFormats, AutoDetectionFindsEachFormat) {
  const json expected = read_json(datasets() + "/expected.json");
  for (const json& c : expected["cases"]) {
    if (c["options"].contains("chat_template")) continue;
    DatasetOptions o = options_for(c);
    o.render = smollm2_chatml;
    DatasetStats st;
    auto got = load_dataset({datasets() + "/" + c["file"].get<std::string>()}, &smollm2(), o, &st);
    EXPECT_EQ(st.format, c["format"].get<std::string>()) << c["name"];
    ASSERT_EQ(got.size(), c["rows"].size());
    EXPECT_EQ(got.back().labels, c["rows"].back()["labels"].get<std::vector<int32_t>>()) << c["name"];
  }
}

TEST(DatasetFormats, PlainTemplateInsertsOneEosPerTrainedTurn) {
  // messages.jsonl has 5 assistant turns over 4 rows; the plain template ends none with a special token.
  DatasetOptions o;
  o.render = plain_template;
  DatasetStats st;
  auto ex = load_dataset({datasets() + "/messages.jsonl"}, &smollm2(), o, &st);
  EXPECT_EQ(st.eos_added, 5);
  const int32_t eos = *smollm2().eos_id();
  // The EOS closes the response and gets loss; the "\n\n" after it gets none.
  const Example& e = ex[0];
  size_t at = 0;
  std::vector<int32_t> trained;
  for (size_t i = 0; i < e.ids.size(); i++) {
    if (e.ids[i] == eos) at = i;
    if (e.labels[i] != kNoLoss && e.ids[i] != eos) trained.push_back(e.ids[i]);
  }
  ASSERT_GT(at, 0u);
  EXPECT_EQ(e.labels[at], eos);
  EXPECT_EQ(smollm2().decode(trained), "Seven.");
  EXPECT_EQ(smollm2().decode({e.ids.begin() + long(at) + 1, e.ids.end()}), "\n\n");
  for (size_t i = at + 1; i < e.ids.size(); i++) EXPECT_EQ(e.labels[i], kNoLoss);
}

TEST(DatasetFormats, FieldMappingsReadRenamedFields) {
  const std::string path = temp_file(
      "mapped.jsonl",
      R"({"chat": [{"speaker": "user", "text": "Name a prime number."}, {"speaker": "assistant", "text": "Seven."}]})"
      "\n");
  DatasetOptions o;
  o.render = smollm2_chatml;
  o.fields.messages = "chat";
  o.fields.role = "speaker";
  o.fields.content = "text";
  DatasetStats st;
  auto got = load_dataset({path}, &smollm2(), o, &st);
  EXPECT_EQ(st.format, "messages");
  const json expected = read_json(datasets() + "/expected.json");
  for (const json& c : expected["cases"])
    if (c["name"] == "messages") {
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].ids, c["rows"][0]["ids"].get<std::vector<int32_t>>());
      EXPECT_EQ(got[0].labels, c["rows"][0]["labels"].get<std::vector<int32_t>>());
    }
}

TEST(DatasetFormats, JsonArrayFilesReadLikeJsonLines) {
  std::string arr = "[\n";
  std::ifstream in(datasets() + "/alpaca.jsonl");
  bool first = true;
  for (std::string line; std::getline(in, line);) arr += (first ? "" : ",\n") + line, first = false;
  arr += "\n]\n";
  DatasetOptions o;
  o.render = smollm2_chatml;
  auto a = load_dataset({temp_file("alpaca.json", arr)}, &smollm2(), o, nullptr);
  auto b = load_dataset({datasets() + "/alpaca.jsonl"}, &smollm2(), o, nullptr);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) EXPECT_EQ(a[i].labels, b[i].labels);
}

TEST(DatasetFormats, SplitMismatchIsCounted) {
  // "Hel" + "lo world" as separate pieces cannot give the ids of "Hello world".
  const std::string path = temp_file("split.jsonl", R"({"prompt": "Hel", "completion": "lo world"})" "\n"
                                                    R"({"prompt": "Hello", "completion": " world"})" "\n");
  DatasetStats st;
  auto ex = load_dataset({path}, &smollm2(), DatasetOptions{}, &st);
  EXPECT_EQ(st.split_mismatch, 1);
  const auto prompt = smollm2().encode("Hel", false), completion = smollm2().encode("lo world", false);
  ASSERT_EQ(ex[0].ids.size(), prompt.size() + completion.size() + 1);
  EXPECT_NE(std::vector<int32_t>(ex[0].ids.begin(), ex[0].ids.end() - 1), smollm2().encode("Hello world", false));
  for (size_t i = 0; i < prompt.size(); i++) EXPECT_EQ(ex[0].labels[i], kNoLoss);
  for (size_t i = prompt.size(); i < ex[0].ids.size(); i++) EXPECT_EQ(ex[0].labels[i], ex[0].ids[i]);
}

TEST(DatasetFormats, RenderExampleMarksTrainedText) {
  DatasetOptions o;
  o.render = smollm2_chatml;
  auto ex = load_dataset({datasets() + "/messages.jsonl"}, &smollm2(), o, nullptr);
  const std::string s = render_example(ex[0], smollm2(), false);
  EXPECT_NE(s.find("<|im_start|>assistant\n[[Seven.<|im_end|>]]\n"), std::string::npos) << s;
  EXPECT_EQ(s.find("[[<|im_start|>"), std::string::npos) << s;
  const std::string c = render_example(ex[0], smollm2(), true);
  EXPECT_NE(c.find("\x1b[1;32mSeven.<|im_end|>\x1b[0m"), std::string::npos);
}

}  // namespace
}  // namespace qlora
