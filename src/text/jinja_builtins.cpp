// Jinja built-ins: sandboxed attribute/item access, Python methods, operators, `in`, `is` tests.
#include "text/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "text/jinja_pystr.h"

namespace qlora::jinja {

namespace {

std::shared_ptr<const Function> fn(std::string name, std::function<Value(CallArgs&)> f) {
  auto p = std::make_shared<Function>();
  p->name = std::move(name);
  p->call = std::move(f);
  return p;
}

Value list_of_strings(const std::vector<std::string>& parts) {
  ValueList out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(Value(p));
  return Value::list(std::move(out));
}

std::string require_str(const Value& v, const char* what) {
  if (!v.is_string()) throw TemplateError(std::string(what) + "must be str, not " + v.type_name());
  return v.get_string();
}

std::optional<std::string> opt_str(const std::optional<Value>& v, const char* what) {
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) throw TemplateError(std::string(what) + std::string(v->type_name()));
  return v->get_string();
}

int64_t opt_int(const std::optional<Value>& v, int64_t def) {
  if (!v || v->is_none()) return def;
  if (!v->is_int() && !v->is_bool())
    throw TemplateError(std::string("'") + v->type_name() + "' object cannot be interpreted as an integer");
  return v->get_int();
}

std::optional<int64_t> slice_bound(const std::optional<Value>& v) {
  if (!v || v->is_none()) return std::nullopt;
  return opt_int(v, 0);
}

// Position of sub in s (code points) within s[start:end], as str.find; -1 when absent.
int64_t cp_find(const std::string& s, const std::string& sub, const std::optional<Value>& start,
                const std::optional<Value>& end, bool reverse) {
  auto hay = pystr::decode(s), needle = pystr::decode(sub);
  auto idx = pystr::slice_indices(hay.size(), slice_bound(start), slice_bound(end), std::nullopt);
  int64_t b = idx.empty() ? 0 : static_cast<int64_t>(idx.front());
  int64_t e = idx.empty() ? b : static_cast<int64_t>(idx.back()) + 1;
  if (idx.empty()) {
    // An empty window still finds "" at its start when that start is within the string.
    int64_t st = start && !start->is_none() ? opt_int(start, 0) : 0;
    if (st < 0) st = std::max<int64_t>(0, st + static_cast<int64_t>(hay.size()));
    if (needle.empty() && st <= static_cast<int64_t>(hay.size())) return st;
    return -1;
  }
  int64_t n = static_cast<int64_t>(needle.size());
  if (!reverse) {
    for (int64_t i = b; i + n <= e; ++i)
      if (std::equal(needle.begin(), needle.end(), hay.begin() + i)) return i;
  } else {
    for (int64_t i = e - n; i >= b; --i)
      if (std::equal(needle.begin(), needle.end(), hay.begin() + i)) return i;
  }
  return -1;
}

bool affix_match(const Value& self, CallArgs& a, bool prefix) {
  check_args(a, prefix ? "startswith" : "endswith", {"prefix", "start", "end"});
  auto what = arg(a, 0, "prefix");
  if (!what) throw TemplateError("startswith/endswith need an argument");
  std::string s = self.get_string();
  if (arg(a, 1, "start") || arg(a, 2, "end"))
    s = pystr::slice(s, slice_bound(arg(a, 1, "start")), slice_bound(arg(a, 2, "end")), std::nullopt);
  ValueList options = what->is_tuple() ? what->get_list() : ValueList{*what};
  for (const Value& o : options) {
    if (!o.is_string())
      throw TemplateError(std::string(prefix ? "startswith" : "endswith") +
                          " first arg must be str or a tuple of str, not " + o.type_name());
    std::string t = o.get_string();
    if (prefix ? s.compare(0, t.size(), t) == 0
               : (s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0))
      return true;
  }
  return false;
}

// strip/lstrip/rstrip, split/rsplit and splitlines of s; Undefined for any other name.
Value strip_split_method(const std::string& s, const std::string& name) {
  using pystr::strip;
  auto strip_fn = [&](bool l, bool r) {
    return Value::function(fn(name, [s, l, r, name](CallArgs& a) {
      check_args(a, "strip", {"chars"});
      auto chars = arg(a, 0, "chars");
      if (chars && !chars->is_none() && !chars->is_string()) throw TemplateError(name + " arg must be None or str");
      return Value(strip(s, opt_str(chars, ""), l, r));
    }));
  };
  if (name == "strip") return strip_fn(true, true);
  if (name == "lstrip") return strip_fn(true, false);
  if (name == "rstrip") return strip_fn(false, true);
  if (name == "split" || name == "rsplit") {
    bool r = name == "rsplit";
    return Value::function(fn(name, [s, r](CallArgs& a) {
      check_args(a, "split", {"sep", "maxsplit"});
      auto sep = opt_str(arg(a, 0, "sep"), "must be str or None, not ");
      int64_t maxsplit = opt_int(arg(a, 1, "maxsplit"), -1);
      return list_of_strings(r ? pystr::rsplit(s, sep, maxsplit) : pystr::split(s, sep, maxsplit));
    }));
  }
  if (name == "splitlines")
    return Value::function(fn(name, [s](CallArgs& a) {
      check_args(a, "splitlines", {"keepends"});
      auto k = arg(a, 0, "keepends");
      return list_of_strings(pystr::splitlines(s, k && k->truthy()));
    }));
  return Value();
}

// startswith/endswith, the case conversions (upper, title...) and the character-class tests (isupper,
// isdigit...) of the string self; Undefined for any other name.
Value case_test_method(const Value& self, const std::string& name) {
  const std::string& s = self.get_string();
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return Value::function(fn(name, [self, prefix](CallArgs& a) { return Value(affix_match(self, a, prefix)); }));
  }
  using Unary = std::string (*)(std::string_view);
  static const std::pair<const char*, Unary> kUnary[] = {
      {"upper", pystr::upper}, {"lower", pystr::lower}, {"casefold", pystr::lower},
      {"title", pystr::title}, {"capitalize", pystr::capitalize}};
  for (const auto& [n, f] : kUnary)
    if (name == n)
      return Value::function(fn(name, [s, f = f](CallArgs& a) {
        check_args(a, "str method", {});
        return Value(f(s));
      }));
  using Pred = bool (*)(std::string_view);
  static const std::pair<const char*, Pred> kPred[] = {
      {"isupper", pystr::is_upper}, {"islower", pystr::is_lower}, {"isalpha", pystr::is_alpha},
      {"isdigit", pystr::is_digit}, {"isdecimal", pystr::is_digit}, {"isnumeric", pystr::is_digit},
      {"isalnum", pystr::is_alnum}, {"isspace", pystr::is_space_str}};
  for (const auto& [n, f] : kPred)
    if (name == n)
      return Value::function(fn(name, [s, f = f](CallArgs& a) {
        check_args(a, "str method", {});
        return Value(f(s));
      }));
  return Value();
}

