// JSON helpers: reading, located parse errors, typed getters, edit-distance suggestions.
#include "io/json_util.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace qlora {

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    int e = errno;
    fail(ErrorKind::Io, path, std::string("cannot open file: ") + std::strerror(e),
         e == ENOENT ? "check the path" : "");
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail(ErrorKind::Io, path, "read failed");
  return std::move(ss).str();
}

// nlohmann reports a 1-based byte position; turn it into line:column for editors.
static std::string locate(std::string_view text, size_t byte) {
  size_t end = std::min(byte > 0 ? byte - 1 : 0, text.size());
  size_t line = 1, col = 1;
  for (size_t i = 0; i < end; i++) {
    if (text[i] == '\n') { line++; col = 1; } else { col++; }
  }
  return std::to_string(line) + ":" + std::to_string(col);
}

json parse_json(std::string_view text, const std::string& where) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 2: " prefix;
    // the location is already in `where`.
    if (auto p = what.find("syntax error"); p != std::string::npos) what = what.substr(p);
    fail(ErrorKind::Format, where + ":" + locate(text, e.byte), "invalid JSON: " + what);
  } catch (const json::exception& e) {  // out_of_range: a number too large for a double
    fail(ErrorKind::Format, where, std::string("invalid JSON: ").append(json_error_reason(e)));
  }
}

std::string json_error_reason(const json::exception& e) {
  std::string_view what = e.what();
  if (auto p = what.find("] "); p != std::string_view::npos) what.remove_prefix(p + 2);
  return std::string(what);
}

json read_json_file(const std::string& path) { return parse_json(read_text_file(path), path); }

const char* json_type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "number";
    case json::value_t::string: return "string";
    case json::value_t::boolean: return "boolean";
    case json::value_t::null: return "null";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    default: return "value";
  }
}

static std::string key_where(const std::string& where, std::string_view key) {
  return where + ": key '" + std::string(key) + "'";
}

[[noreturn]] static void wrong_type(const json& v, std::string_view key, const char* expected,
                                    const std::string& where) {
  std::string got = json_type_name(v);
  if (v.is_primitive()) got.append(" ").append(v.dump());
  fail(ErrorKind::Config, key_where(where, key), std::string("expected ") + expected + ", got " + got);
}

const json* json_find(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

static const json& require(const json& obj, std::string_view key, const std::string& where) {
  const json* v = json_find(obj, key);
  if (!v) fail(ErrorKind::Config, key_where(where, key), "missing required key");
  return *v;
}

static int64_t as_int(const json& v, std::string_view key, const std::string& where) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) wrong_type(v, key, "an integer that fits in int64", where);
    return int64_t(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  wrong_type(v, key, "an integer", where);
}

static double as_number(const json& v, std::string_view key, const std::string& where) {
  if (!v.is_number()) wrong_type(v, key, "a number", where);
  return v.get<double>();
}

int64_t json_int(const json& obj, std::string_view key, const std::string& where) {
  return as_int(require(obj, key, where), key, where);
}
int64_t json_int_or(const json& obj, std::string_view key, int64_t def, const std::string& where) {
  const json* v = json_find(obj, key);
  return v ? as_int(*v, key, where) : def;
}
double json_number(const json& obj, std::string_view key, const std::string& where) {
  return as_number(require(obj, key, where), key, where);
}
double json_number_or(const json& obj, std::string_view key, double def, const std::string& where) {
  const json* v = json_find(obj, key);
  return v ? as_number(*v, key, where) : def;
}
bool json_bool_or(const json& obj, std::string_view key, bool def, const std::string& where) {
  const json* v = json_find(obj, key);
  if (!v) return def;
  if (!v->is_boolean()) wrong_type(*v, key, "a boolean (true/false)", where);
  return v->get<bool>();
}
std::string json_string(const json& obj, std::string_view key, const std::string& where) {
  const json& v = require(obj, key, where);
  if (!v.is_string()) wrong_type(v, key, "a string", where);
  return v.get<std::string>();
}
std::string json_string_or(const json& obj, std::string_view key, const std::string& def,
                           const std::string& where) {
  const json* v = json_find(obj, key);
  if (!v) return def;
  if (!v->is_string()) wrong_type(*v, key, "a string", where);
  return v->get<std::string>();
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);  // one DP row each
  for (size_t j = 0; j <= b.size(); j++) prev[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_name(const std::vector<std::string>& candidates, std::string_view name,
                         size_t max_distance) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = edit_distance(c, name);
    if (d < best_d) { best_d = d; best = c; }
  }
  return best_d <= max_distance ? best : std::string();
}

}  // namespace qlora
