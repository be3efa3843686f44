// Chat templates: a model's Jinja chat_template (or a built-in) rendered as apply_chat_template does.
#pragma once
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/jinja.h"

namespace qlora {

class ChatTemplate {
 public:
  // Parse errors: Error(Format, "<name>:<line>:<col>", what, hint).
  static ChatTemplate from_source(std::string jinja_source, std::string name);
  // chatml | llama3 | mistral | alpaca; anything else: Error(Config) listing the names.
  static ChatTemplate builtin(const std::string& name);
  static const std::vector<std::string>& builtin_names();

  // messages: JSON array of {"role": ..., "content": ...} objects. extra_context: what else the
  // template reads (bos_token, eos_token, tools, documents, date_string, ...); `tools` and
  // `documents` are none unless given, as transformers passes them. A template's
  // raise_exception(msg) becomes Error(Data) whose message() is msg (hint:
  // jinja::kRaisedByTemplateHint); other render failures are Error(Data, "<name>:<line>:<col>").
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& extra_context = nlohmann::json::object()) const;
  // The same with JSON objects in their given key order: tool schemas then print in that order, as
  // Python dicts do (nlohmann::json sorts keys).
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra_context = nlohmann::ordered_json::object()) const;

  struct Rendered {
    Rendered() = default;
    Rendered(std::string t) : text(std::move(t)) {}  // NOLINT(google-explicit-constructor): a plain rendering
    std::string text;
    // The template has {% generation %} blocks, and the byte ranges of text they produced: what the
    // assistant says, for templates that mark it (transformers' return_assistant_tokens_mask).
    bool marks_generation = false;
    std::vector<jinja::Span> generation;
  };
  Rendered render_with_spans(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& extra_context) const;
  bool marks_generation() const { return tmpl_.marks_generation(); }

  // strftime_now's clock (templates such as Llama 3.2's print today's date); local time when unset.
  void set_clock(std::function<std::tm()> now) { opts_.now = std::move(now); }

  const std::string& source() const { return source_; }
  const std::string& name() const { return name_; }

 private:
  ChatTemplate(std::string source, std::string name, jinja::Template tmpl)
      : source_(std::move(source)), name_(std::move(name)), tmpl_(std::move(tmpl)) {}

  std::string source_, name_;
  jinja::Template tmpl_;
  jinja::RenderOptions opts_;
};

}  // namespace qlora