// replace, find/rfind/index/rindex and count of s; Undefined for any other name.
Value search_method(const std::string& s, const std::string& name) {
  if (name == "replace")
    return Value::function(fn(name, [s](CallArgs& a) {
      check_args(a, "replace", {"old", "new", "count"});
      auto o = arg(a, 0, "old"), n = arg(a, 1, "new");
      if (!o || !n) throw TemplateError("replace() takes at least 2 arguments");
      return Value(pystr::replace(s, require_str(*o, "replace() argument 1 "), require_str(*n, "replace() argument 2 "),
                                  opt_int(arg(a, 2, "count"), -1)));
    }));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    bool rev = name[0] == 'r', raise = name.find("index") != std::string::npos;
    return Value::function(fn(name, [s, rev, raise](CallArgs& a) {
      check_args(a, "find", {"sub", "start", "end"});
      auto sub = arg(a, 0, "sub");
      if (!sub) throw TemplateError("find() takes at least 1 argument");
      int64_t at = cp_find(s, require_str(*sub, ""), arg(a, 1, "start"), arg(a, 2, "end"), rev);
      if (at < 0 && raise) throw TemplateError("substring not found");
      return Value(at);
    }));
  }
  if (name == "count")
    return Value::function(fn(name, [s](CallArgs& a) {
      check_args(a, "count", {"sub"});
      auto sub = arg(a, 0, "sub");
      if (!sub) throw TemplateError("count() takes 1 argument");
      std::string t = require_str(*sub, "");
      if (t.empty()) return Value(static_cast<int64_t>(pystr::length(s) + 1));
      int64_t n = 0;
      for (size_t p = s.find(t); p != std::string::npos; p = s.find(t, p + t.size())) ++n;
      return Value(n);
    }));
  return Value();
}

