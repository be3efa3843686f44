// Jinja built-ins: filters, tests, sandboxed attribute/item access, operators, Python methods.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "text/jinja_value.h"

namespace qlora::jinja {

bool is_filter(std::string_view name);
bool is_test(std::string_view name);
// Errors are TemplateError (the evaluator adds the location).
Value call_filter(const std::string& name, const Value& input, CallArgs& args);
bool call_test(const std::string& name, const Value& input, CallArgs& args);

// obj.attr: a method of str/dict/list first, then the dict item; Undefined when neither exists.
// Attribute access on Undefined raises, as jinja2 does.
Value get_attr(const Value& obj, const std::string& attr);
// obj[key]: the item first, then (for a string key) the attribute.
Value get_item(const Value& obj, const Value& key);
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// Python len(); TemplateError for values without a length.
int64_t length_of(const Value& v);
// The items `for x in v` visits: list items, dict keys, string characters. Undefined -> none.
ValueList iterate(const Value& v);

// Python binary operators (+ - * / // % **) with TemplateError for unsupported operand types.
Value binary_op(const std::string& op, const Value& a, const Value& b);
// `a in b`.
bool contains(const Value& container, const Value& item);

// Python's printf-style `fmt % args` (args: a tuple, a dict for %(name)s, or one value).
std::string percent_format(const std::string& fmt, const Value& args);
// Python's str.format(*args, **kwargs) with the common format specs.
std::string brace_format(const std::string& fmt, const CallArgs& args);

// Reads positional-or-keyword argument `i` named `name`; nullopt when absent.
std::optional<Value> arg(const CallArgs& args, size_t i, std::string_view name);
// Fails when more positional arguments or unknown keywords were passed than `names` lists.
void check_args(const CallArgs& args, const std::string& fn, std::initializer_list<std::string_view> names);

}  // namespace qlora::jinja
