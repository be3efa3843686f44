// tokenizer.json node accessors with path-naming errors.
#include "text/tokenizer_json.h"

#include "core/error.h"
#include "text/unicode.h"

namespace qlora::tokjson {

static const char* kind_name(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "object";
    case json::value_t::array: return "array";
    case json::value_t::string: return "string";
    case json::value_t::boolean: return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "number";
    default: return "value";
  }
}

std::string child(const std::string& where, std::string_view key) {
  return where + "." + std::string(key);
}
std::string index(const std::string& where, size_t i) {
  return where + "[" + std::to_string(i) + "]";
}

void need_object(const json& j, const std::string& where) {
  if (!j.is_object())
    fail(ErrorKind::Format, where, std::string("expected an object, found ") + kind_name(j));
}

const json* find(const json& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

const json& need(const json& j, std::string_view key, const std::string& where) {
  need_object(j, where);
  const json* v = find(j, key);
  if (!v) fail(ErrorKind::Format, child(where, key), "missing");
  return *v;
}

std::string need_string(const json& j, std::string_view key, const std::string& where) {
  const json& v = need(j, key, where);
  if (!v.is_string())
    fail(ErrorKind::Format, child(where, key), std::string("expected a string, found ") + kind_name(v));
  return v.get<std::string>();
}

std::string string_or(const json& j, std::string_view key, const std::string& def,
                      const std::string& where) {
  const json* v = find(j, key);
  if (!v) return def;
  if (!v->is_string())
    fail(ErrorKind::Format, child(where, key), std::string("expected a string, found ") + kind_name(*v));
  return v->get<std::string>();
}

bool bool_or(const json& j, std::string_view key, bool def, const std::string& where) {
  const json* v = find(j, key);
  if (!v) return def;
  if (!v->is_boolean())
    fail(ErrorKind::Format, child(where, key), std::string("expected a boolean, found ") + kind_name(*v));
  return v->get<bool>();
}

int64_t int_or(const json& j, std::string_view key, int64_t def, const std::string& where) {
  const json* v = find(j, key);
  if (!v) return def;
  if (!v->is_number_integer())
    fail(ErrorKind::Format, child(where, key), std::string("expected an integer, found ") + kind_name(*v));
  return v->get<int64_t>();
}

uint32_t need_char(const json& j, std::string_view key, const std::string& where) {
  std::string s = need_string(j, key, where);
  size_t i = 0;
  uint32_t cp = s.empty() ? 0 : unicode::next_cp(s, i);
  if (s.empty() || i != s.size() || !unicode::is_valid_utf8(s))
    fail(ErrorKind::Format, child(where, key), "expected a single character, found '" + s + "'");
  return cp;
}

Pattern need_pattern(const json& j, std::string_view key, const std::string& where) {
  const json& v = need(j, key, where);
  std::string w = child(where, key);
  if (v.is_string()) return Pattern(false, v.get<std::string>(), w);
  if (v.is_object()) {
    if (const json* s = find(v, "String"); s && s->is_string()) return Pattern(false, s->get<std::string>(), w);
    if (const json* r = find(v, "Regex"); r && r->is_string())
      return Pattern(true, r->get<std::string>(), child(w, "Regex"));
  }
  fail(ErrorKind::Format, w, "expected {\"String\": ...} or {\"Regex\": ...}");
}

std::string type_of(const json& j, const std::string& where) { return need_string(j, "type", where); }

void unsupported_type(const std::string& where, const std::string& type, const char* supported) {
  fail(ErrorKind::Unsupported, child(where, "type"), "'" + type + "' is not supported",
       std::string("supported: ") + supported);
}

}  // namespace qlora::tokjson