// join, format and removeprefix/removesuffix of s; Undefined for any other name.
Value compose_method(const std::string& s, const std::string& name) {
  if (name == "join")
    return Value::function(fn(name, [s](CallArgs& a) {
      check_args(a, "join", {"iterable"});
      auto it = arg(a, 0, "iterable");
      if (!it) throw TemplateError("join() takes 1 argument");
      std::string out;
      size_t i = 0;
      for (const Value& v : iterate(*it)) {
        if (!v.is_string())
          throw TemplateError("sequence item " + std::to_string(i) + ": expected str instance, " + v.type_name() +
                              " found");
        if (i++) out += s;
        out += v.get_string();
      }
      return Value(out);
    }));
  if (name == "format")
    return Value::function(fn(name, [s](CallArgs& a) { return Value(brace_format(s, a)); }));
  if (name == "removeprefix" || name == "removesuffix") {
    bool pre = name == "removeprefix";
    return Value::function(fn(name, [s, pre](CallArgs& a) {
      check_args(a, "removeprefix", {""});
      auto x = arg(a, 0, "");
      if (!x) throw TemplateError("removeprefix() takes 1 argument");
      std::string t = require_str(*x, "");
      if (pre && s.compare(0, t.size(), t) == 0) return Value(s.substr(t.size()));
      if (!pre && s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0)
        return Value(s.substr(0, s.size() - t.size()));
      return Value(s);
    }));
  }
  return Value();
}

// The bound method `name` of the string self (a Function value); Undefined when str has no such method.
Value string_method(const Value& self, const std::string& name) {
  const std::string& s = self.get_string();
  if (Value m = strip_split_method(s, name); !m.is_undefined()) return m;
  if (Value m = case_test_method(self, name); !m.is_undefined()) return m;
  if (Value m = search_method(s, name); !m.is_undefined()) return m;
  return compose_method(s, name);
}

// Methods that mutate a list or dict: the immutable sandbox refuses to call them.
bool is_mutator(const Value& self, const std::string& name) {
  static const char* kList[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};
  static const char* kDict[] = {"clear", "pop", "popitem", "setdefault", "update"};
  if (self.is_list() && self.seq_kind() == Value::Seq::List)
    for (const char* m : kList)
      if (name == m) return true;
  if (self.is_dict())
    for (const char* m : kDict)
      if (name == m) return true;
  return false;
}

Value container_method(const Value& self, const std::string& name) {
  if (is_mutator(self, name))
    return Value::function(fn(name, [name, t = std::string(self.type_name())](CallArgs&) -> Value {
      throw TemplateError("access to attribute '" + name + "' of '" + t + "' object is unsafe.");
    }));
  if (self.is_dict()) {
    if (name == "items" || name == "keys" || name == "values") {
      return Value::function(fn(name, [self, name](CallArgs& a) {
        check_args(a, name, {});
        ValueList out;
        for (const auto& [k, v] : self.get_dict().entries) {
          if (name == "items")
            out.push_back(Value::list({Value(k), v}, true));
          else
            out.push_back(name == "keys" ? Value(k) : v);
        }
        auto kind = name == "items" ? Value::Seq::DictItems : name == "keys" ? Value::Seq::DictKeys : Value::Seq::DictValues;
        return Value::sequence(std::move(out), kind);
      }));
    }
    if (name == "get")
      return Value::function(fn(name, [self](CallArgs& a) {
        check_args(a, "get", {"key", "default"});
        auto key = arg(a, 0, "key");
        if (!key) throw TemplateError("get() takes at least 1 argument");
        const Value* v = key->is_string() ? self.get_dict().find(key->get_string()) : nullptr;
        if (v) return *v;
        auto def = arg(a, 1, "default");
        return def ? *def : Value::none();
      }));
    if (name == "copy") return Value::function(fn(name, [self](CallArgs&) { return self; }));
  }
  if (self.is_sequence() && (name == "index" || name == "count")) {
    return Value::function(fn(name, [self, name](CallArgs& a) {
      check_args(a, name, {"value"});
      auto x = arg(a, 0, "value");
      if (!x) throw TemplateError(name + "() takes 1 argument");
      int64_t count = 0;
      const ValueList& items = self.get_list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (!values_equal(items[i], *x)) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++count;
      }
      if (name == "index") throw TemplateError(x->repr() + " is not in list");
      return Value(count);
    }));
  }
  return Value();
}

