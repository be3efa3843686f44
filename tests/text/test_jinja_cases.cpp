// Jinja feature parity with jinja2 on small templates (fixtures/text/chat_templates/jinja_cases.json).
#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>

#include "core/error.h"
#include "io/json_util.h"
#include "text/jinja.h"
#include "text/jinja_pystr.h"
#include "chat_template_test_util.h"

namespace qlora {
namespace {

using namespace chat_test;

TEST(JinjaCases, MatchJinja2) {
  // QLORA_JINJA_CASES names another case file of the same shape (e.g. a large generated one).
  const char* other = std::getenv("QLORA_JINJA_CASES");
  ojson doc = other ? ojson::parse(read_text_file(other)) : load("jinja_cases.json");
  jinja::RenderOptions opts;
  std::tm now = parse_now(doc["fixed_now"].get<std::string>());
  opts.now = [now] { return now; };
  int rendered = 0, failed_as_expected = 0;
  for (const auto& c : doc["cases"]) {
    const std::string name = c["name"].get<std::string>();
    const std::string src = c["template"].get<std::string>();
    SCOPED_TRACE("case " + name + "\ntemplate: " + src);
    if (c.contains("expected")) {
      std::vector<jinja::Span> spans;
      std::string out;
      try {
        out = jinja::Template::parse(src, name).render(jinja::Value::from_json(c["context"]), opts, &spans);
      } catch (const Error& e) {
        ADD_FAILURE() << "threw: " << e.what();
        continue;
      }
      EXPECT_EQ(out, c["expected"].get<std::string>());
      if (c.contains("generation")) {
        EXPECT_EQ(spans.size(), c["generation"].size());
        for (size_t i = 0; i < spans.size() && i < c["generation"].size(); ++i) {
          EXPECT_EQ(spans[i].begin, byte_offset(out, c["generation"][i][0].get<size_t>()));
          EXPECT_EQ(spans[i].end, byte_offset(out, c["generation"][i][1].get<size_t>()));
        }
      }
      ++rendered;
      continue;
    }
    const std::string type = c["error_type"].get<std::string>();
    const std::string message = c["error"].get<std::string>();
    bool syntax = type == "TemplateSyntaxError" || type == "SyntaxError";
    try {
      jinja::Template t = jinja::Template::parse(src, name);
      if (syntax) {
        ADD_FAILURE() << "jinja2 rejects this template when compiling: " << message;
        continue;
      }
      t.render(jinja::Value::from_json(c["context"]), opts);
      ADD_FAILURE() << "rendered, but jinja2 raised " << type << ": " << message;
    } catch (const Error& e) {
      if (syntax) {
        EXPECT_TRUE(e.kind() == ErrorKind::Format || e.kind() == ErrorKind::Unsupported) << e.what();
        if (c.contains("line")) {
          EXPECT_EQ(e.where().rfind(name + ":" + std::to_string(c["line"].get<int>()) + ":", 0), 0u) << e.what();
        }
      } else {
        EXPECT_EQ(e.kind(), ErrorKind::Data) << e.what();
        EXPECT_EQ(e.where().rfind(name + ":", 0), 0u) << "no location: " << e.what();
        if (type == "TemplateError") {
          // raise_exception: the template's own message, verbatim.
          EXPECT_EQ(e.message(), message);
          EXPECT_EQ(e.hint(), jinja::kRaisedByTemplateHint);
        } else {
          EXPECT_NE(e.hint(), jinja::kRaisedByTemplateHint);
          // jinja2's own wording for undefined values, type errors and the sandbox's refusals.
          EXPECT_EQ(e.message(), message);
        }
      }
      ++failed_as_expected;
    }
  }
  if (!other) {
    EXPECT_GT(rendered, 80);
    EXPECT_GT(failed_as_expected, 20);
  }
}

}  // namespace
}  // namespace qlora

namespace qlora {
// Integers are 64-bit here (jinja2's are unbounded): a literal past int64, decimal or hex, octal
// and binary, is an error naming the limit, not an overflow (found by fuzz_jinja:
// fuzz/regressions/jinja/hex_literal_past_int64); the largest one still parses.
TEST(JinjaLexer, IntegerLiteralsPastInt64AreAnError) {
  for (const std::string& lit : std::vector<std::string>{"9223372036854775808", "0x8000000000000000", "0o1000000000000000000000",
                                "0b1" + std::string(63, '0'), "0xFFFFFFFFFFFFFFFFFFFF"}) {
    SCOPED_TRACE(lit);
    try {
      jinja::Template::parse("{{ " + lit + " }}", "t");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("integer literal out of range"), std::string::npos) << e.what();
    }
  }
  jinja::RenderOptions opts;
  for (const std::string& lit : std::vector<std::string>{"9223372036854775807", "0x7FFFFFFFFFFFFFFF", "0o777777777777777777777", "0b" + std::string(63, '1')})
    EXPECT_EQ(jinja::Template::parse("{{ " + lit + " }}", "t").render(jinja::Value::from_json(json::object()), opts),
              "9223372036854775807")
        << lit;
}
}  // namespace qlora
