// A chat row's template context besides its messages: `tools` and TRL's per-row
// `chat_template_kwargs` reach the template (gpt-oss's reasoning_effort, Qwen3's enable_thinking),
// in SFT and preference rows alike, and malformed kwargs are refused naming the row.
#include <gtest/gtest.h>

#include "chat_template_test_util.h"
#include "core/error.h"
#include "io/json_util.h"
#include "test_dataset_util.h"
#include "text/chat_template.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace qlora {
namespace {

using chat_test::ojson;

std::shared_ptr<const ChatTemplate> real_template(const std::string& name) {
  auto t = std::make_shared<ChatTemplate>(
      ChatTemplate::from_source(read_text_file(chat_test::kDir + "/" + name + ".jinja"), name));
  t->set_clock([] { return chat_test::parse_now("2024-09-05T14:30:00"); });
  return t;
}

std::vector<Example> load(const std::string& name, const std::string& jsonl, std::shared_ptr<const ChatTemplate> t,
                          DatasetStats* st = nullptr) {
  DatasetOptions o;
  o.max_length = 100000;
  o.render = dataset_test::render_with(std::move(t));
  return load_dataset(DatasetSpec{dataset_test::temp_file(name, jsonl), 1.0, DatasetFormat::Auto},
                      &dataset_test::smollm2(), o, st);
}

TEST(RowTemplateContext, ChatTemplateKwargsReachTheTemplate) {
  const auto gpt_oss = real_template("gpt_oss");
  const ojson msgs = ojson::parse(R"([{"role": "user", "content": "Capital of France?"},
                                      {"role": "assistant", "content": "Paris.", "thinking": "Easy."}])");
  const std::string with = ojson{{"messages", msgs}, {"chat_template_kwargs", {{"reasoning_effort", "high"}}}}.dump();
  const std::string without = ojson{{"messages", msgs}}.dump();
  const std::vector<Example> got = load("kwargs.jsonl", with + "\n" + without + "\n", gpt_oss);
  ASSERT_EQ(got.size(), 2u);
  const Tokenizer& tok = dataset_test::smollm2();
  // SmolLM2's byte-level ids decode to the rendered text exactly; its EOS follows, as the turn's end
  // (<|return|>) is no special token of this tokenizer.
  const std::string eos = tok.decode({*tok.eos_id()});
  EXPECT_EQ(tok.decode(got[0].ids), gpt_oss->render(msgs, false, ojson{{"reasoning_effort", "high"}}) + eos);
  EXPECT_EQ(tok.decode(got[1].ids), gpt_oss->render(msgs, false, ojson::object()) + eos);
  EXPECT_NE(tok.decode(got[0].ids).find("Reasoning: high"), std::string::npos);
  EXPECT_NE(tok.decode(got[1].ids).find("Reasoning: medium"), std::string::npos);  // the template's default

  // A preference row's prompt and completions are rendered with them too (Qwen3 without thinking).
  const auto qwen3 = real_template("qwen3");
  const ojson pref = {{"prompt", ojson::parse(R"([{"role": "user", "content": "Hi"}])")},
                      {"chosen", ojson::parse(R"([{"role": "assistant", "content": "Hello!"}])")},
                      {"rejected", ojson::parse(R"([{"role": "assistant", "content": "Go away."}])")},
                      {"chat_template_kwargs", {{"enable_thinking", false}}}};
  const std::vector<Example> p = load("pref.jsonl", pref.dump() + "\n", qwen3);
  ASSERT_EQ(p.size(), 1u);
  const std::string prompt = qwen3->render(pref["prompt"], true, ojson{{"enable_thinking", false}});
  EXPECT_NE(prompt.find("<think>\n\n</think>"), std::string::npos) << prompt;  // what enable_thinking false adds
  const std::string chosen = qwen3->render(ojson::array({pref["prompt"][0], pref["chosen"][0]}), false,
                                           ojson{{"enable_thinking", false}});
  EXPECT_EQ(chosen.rfind(prompt, 0), 0u);
  EXPECT_EQ(tok.decode(p[0].ids).rfind(chosen, 0), 0u) << tok.decode(p[0].ids);  // the chosen document first
}

TEST(RowTemplateContext, MalformedKwargsAreRefusedNamingTheRow) {
  const auto t = real_template("qwen3");
  const std::string msgs = R"("messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])";
  const struct {
    std::string kwargs, what;
  } cases[] = {{R"("yes")", "'chat_template_kwargs' that is not an object"},
               {R"({"tools": []})", "chat_template_kwargs.tools, which the renderer sets itself"},
               {R"({"add_generation_prompt": true})", "chat_template_kwargs.add_generation_prompt"},
               {R"({"messages": []})", "chat_template_kwargs.messages"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.kwargs);
    const std::string jsonl = R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})"
                              "\n{" + msgs + R"(, "chat_template_kwargs": )" + c.kwargs + "}\n";
    try {
      load("bad_kwargs.jsonl", jsonl, t);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Data);
      EXPECT_NE(e.where().find("bad_kwargs.jsonl:2"), std::string::npos) << e.what();
      EXPECT_NE(e.message().find(c.what), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace qlora