// jinja2's Undefined messages: "'dict object' has no attribute 'x'", "list object has no element 5".
std::string type_repr(const Value& obj) { return obj.is_none() ? "None" : std::string(obj.type_name()) + " object"; }
std::string missing_attr(const Value& obj, const std::string& attr) {
  return "'" + type_repr(obj) + "' has no attribute '" + attr + "'";
}
std::string missing_element(const Value& obj, const Value& key) {
  return type_repr(obj) + " has no element " + key.repr();
}

Value method_of(const Value& obj, const std::string& name) {
  if (obj.is_string()) return string_method(obj, name);
  if (obj.is_list() || obj.is_dict()) return container_method(obj, name);
  return Value();
}

// Python index normalisation; nullopt when out of range.
std::optional<size_t> index_of(int64_t i, size_t n) {
  int64_t len = static_cast<int64_t>(n);
  if (i < 0) i += len;
  if (i < 0 || i >= len) return std::nullopt;
  return static_cast<size_t>(i);
}

}  // namespace

std::optional<Value> arg(const CallArgs& args, size_t i, std::string_view name) {
  if (i < args.args.size()) return args.args[i];
  for (const auto& [k, v] : args.kwargs)
    if (k == name) return v;
  return std::nullopt;
}

void check_args(const CallArgs& args, const std::string& fn, std::initializer_list<std::string_view> names) {
  if (args.args.size() > names.size())
    throw TemplateError(fn + "() takes at most " + std::to_string(names.size()) + " argument(s) (" +
                        std::to_string(args.args.size()) + " given)");
  for (const auto& [k, v] : args.kwargs) {
    size_t pos = 0;
    bool known = false;
    for (auto n : names) {
      if (n == k) {
        known = true;
        if (pos < args.args.size()) throw TemplateError(fn + "() got multiple values for argument '" + k + "'");
      }
      ++pos;
    }
    if (!known) throw TemplateError(fn + "() got an unexpected keyword argument '" + k + "'");
  }
}

int64_t length_of(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return 0;
    case Value::Type::String: return static_cast<int64_t>(pystr::length(v.get_string()));
    case Value::Type::List:
      if (v.is_generator()) throw TemplateError("object of type 'generator' has no len()");
      return static_cast<int64_t>(v.get_list().size());
    case Value::Type::Dict: return static_cast<int64_t>(v.get_dict().size());
    default: throw TemplateError(std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

ValueList iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return {};
    case Value::Type::List:
      if (v.seq_kind() == Value::Seq::GeneratorError) v.get_list().front().fail_undefined();
      return v.get_list();
    case Value::Type::Dict: {
      ValueList keys;
      for (const auto& [k, x] : v.get_dict().entries) keys.push_back(Value(k));
      return keys;
    }
    case Value::Type::String: {
      ValueList chars;
      for (uint32_t cp : pystr::decode(v.get_string())) chars.push_back(Value(pystr::encode({cp})));
      return chars;
    }
    default: throw TemplateError(std::string("'") + v.type_name() + "' object is not iterable");
  }
}

