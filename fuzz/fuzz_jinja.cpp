// Chat templates: the Jinja lexer and parser, then rendering a conversation with and without the
// generation prompt (filters, tests, macros, loops, raise_exception, string methods).
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "Define 'lexicon'."},
    {"role": "assistant", "content": "A vocabulary.", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
    {"role": "tool", "content": "{\"ok\": true}"},
    {"role": "user", "content": ["part", {"type": "text", "text": "two"}]}
  ])");
  static const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(
      R"({"bos_token": "<s>", "eos_token": "</s>", "tools": [{"type": "function", "function": {"name": "f"}}]})");
  qlora::fuzz::expect_clean_error([&] {
    auto t = qlora::ChatTemplate::from_source(std::string(qlora::fuzz::as_text(data, size)), "fuzz.jinja");
    t.set_clock([] { return std::tm{}; });
    qlora::fuzz::expect_clean_error([&] { t.render(messages, false, extra); });
    qlora::fuzz::expect_clean_error([&] { t.render_with_spans(messages, true, extra); });
  });
  return 0;
}
