// Jinja values: construction from JSON, Python str()/repr(), equality/ordering and json.dumps.
#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <limits>

#include "text/jinja_pystr.h"
#include "text/unicode.h"

namespace qlora::jinja {

Value Value::undefined(std::string what) {
  Value v;
  v.v_ = std::move(what);
  return v;
}

Value Value::none() {
  Value v;
  v.type_ = Type::None;
  return v;
}

Value Value::list(ValueList items, bool tuple) { return sequence(std::move(items), tuple ? Seq::Tuple : Seq::List); }

Value Value::sequence(ValueList items, Seq kind) {
  Value v;
  v.type_ = Type::List;
  v.seq_ = kind;
  v.v_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::dict(Dict d) {
  Value v;
  v.type_ = Type::Dict;
  v.v_ = std::make_shared<const Dict>(std::move(d));
  return v;
}

Value Value::ns(std::shared_ptr<Namespace> n) {
  Value v;
  v.type_ = Type::Namespace;
  v.v_ = std::move(n);
  return v;
}

Value Value::function(std::shared_ptr<const Function> f) {
  Value v;
  v.type_ = Type::Function;
  v.v_ = std::move(f);
  return v;
}

namespace {

template <class J>
Value value_from_json(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(value_from_json(e));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      d.entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.entries.emplace_back(it.key(), value_from_json(it.value()));
      return Value::dict(std::move(d));
    }
    default: throw TemplateError("binary JSON values cannot be passed to a template");
  }
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }
Value Value::from_json(const nlohmann::json& j) { return value_from_json(j); }

int64_t Value::get_int() const {
  if (type_ == Type::Bool) return get_bool() ? 1 : 0;
  return std::get<int64_t>(v_);
}

double Value::get_number() const {
  if (type_ == Type::Float) return std::get<double>(v_);
  return static_cast<double>(get_int());
}

const std::string& Value::undefined_what() const {
  static const std::string kEmpty;
  const auto* s = std::get_if<std::string>(&v_);
  return s ? *s : kEmpty;
}

void Value::fail_undefined() const {
  const std::string& what = undefined_what();
  throw TemplateError(what.empty() ? "undefined value used" : what);
}

bool Value::truthy() const {
  switch (type_) {
    case Type::Undefined:
    case Type::None: return false;
    case Type::Bool: return get_bool();
    case Type::Int: return get_int() != 0;
    case Type::Float: return get_number() != 0.0;
    case Type::String: return !get_string().empty();
    case Type::List: return is_generator() || !get_list().empty();
    case Type::Dict: return get_dict().size() != 0;
    case Type::Namespace:
    case Type::Function: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (type_) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "str";
    case Type::List:
      switch (seq_) {
        case Seq::List: return "list";
        case Seq::Tuple: return "tuple";
        case Seq::Generator:
        case Seq::GeneratorError: return "generator";
        case Seq::DictKeys: return "dict_keys";
        case Seq::DictValues: return "dict_values";
        case Seq::DictItems: return "dict_items";
      }
      return "list";
    case Type::Dict: return "dict";
    case Type::Namespace: return "Namespace";
    case Type::Function: return "function";
  }
  return "object";
}

std::string py_float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0.0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string s(buf, res.ptr);  // shortest round-trip digits: "-1.2345e+02"
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  size_t epos = s.find('e');
  int exp = std::stoi(s.substr(epos + 1));
  std::string digits;
  for (size_t i = 0; i < epos; ++i)
    if (s[i] != '.') digits += s[i];
  std::string out;
  // Python's repr switches to exponent notation outside 1e-4 <= |f| < 1e16.
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      size_t int_len = static_cast<size_t>(exp) + 1;
      if (digits.size() <= int_len) {
        out = digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += ebuf;
  }
  return sign + out;
}

std::string Value::to_str() const {
  switch (type_) {
    case Type::Undefined: return "";
    case Type::String: return get_string();
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (type_) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "None";
    case Type::Bool: return get_bool() ? "True" : "False";
    case Type::Int: return std::to_string(get_int());
    case Type::Float: return py_float_repr(get_number());
    case Type::String: return pystr::repr(get_string());
    case Type::List: {
      if (is_generator()) return "<generator object>";
      const ValueList& items = get_list();
      bool tuple = seq_ == Seq::Tuple;
      std::string out = tuple ? "(" : "[";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += items[i].repr();
      }
      if (tuple && items.size() == 1) out += ",";
      out += tuple ? ")" : "]";
      if (seq_ != Seq::List && !tuple) return std::string(type_name()) + "(" + out + ")";  // dict_keys([...])
      return out;
    }
    case Type::Dict:
    case Type::Namespace: {
      const Dict& d = type_ == Type::Dict ? get_dict() : get_namespace().attrs;
      std::string out = "{";
      for (size_t i = 0; i < d.entries.size(); ++i) {
        if (i) out += ", ";
        out += pystr::repr(d.entries[i].first) + ": " + d.entries[i].second.repr();
      }
      out += "}";
      return type_ == Type::Dict ? out : "<Namespace " + out + ">";
    }
    case Type::Function: return "<function " + get_function().name + ">";
  }
  return "";
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(std::string key, Value v) {
  for (auto& [k, old] : entries) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(v));
}