Value get_attr(const Value& obj, const std::string& attr) {
  if (obj.is_undefined()) obj.fail_undefined();
  if (!attr.empty() && attr[0] == '_')
    return Value::undefined("access to attribute '" + attr + "' of '" + obj.type_name() + "' object is unsafe.");
  Value m = method_of(obj, attr);
  if (!m.is_undefined()) return m;
  if (obj.is_dict()) {
    if (const Value* v = obj.get_dict().find(attr)) return *v;
  } else if (obj.is_namespace()) {
    if (const Value* v = obj.get_namespace().attrs.find(attr)) return *v;
  }
  return Value::undefined(missing_attr(obj, attr));
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.fail_undefined();
  if (key.is_int() || key.is_bool()) {
    if (obj.is_sequence()) {
      if (auto i = index_of(key.get_int(), obj.get_list().size())) return obj.get_list()[*i];
    } else if (obj.is_string()) {
      auto cps = pystr::decode(obj.get_string());
      if (auto i = index_of(key.get_int(), cps.size())) return Value(pystr::encode({cps[*i]}));
    }
  }
  if (key.is_string()) {
    if (obj.is_dict()) {
      if (const Value* v = obj.get_dict().find(key.get_string())) return *v;
    }
    return get_attr(obj, key.get_string());
  }
  return Value::undefined(missing_element(obj, key));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  // jinja2 compiles slices to plain Python subscripts: errors raise instead of giving Undefined.
  if (obj.is_undefined()) obj.fail_undefined();
  if (obj.is_dict()) throw TemplateError("unhashable type: 'slice'");
  if (!obj.is_string() && !obj.is_sequence())
    throw TemplateError(std::string("'") + obj.type_name() + "' object is not subscriptable");
  for (const Value* b : {&start, &stop, &step})
    if (!b->is_none() && !b->is_int() && !b->is_bool())
      throw TemplateError("slice indices must be integers or None or have an __index__ method");
  auto bound = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    return v.get_int();
  };
  if (!step.is_none() && step.get_int() == 0) throw TemplateError("slice step cannot be zero");
  if (obj.is_string()) return Value(pystr::slice(obj.get_string(), bound(start), bound(stop), bound(step)));
  const ValueList& items = obj.get_list();
  ValueList out;
  for (size_t i : pystr::slice_indices(items.size(), bound(start), bound(stop), bound(step))) out.push_back(items[i]);
  return Value::list(std::move(out), obj.is_tuple());
}

bool contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::Undefined: return false;
    case Value::Type::String:
      if (!item.is_string())
        throw TemplateError(std::string("'in <string>' requires string as left operand, not ") + item.type_name());
      return container.get_string().find(item.get_string()) != std::string::npos;
    case Value::Type::List:
      for (const Value& v : iterate(container))
        if (values_equal(v, item)) return true;
      return false;
    case Value::Type::Dict:
      if (item.is_dict() || (item.is_sequence() && !item.is_tuple()))
        throw TemplateError(std::string("unhashable type: '") + item.type_name() + "'");
      return item.is_string() && container.get_dict().find(item.get_string()) != nullptr;
    default:
      throw TemplateError(std::string("argument of type '") + container.type_name() + "' is not iterable");
  }
}

