// Chat templates vs transformers: real model templates, built-ins, SmolLM2 token ids, errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>

#include "core/error.h"
#include "io/json_util.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "chat_template_test_util.h"

namespace qlora {
namespace {

using namespace chat_test;

const Tokenizer& smollm2() {
  static const Tokenizer t = Tokenizer::from_file(std::string(QLORA_FIXTURES) + "/text/tok/smollm2");
  return t;
}

// Renders one fixture case and checks text, error, generation spans and token ids.
void check_case(const ChatTemplate& tmpl, const ojson& c) {
  bool agp = c["add_generation_prompt"].get<bool>();
  if (c.contains("error")) {
    try {
      tmpl.render(c["messages"], agp, c["extra_context"]);
      ADD_FAILURE() << "rendered, but transformers raised: " << c["error"];
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Data) << e.what();
      EXPECT_EQ(e.message(), c["error"].get<std::string>());
      bool raised = c["error_type"] == "TemplateError";
      EXPECT_EQ(e.hint() == jinja::kRaisedByTemplateHint, raised) << e.what();
    }
    return;
  }
  ChatTemplate::Rendered r;
  try {
    r = tmpl.render_with_spans(c["messages"], agp, c["extra_context"]);
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
    return;
  }
  const std::string expected = c["expected"].get<std::string>();
  EXPECT_EQ(r.text, expected);
  if (c.contains("generation")) {
    EXPECT_EQ(r.generation.size(), c["generation"].size());
    for (size_t i = 0; i < r.generation.size() && i < c["generation"].size(); ++i) {
      EXPECT_EQ(r.generation[i].begin, byte_offset(expected, c["generation"][i][0].get<size_t>()));
      EXPECT_EQ(r.generation[i].end, byte_offset(expected, c["generation"][i][1].get<size_t>()));
    }
  }
  if (c.contains("ids")) {
    EXPECT_EQ(smollm2().encode(r.text, false), c["ids"].get<std::vector<int32_t>>());
  }
}

TEST(ChatTemplateParity, RealTemplatesMatchTransformers) {
  ojson doc = load("conversations.json");
  std::tm now = parse_now(doc["fixed_now"].get<std::string>());
  std::map<std::string, ChatTemplate> templates;
  std::set<std::string> rendered_ok, rejected;
  int with_ids = 0;
  for (const auto& c : doc["cases"]) {
    const std::string name = c["template"].get<std::string>();
    auto it = templates.find(name);
    if (it == templates.end()) {
      std::string src = c.contains("source") ? c["source"].get<std::string>() : read_text_file(kDir + "/" + name + ".jinja");
      ChatTemplate t = ChatTemplate::from_source(src, name);
      t.set_clock([now] { return now; });
      it = templates.emplace(name, std::move(t)).first;
    }
    SCOPED_TRACE(name + " / " + c["case"].get<std::string>() + (c["add_generation_prompt"].get<bool>() ? " +gen" : ""));
    check_case(it->second, c);
    (c.contains("error") ? rejected : rendered_ok).insert(name);
    with_ids += c.contains("ids");
  }
  // Every real template rendered something, and the ones that validate roles rejected something.
  for (const char* t : {"smollm2", "llama3", "llama3_1", "llama3_2", "qwen2_5", "qwen3", "mistral_v0_1", "mistral_v0_3",
                        "mistral_nemo", "mistral_small_3_2", "gemma2", "gemma3", "phi3_mini", "phi3_medium", "phi3_5", "phi4", "gpt_oss",
                        "custom_generation"}) {
    EXPECT_TRUE(rendered_ok.count(t)) << t;
  }
  for (const char* t : {"mistral_v0_1", "mistral_v0_3", "gemma2", "gemma3", "llama3_1", "gpt_oss"}) {
    EXPECT_TRUE(rejected.count(t)) << t;
  }
  EXPECT_GE(with_ids, 10);
}

TEST(ChatTemplateParity, BuiltinsMatchReferenceTemplates) {
  ojson doc = load("builtins.json");
  std::set<std::string> seen;
  for (const auto& c : doc["cases"]) {
    const std::string name = c["builtin"].get<std::string>();
    SCOPED_TRACE(name + " / " + c["case"].get<std::string>());
    check_case(ChatTemplate::builtin(name), c);
    seen.insert(name);
  }
  EXPECT_EQ(seen, std::set<std::string>(ChatTemplate::builtin_names().begin(), ChatTemplate::builtin_names().end()));
}

TEST(ChatTemplateBuiltins, SourcesAreTheModelsTemplates) {
  EXPECT_EQ(ChatTemplate::builtin("chatml").source(), read_text_file(kDir + "/chatml.jinja"));
  EXPECT_EQ(ChatTemplate::builtin("llama3").source(), read_text_file(kDir + "/llama3.jinja"));
  EXPECT_EQ(ChatTemplate::builtin("mistral").source(), read_text_file(kDir + "/mistral_v0_3.jinja"));
  EXPECT_EQ(ChatTemplate::builtin("gemma").source(), read_text_file(kDir + "/gemma3.jinja"));
}

TEST(ChatTemplateBuiltins, WellKnownFormats) {
  // Hand-written expectations of the formats every fine-tuning tool documents.
  ojson msgs = ojson::array({{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Hello"}}});
  ojson tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  EXPECT_EQ(ChatTemplate::builtin("chatml").render(msgs, true, tokens),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ChatTemplate::builtin("llama3").render(msgs, false, ojson{{"bos_token", "<|begin_of_text|>"}}),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>");
  EXPECT_EQ(ChatTemplate::builtin("mistral").render(msgs, false, tokens), "<s>[INST] Hi[/INST] Hello</s>");
  EXPECT_EQ(ChatTemplate::builtin("gemma").render(msgs, true, ojson{{"bos_token", "<bos>"}}),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(ChatTemplate::builtin("alpaca").render(ojson::array({msgs[0]}), true, tokens),
            "<s>Below is an instruction that describes a task. Write a response that appropriately completes the "
            "request.\n\n### Instruction:\nHi\n\n### Response:\n");
}

TEST(ChatTemplateBuiltins, UnknownNameListsBuiltins) {
  try {
    ChatTemplate::builtin("chatm1");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(e.hint().find("did you mean 'chatml'"), std::string::npos) << e.hint();
    for (const auto& n : ChatTemplate::builtin_names()) {
      EXPECT_NE(e.hint().find(n), std::string::npos) << n;
    }
  }
}

TEST(ChatTemplateErrors, ParseErrorsCarryLineAndColumn) {
  auto where_of = [](const std::string& src) {
    try {
      ChatTemplate::from_source(src, "my.jinja");
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Format) << e.what();
      return e.where();
    }
    return std::string("no error");
  };
  // Columns count characters from 1: the `}}` that ends `1 +` too early is at column 8 of line 3.
  EXPECT_EQ(where_of("line one\n{% if x %}\n{{ 1 + }}\n{% endif %}"), "my.jinja:3:8");
  // The unterminated string starts at column 10; columns count characters ("é" is one).
  EXPECT_EQ(where_of("é\n{{ 'a' ~ 'oops }}"), "my.jinja:2:10");
  EXPECT_EQ(where_of("é {{ 'oops }}"), "my.jinja:1:6");
  EXPECT_EQ(where_of("{% for x in xs %}\n  {{ x }}\n"), "my.jinja:2:10");  // end of template
  EXPECT_EQ(where_of("ok\n  {% frobnicate %}"), "my.jinja:2:6");
  EXPECT_EQ(where_of("{{ (1 ] }}"), "my.jinja:1:7");
  EXPECT_EQ(where_of("{{ x | frobnicate }}"), "my.jinja:1:8");  // unknown filter: jinja2 refuses it too
  try {
    ChatTemplate::from_source("a\n{{ xs | groupby('k') }}", "g");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);  // a real jinja2 filter we leave out
    EXPECT_EQ(e.where(), "g:2:9");
  }
}

TEST(ChatTemplateErrors, RaiseExceptionMessageSurfaces) {
  ChatTemplate gemma = ChatTemplate::from_source(read_text_file(kDir + "/gemma2.jinja"), "gemma2");
  ojson msgs = ojson::array({{{"role", "system"}, {"content", "x"}}, {{"role", "user"}, {"content", "y"}}});
  try {
    gemma.render(msgs, false, ojson{{"bos_token", "<bos>"}});
    FAIL() << "expected the template to reject a system message";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Data);
    EXPECT_EQ(e.message(), "System role not supported");
    EXPECT_EQ(e.hint(), jinja::kRaisedByTemplateHint);
    EXPECT_EQ(e.where(), "gemma2:1:59");  // the raise_exception call
  }
}

TEST(ChatTemplateErrors, RuntimeErrorsAreLocated) {
  ChatTemplate t = ChatTemplate::from_source("{{ messages[0].content }}\n{{ messages[1].content }}", "t");
  ojson one = ojson::array({{{"role", "user"}, {"content", "a"}}});
  try {
    t.render(one, false, ojson::object());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Data);
    EXPECT_EQ(e.where().rfind("t:2:", 0), 0u) << e.where();
    EXPECT_EQ(e.message(), "list object has no element 1");
  }
  EXPECT_THROW(t.render(ojson::array({1}), false, ojson::object()), Error);  // a message must be an object
}

TEST(ChatTemplateContext, ToolsAndDocumentsDefaultToNone) {
  ChatTemplate t = ChatTemplate::from_source("{{ tools is none }} {{ documents is none }} {{ x | default('-') }}", "t");
  EXPECT_EQ(t.render(ojson::array(), false, ojson::object()), "True True -");
  EXPECT_EQ(t.render(ojson::array(), false, ojson{{"tools", ojson::array()}, {"x", 1}}), "False True 1");
}

TEST(ChatTemplateContext, SortedJsonOverloadPrintsSortedKeys) {
  // nlohmann::json keeps keys sorted, so tool schemas print in key order; ordered_json keeps
  // the caller's order as Python dicts do.
  ChatTemplate t = ChatTemplate::from_source("{{ tools[0] | tojson }}", "t");
  nlohmann::json sorted_tools = nlohmann::json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  ojson ordered_tools = ojson::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  EXPECT_EQ(t.render(nlohmann::json::array(), false, nlohmann::json{{"tools", sorted_tools}}),
            R"({"function": {"name": "f"}, "type": "function"})");
  EXPECT_EQ(t.render(ojson::array(), false, ojson{{"tools", ordered_tools}}),
            R"({"type": "function", "function": {"name": "f"}})");
  // Without extra context each overload picks its own JSON type: no silent conversion to sorted keys.
  ChatTemplate m = ChatTemplate::from_source("{{ messages[0] | tojson }}", "m");
  EXPECT_EQ(m.render(ojson::parse(R"([{"role": "user", "content": "x"}])"), false), R"({"role": "user", "content": "x"})");
  EXPECT_EQ(m.render(nlohmann::json::parse(R"([{"role": "user", "content": "x"}])"), false),
            R"({"content": "x", "role": "user"})");
}

TEST(ChatTemplateContext, ClockHookFeedsStrftimeNow) {
  ChatTemplate t = ChatTemplate::from_source("{{ strftime_now('%d %b %Y') }}", "t");
  t.set_clock([] {
    std::tm tm{};
    tm.tm_year = 2030 - 1900;
    tm.tm_mon = 0;
    tm.tm_mday = 2;
    return tm;
  });
  EXPECT_EQ(t.render(ojson::array(), false, ojson::object()), "02 Jan 2030");
}

TEST(ChatTemplateContext, DeepMacroRecursionIsAnErrorNotACrash) {
  ChatTemplate t = ChatTemplate::from_source("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "t");
  EXPECT_THROW(t.render(ojson::array(), false, ojson::object()), Error);
}

TEST(ChatTemplateErrors, PathologicalNestingIsAnError) {
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_THROW(ChatTemplate::from_source(deep, "deep"), Error);
  std::string ifs;
  for (int i = 0; i < 2000; ++i) ifs += "{% if true %}";
  EXPECT_THROW(ChatTemplate::from_source(ifs, "ifs"), Error);
  std::string nots = "{{ " + [] {
    std::string s;
    for (int i = 0; i < 5000; ++i) s += "not ";
    return s;
  }() + "x }}";
  EXPECT_THROW(ChatTemplate::from_source(nots, "nots"), Error);
  // 100 levels is fine.
  EXPECT_EQ(ChatTemplate::from_source("{{ " + std::string(100, '(') + "1" + std::string(100, ')') + " }}", "ok")
                .render(ojson::array(), false, ojson::object()),
            "1");
}

TEST(ChatTemplateSpeed, RendersManyConversationsQuickly) {
  // Rendering runs once per training example; a dataset of 100k conversations must not wait on it.
  ChatTemplate t = ChatTemplate::from_source(read_text_file(kDir + "/llama3_1.jinja"), "llama3_1");
  ojson msgs = ojson::array();
  for (int i = 0; i < 8; ++i)
    msgs.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "message number " + std::to_string(i)}});
  ojson extra = {{"bos_token", "<|begin_of_text|>"}};
  auto t0 = std::chrono::steady_clock::now();
  size_t bytes = 0;
  for (int i = 0; i < 2000; ++i) bytes += t.render(msgs, true, extra).size();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(bytes, 2000u * 300);
  EXPECT_LT(s, 10.0) << "2000 renders took " << s << " s";
  std::printf("[ info ] llama3_1 template: %.0f renders/s\n", 2000 / s);
}

}  // namespace
}  // namespace qlora