bool values_equal(const Value& a, const Value& b) {
  using T = Value::Type;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.get_number() == b.get_number();
    return a.get_int() == b.get_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case T::Undefined:
    case T::None: return true;
    case T::String: return a.get_string() == b.get_string();
    case T::List: {
      if (a.seq_kind() != b.seq_kind()) return false;
      // Generators and dict_values compare by identity in Python.
      if (a.is_generator() || a.seq_kind() == Value::Seq::DictValues) return &a.get_list() == &b.get_list();
      const ValueList &x = a.get_list(), &y = b.get_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!values_equal(x[i], y[i])) return false;
      return true;
    }
    case T::Dict: {
      const Dict &x = a.get_dict(), &y = b.get_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* w = y.find(k);
        if (!w || !values_equal(v, *w)) return false;
      }
      return true;
    }
    case T::Namespace: return &a.get_namespace() == &b.get_namespace();
    case T::Function: return &a.get_function() == &b.get_function();
    default: return false;
  }
}

bool values_less(const Value& a, const Value& b, const char* op, bool swapped) {
  // An Undefined operand raises its own message (jinja2's Undefined defines the comparisons so).
  const Value& left = swapped ? b : a;
  const Value& right = swapped ? a : b;
  if (left.is_undefined()) left.fail_undefined();
  if (right.is_undefined()) right.fail_undefined();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.get_number() < b.get_number();
    return a.get_int() < b.get_int();
  }
  if (a.is_string() && b.is_string()) return a.get_string() < b.get_string();  // UTF-8 order = code point order
  if (a.is_sequence() && b.is_sequence() && a.is_tuple() == b.is_tuple()) {
    const ValueList &x = a.get_list(), &y = b.get_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!values_equal(x[i], y[i])) return values_less(x[i], y[i], op, swapped);
    }
    return x.size() < y.size();
  }
  const Value& l = swapped ? b : a;
  const Value& r = swapped ? a : b;
  throw TemplateError(std::string("'") + op + "' not supported between instances of '" + l.type_name() + "' and '" +
                      r.type_name() + "'");
}

namespace {

// json.dumps string escaping; ensure_ascii writes non-ASCII as \uXXXX (surrogate pairs above U+FFFF).
void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      size_t start = i;
      uint32_t cp = unicode::next_cp(s, i);
      if (!ensure_ascii) {
        out.append(s, start, i - start);
      } else if (cp >= 0x10000) {
        uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        out += buf;
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
        out += buf;
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

struct JsonStyle {
  bool pretty = false;
  bool ensure_ascii = false;
  std::string indent, item_sep, key_sep;
  bool sort_keys = false;
};

void json_dump(const Value& v, std::string& out, const JsonStyle& st, int level) {
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += st.indent;
  };
  switch (v.type()) {
    case Value::Type::None: out += "null"; return;
    case Value::Type::Bool: out += v.get_bool() ? "true" : "false"; return;
    case Value::Type::Int: out += std::to_string(v.get_int()); return;
    case Value::Type::Float: {
      double f = v.get_number();
      if (std::isnan(f))
        out += "NaN";
      else if (std::isinf(f))
        out += f > 0 ? "Infinity" : "-Infinity";
      else
        out += py_float_repr(f);
      return;
    }
    case Value::Type::String: json_string(out, v.get_string(), st.ensure_ascii); return;
    case Value::Type::List: {
      if (!v.is_sequence())
        throw TemplateError(std::string("Object of type ") + v.type_name() + " is not JSON serializable");
      const ValueList& items = v.get_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += st.item_sep;
        if (st.pretty) newline(level + 1);
        json_dump(items[i], out, st, level + 1);
      }
      if (st.pretty) newline(level);
      out += ']';
      return;
    }
    case Value::Type::Dict: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.get_dict().entries) entries.push_back(&e);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (st.sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += st.item_sep;
        if (st.pretty) newline(level + 1);
        json_string(out, entries[i]->first, st.ensure_ascii);
        out += st.key_sep;
        json_dump(entries[i]->second, out, st, level + 1);
      }
      if (st.pretty) newline(level);
      out += '}';
      return;
    }
    default:
      throw TemplateError(std::string("Object of type ") + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, bool ensure_ascii, const Value& indent, const Value& separators,
                    bool sort_keys) {
  JsonStyle st;
  st.ensure_ascii = ensure_ascii;
  st.sort_keys = sort_keys;
  if (!indent.is_none() && !indent.is_undefined()) {
    st.pretty = true;
    if (indent.is_string())
      st.indent = indent.get_string();
    else if (indent.is_int() || indent.is_bool())
      st.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.get_int())), ' ');
    else
      throw TemplateError(std::string("tojson indent must be an int or a str, not ") + indent.type_name());
  }
  // json.dumps defaults: (', ', ': ') on one line, (',', ': ') when indenting.
  st.item_sep = st.pretty ? "," : ", ";
  st.key_sep = ": ";
  if (!separators.is_none() && !separators.is_undefined()) {
    if (!separators.is_list() || separators.get_list().size() != 2 || !separators.get_list()[0].is_string() ||
        !separators.get_list()[1].is_string())
      throw TemplateError("tojson separators must be a pair of strings");
    st.item_sep = separators.get_list()[0].get_string();
    st.key_sep = separators.get_list()[1].get_string();
  }
  std::string out;
  json_dump(v, out, st, 0);
  return out;
}

}  // namespace qlora::jinja