namespace {

[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  bool a_seq = a.is_string() || a.is_sequence(), b_seq = b.is_string() || b.is_sequence();
  if (op == "*" && (a_seq || b_seq))
    throw TemplateError(std::string("can't multiply sequence by non-int of type '") + (a_seq ? b : a).type_name() + "'");
  if (op == "**")
    throw TemplateError(std::string("unsupported operand type(s) for ** or pow(): '") + a.type_name() + "' and '" +
                        b.type_name() + "'");
  if (op == "+" && a.is_string())
    throw TemplateError(std::string("can only concatenate str (not \"") + b.type_name() + "\") to str");
  if (op == "+" && a.is_sequence())
    throw TemplateError(std::string("can only concatenate ") + a.type_name() + " (not \"" + b.type_name() +
                        "\") to " + a.type_name());
  throw TemplateError("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() +
                      "'");
}

double py_mod(double a, double b) {
  double m = std::fmod(a, b);
  if (m == 0) return std::copysign(0.0, b);  // Python gives the zero the divisor's sign
  if ((m < 0) != (b < 0)) m += b;
  return m;
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.get_string();
    return Value(out);
  }
  ValueList out;
  for (int64_t i = 0; i < n; ++i)
    for (const Value& v : seq.get_list()) out.push_back(v);
  return Value::list(std::move(out), seq.is_tuple());
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  // str % Undefined formats like any subscriptable argument (jinja2's Undefined has __getitem__).
  if (op == "%" && a.is_string() && b.is_undefined()) return Value(percent_format(a.get_string(), b));
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  bool nums = a.is_number() && b.is_number();
  bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (!__builtin_add_overflow(a.get_int(), b.get_int(), &r)) return Value(r);
      return Value(a.get_number() + b.get_number());
    }
    if (nums) return Value(a.get_number() + b.get_number());
    if (a.is_string() && b.is_string()) return Value(a.get_string() + b.get_string());
    if (a.is_sequence() && b.is_sequence() && a.is_tuple() == b.is_tuple()) {
      ValueList out = a.get_list();
      for (const Value& v : b.get_list()) out.push_back(v);
      return Value::list(std::move(out), a.is_tuple());
    }
    bad_operands(op, a, b);
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (!__builtin_sub_overflow(a.get_int(), b.get_int(), &r)) return Value(r);
    }
    if (nums) return Value(a.get_number() - b.get_number());
    bad_operands(op, a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (!__builtin_mul_overflow(a.get_int(), b.get_int(), &r)) return Value(r);
    }
    if (nums) return Value(a.get_number() * b.get_number());
    if ((a.is_string() || a.is_sequence()) && (b.is_int() || b.is_bool())) return repeat(a, b.get_int());
    if ((b.is_string() || b.is_sequence()) && (a.is_int() || a.is_bool())) return repeat(b, a.get_int());
    bad_operands(op, a, b);
  }
  if (op == "/") {
    if (!nums) bad_operands(op, a, b);
    if (b.get_number() == 0) throw TemplateError(ints ? "division by zero" : "float division by zero");
    return Value(a.get_number() / b.get_number());
  }
  if (op == "//") {
    if (!nums) bad_operands(op, a, b);
    if (b.get_number() == 0) throw TemplateError(ints ? "integer division or modulo by zero" : "float floor division by zero");
    if (ints) {
      int64_t x = a.get_int(), y = b.get_int();
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value(q);
    }
    double x = a.get_number(), y = b.get_number();
    return Value((x - py_mod(x, y)) / y);
  }
  if (op == "%") {
    if (a.is_string()) return Value(percent_format(a.get_string(), b));
    if (!nums) bad_operands(op, a, b);
    if (b.get_number() == 0) throw TemplateError(ints ? "integer modulo by zero" : "float modulo");
    if (ints) {
      int64_t x = a.get_int(), y = b.get_int();
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value(m);
    }
    return Value(py_mod(a.get_number(), b.get_number()));
  }
  if (op == "**") {
    if (!nums) bad_operands(op, a, b);
    if (ints && b.get_int() >= 0) {
      int64_t base = a.get_int(), r = 1;
      bool overflow = false;
      for (int64_t e = b.get_int(); e > 0 && !overflow; --e) overflow = __builtin_mul_overflow(r, base, &r);
      if (!overflow) return Value(r);
    }
    if (a.get_number() == 0 && b.get_number() < 0)
      throw TemplateError("0.0 cannot be raised to a negative power");
    return Value(std::pow(a.get_number(), b.get_number()));
  }
  throw TemplateError("unknown operator " + op);
}

// ---- tests ----

