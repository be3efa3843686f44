// Jinja interpreter for chat templates, rendering as jinja2 does under transformers' chat settings.
#pragma once
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "text/jinja_value.h"

namespace qlora::jinja {

struct Program;

struct RenderOptions {
  // strftime_now's clock; the local time when empty. Tests pin it to a fixed date.
  std::function<std::tm()> now;
};

// Byte range [begin, end) of the rendered text produced inside {% generation %} ... {% endgeneration %}.
struct Span {
  size_t begin = 0, end = 0;
};

// Semantics are jinja2 3.1's as transformers configures it: trim_blocks, lstrip_blocks, one trailing
// newline dropped, loop controls, {% generation %}, the raise_exception / strftime_now / namespace /
// dict / range globals, json.dumps-style tojson, an immutable sandbox (no list/dict mutation),
// Undefined that prints "" and fails when used strictly, lazy generator results of select/map.
// Not supported: extends/include/import/call blocks, recursive loops, *args in calls.
class Template {
 public:
  // Parse errors: Error(Format, "<name>:<line>:<col>", what, hint); Error(Unsupported, ...) for tags,
  // filters and tests this interpreter does not implement.
  static Template parse(const std::string& source, const std::string& name);

  // context: a dict of the template's variables. Errors while rendering (undefined values used
  // strictly, type errors, raise_exception) are Error(Data, "<name>:<line>:<col>", what) — the
  // template's own raise_exception message is what() verbatim.
  std::string render(const Value& context, const RenderOptions& opts = {},
                     std::vector<Span>* generation_spans = nullptr) const;

  const std::string& name() const;
  // The source has a {% generation %} block (transformers' return_assistant_tokens_mask reads them).
  bool marks_generation() const;

 private:
  explicit Template(std::shared_ptr<const Program> p) : program_(std::move(p)) {}
  std::shared_ptr<const Program> program_;
};

// Hint that marks an Error raised by the template's raise_exception() (as opposed to a failure of
// the template itself), so callers can tell "this conversation is rejected" from "broken template".
extern const char* const kRaisedByTemplateHint;

}  // namespace qlora::jinja