namespace {

using TestFn = bool (*)(const Value&, CallArgs&);

// A test's argument: positional, or the one keyword argument given instead.
const Value& need(CallArgs& a, size_t i, const char* test) {
  if (i < a.args.size()) return a.args[i];
  if (a.args.empty() && a.kwargs.size() == 1 && i == 0) return a.kwargs[0].second;
  throw TemplateError(std::string("test '") + test + "' needs an argument");
}

bool cmp_test(const Value& v, CallArgs& a, const char* name, int which) {
  const Value& o = need(a, 0, name);
  if (which >= 2 && (v.is_undefined() || o.is_undefined())) (v.is_undefined() ? v : o).fail_undefined();
  switch (which) {
    case 0: return values_equal(v, o);
    case 1: return !values_equal(v, o);
    case 2: return values_less(v, o, "<");
    case 3: return values_less(v, o, "<=") || values_equal(v, o);
    case 4: return values_less(o, v, ">", true);
    default: return values_less(o, v, ">=", true) || values_equal(v, o);
  }
}

// jinja2's odd/even/divisibleby: `value % n == r` with Python's operator semantics.
bool mod_is(const Value& v, const Value& n, int64_t r) { return values_equal(binary_op("%", v, n), Value(r)); }

const std::pair<const char*, TestFn> kTests[] = {
    {"defined", [](const Value& v, CallArgs&) { return !v.is_undefined(); }},
    {"undefined", [](const Value& v, CallArgs&) { return v.is_undefined(); }},
    {"none", [](const Value& v, CallArgs&) { return v.is_none(); }},
    {"boolean", [](const Value& v, CallArgs&) { return v.is_bool(); }},
    {"true", [](const Value& v, CallArgs&) { return v.is_bool() && v.get_bool(); }},
    {"false", [](const Value& v, CallArgs&) { return v.is_bool() && !v.get_bool(); }},
    {"integer", [](const Value& v, CallArgs&) { return v.is_int(); }},
    {"float", [](const Value& v, CallArgs&) { return v.is_float(); }},
    {"number", [](const Value& v, CallArgs&) { return v.is_number(); }},
    {"string", [](const Value& v, CallArgs&) { return v.is_string(); }},
    {"mapping", [](const Value& v, CallArgs&) { return v.is_dict(); }},
    // jinja2's Undefined is iterable (it yields nothing), has a length and is "callable".
    {"iterable", [](const Value& v, CallArgs&) { return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined(); }},
    {"sequence", [](const Value& v, CallArgs&) { return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined(); }},
    {"callable", [](const Value& v, CallArgs&) { return v.is_function() || v.is_undefined(); }},
    {"escaped", [](const Value&, CallArgs&) { return false; }},
    {"lower", [](const Value& v, CallArgs&) { return pystr::is_lower(v.to_str()); }},
    {"upper", [](const Value& v, CallArgs&) { return pystr::is_upper(v.to_str()); }},
    {"odd", [](const Value& v, CallArgs&) { return mod_is(v, Value(2), 1); }},
    {"even", [](const Value& v, CallArgs&) { return mod_is(v, Value(2), 0); }},
    {"divisibleby", [](const Value& v, CallArgs& a) { return mod_is(v, need(a, 0, "divisibleby"), 0); }},
    {"sameas", [](const Value& v, CallArgs& a) {
       const Value& o = need(a, 0, "sameas");
       if (v.type() != o.type()) return false;
       if (v.is_none() || v.is_bool() || v.is_undefined()) return values_equal(v, o);
       // Containers and objects: identity is equality of the shared payload.
       if (v.is_list()) return &v.get_list() == &o.get_list();
       if (v.is_dict()) return &v.get_dict() == &o.get_dict();
       return values_equal(v, o);
     }},
    {"in", [](const Value& v, CallArgs& a) { return contains(need(a, 0, "in"), v); }},
    {"eq", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "eq", 0); }},
    {"equalto", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "equalto", 0); }},
    {"==", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "==", 0); }},
    {"ne", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "ne", 1); }},
    {"!=", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "!=", 1); }},
    {"lt", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "lt", 2); }},
    {"lessthan", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "lessthan", 2); }},
    {"<", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "<", 2); }},
    {"le", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "le", 3); }},
    {"<=", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "<=", 3); }},
    {"gt", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "gt", 4); }},
    {"greaterthan", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "greaterthan", 4); }},
    {">", [](const Value& v, CallArgs& a) { return cmp_test(v, a, ">", 4); }},
    {"ge", [](const Value& v, CallArgs& a) { return cmp_test(v, a, "ge", 5); }},
    {">=", [](const Value& v, CallArgs& a) { return cmp_test(v, a, ">=", 5); }},
    {"filter", [](const Value& v, CallArgs&) { return v.is_string() && is_filter(v.get_string()); }},
    {"test", [](const Value& v, CallArgs&) { return v.is_string() && is_test(v.get_string()); }},
};

}  // namespace

bool is_test(std::string_view name) {
  for (const auto& [n, f] : kTests)
    if (name == n) return true;
  return false;
}

bool call_test(const std::string& name, const Value& input, CallArgs& args) {
  for (const auto& [n, f] : kTests)
    if (name == n) return f(input, args);
  throw TemplateError("No test named '" + name + "' found.");
}

}  // namespace qlora::jinja
