// Jinja filters (jinja2's built-ins that chat templates use, plus transformers' tojson).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>

#include "text/jinja_builtins.h"
#include "text/jinja_pystr.h"

namespace qlora::jinja {

namespace {

using FilterFn = Value (*)(const Value&, CallArgs&);

// jinja2's select/reject/map/unique/items are Python generators: a failure inside shows only when
// the result is iterated, so it is kept in the value instead of thrown now.
template <class F>
Value lazily(F body) {
  try {
    return Value::sequence(body(), Value::Seq::Generator);
  } catch (const TemplateError& e) {
    return Value::sequence({Value::undefined(e.what())}, Value::Seq::GeneratorError);
  }
}

std::string soft_str(const Value& v) { return v.to_str(); }

bool opt_bool(const std::optional<Value>& v, bool def) { return v ? v->truthy() : def; }

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0 (missing -> Undefined).
Value attr_path(const Value& item, const std::string& path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = get_item(cur, digits ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Value sort_key(const Value& item, const std::optional<Value>& attribute, bool case_sensitive) {
  Value k = attribute && !attribute->is_none() ? attr_path(item, attribute->to_str()) : item;
  if (!case_sensitive && k.is_string()) return Value(pystr::lower(k.get_string()));
  return k;
}

// select/reject/selectattr/rejectattr: args after `skip` are the test name and its arguments.
ValueList select_items(const Value& seq, CallArgs& a, bool by_attr, bool keep_when) {
  if (!seq.truthy()) return {};  // jinja2 checks `if value:` before anything else
  size_t skip = by_attr ? 1 : 0;
  std::string attr;
  if (by_attr) {
    if (a.args.empty()) throw TemplateError("selectattr/rejectattr need an attribute name");
    attr = a.args[0].to_str();
  }
  std::string test;
  CallArgs test_args;
  if (a.args.size() > skip) {
    test = a.args[skip].to_str();
    if (!is_test(test)) throw TemplateError("no test named '" + test + "'");
    test_args.args.assign(a.args.begin() + static_cast<long>(skip) + 1, a.args.end());
  }
  test_args.kwargs = a.kwargs;
  ValueList out;
  for (const Value& item : iterate(seq)) {
    Value v = by_attr ? attr_path(item, attr) : item;
    bool pass = test.empty() ? v.truthy() : call_test(test, v, test_args);
    if (pass == keep_when) out.push_back(item);
  }
  return out;
}

Value select_impl(const Value& seq, CallArgs& a, bool by_attr, bool keep_when) {
  return lazily([&] { return select_items(seq, a, by_attr, keep_when); });
}

ValueList map_items(const Value& seq, CallArgs& a) {
  ValueList out;
  if (!seq.truthy()) return out;
  auto attribute = arg(CallArgs{{}, a.kwargs}, 0, "attribute");
  if (attribute) {
    auto def = arg(CallArgs{{}, a.kwargs}, 0, "default");
    for (const Value& item : iterate(seq)) {
      Value v = attr_path(item, attribute->to_str());
      out.push_back(v.is_undefined() && def ? *def : v);
    }
    return out;
  }
  if (a.args.empty()) throw TemplateError("map() needs a filter name or attribute=");
  std::string name = a.args[0].to_str();
  if (!is_filter(name)) throw TemplateError("no filter named '" + name + "'");
  CallArgs rest{ValueList(a.args.begin() + 1, a.args.end()), a.kwargs};
  for (const Value& item : iterate(seq)) {
    CallArgs copy = rest;
    out.push_back(call_filter(name, item, copy));
  }
  return out;
}

Value map_impl(const Value& seq, CallArgs& a) {
  return lazily([&] { return map_items(seq, a); });
}

Value minmax(const Value& seq, CallArgs& a, bool want_max) {
  check_args(a, want_max ? "max" : "min", {"case_sensitive", "attribute"});
  bool cs = opt_bool(arg(a, 0, "case_sensitive"), false);
  auto attribute = arg(a, 1, "attribute");
  ValueList items = iterate(seq);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(items[0], attribute, cs);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(items[i], attribute, cs);
    // Python's max() asks item > best, min() asks item < best.
    if (want_max ? values_less(best_key, k, ">", true) : values_less(k, best_key, "<")) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}

std::string do_indent(const std::string& s, const std::string& ind, bool first, bool blank) {
  // jinja2 appends a newline before splitlines(), so a trailing newline survives.
  std::vector<std::string> lines = pystr::splitlines(s + "\n", false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind + lines[i]);
  }
  return first ? ind + rv : rv;
}

double round_common(double x, int64_t ndigits) {
  // Python's round(): correctly rounded decimal with ties to even, which printf's %.*f also gives.
  if (ndigits < 0) {
    double p = std::pow(10.0, static_cast<double>(-ndigits));
    return std::nearbyint(x / p) * p;
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(ndigits, 300)), x);
  return std::strtod(buf, nullptr);
}

const std::pair<const char*, FilterFn> kFilters[] = {
    {"abs", [](const Value& v, CallArgs& a) {
       check_args(a, "abs", {});
       if (v.is_float()) return Value(std::fabs(v.get_number()));
       if (v.is_int() || v.is_bool()) return Value(static_cast<int64_t>(std::llabs(v.get_int())));
       throw TemplateError(std::string("bad operand type for abs(): '") + v.type_name() + "'");
     }},
    {"attr", [](const Value& v, CallArgs& a) {
       check_args(a, "attr", {"name"});
       auto n = arg(a, 0, "name");
       if (!n) throw TemplateError("attr() needs a name");
       // |attr reads attributes only (methods, namespace fields), never dict items.
       if (v.is_dict()) {
         Value m = get_attr(Value::dict(Dict{}), n->to_str());
         return m.is_function() ? get_attr(v, n->to_str()) : Value::undefined("'dict object' has no attribute '" + n->to_str() + "'");
       }
       return get_attr(v, n->to_str());
     }},
    {"capitalize", [](const Value& v, CallArgs& a) { check_args(a, "capitalize", {}); return Value(pystr::capitalize(soft_str(v))); }},
    {"center", [](const Value& v, CallArgs& a) {
       check_args(a, "center", {"width"});
       std::string s = soft_str(v);
       int64_t width = arg(a, 0, "width") ? arg(a, 0, "width")->get_int() : 80;
       int64_t len = static_cast<int64_t>(pystr::length(s));
       if (width <= len) return Value(s);
       int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
       return Value(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(marg - left), ' '));
     }},
    {"count", [](const Value& v, CallArgs& a) { check_args(a, "count", {}); return Value(length_of(v)); }},
    {"length", [](const Value& v, CallArgs& a) { check_args(a, "length", {}); return Value(length_of(v)); }},
    {"default", [](const Value& v, CallArgs& a) {
       check_args(a, "default", {"default_value", "boolean"});
       auto d = arg(a, 0, "default_value");
       if (v.is_undefined() || (opt_bool(arg(a, 1, "boolean"), false) && !v.truthy())) return d ? *d : Value("");
       return v;
     }},
    {"d", [](const Value& v, CallArgs& a) {
       check_args(a, "d", {"default_value", "boolean"});
       auto d = arg(a, 0, "default_value");
       if (v.is_undefined() || (opt_bool(arg(a, 1, "boolean"), false) && !v.truthy())) return d ? *d : Value("");
       return v;
     }},
    {"dictsort", [](const Value& v, CallArgs& a) {
       check_args(a, "dictsort", {"case_sensitive", "by", "reverse"});
       if (v.is_undefined()) v.fail_undefined();
       if (!v.is_dict()) throw TemplateError(std::string("'") + v.type_name() + "' object has no attribute 'items'");
       bool cs = opt_bool(arg(a, 0, "case_sensitive"), false);
       std::string by = arg(a, 1, "by") ? arg(a, 1, "by")->to_str() : "key";
       if (by != "key" && by != "value") throw TemplateError("You can only sort by either \"key\" or \"value\"");
       ValueList items;
       for (const auto& [k, x] : v.get_dict().entries) items.push_back(Value::list({Value(k), x}, true));
       size_t idx = by == "key" ? 0 : 1;
       std::stable_sort(items.begin(), items.end(), [&](const Value& p, const Value& q) {
         return values_less(sort_key(p.get_list()[idx], std::nullopt, cs), sort_key(q.get_list()[idx], std::nullopt, cs));
       });
       if (opt_bool(arg(a, 2, "reverse"), false)) std::reverse(items.begin(), items.end());
       return Value::list(std::move(items));
     }},
    {"escape", [](const Value& v, CallArgs& a) {
       check_args(a, "escape", {});
       std::string out;
       for (char c : soft_str(v)) {
         switch (c) {
           case '&': out += "&amp;"; break;
           case '<': out += "&lt;"; break;
           case '>': out += "&gt;"; break;
           case '"': out += "&#34;"; break;
           case '\'': out += "&#39;"; break;
           default: out += c;
         }
       }
       return Value(out);
     }},
    {"first", [](const Value& v, CallArgs& a) {
       check_args(a, "first", {});
       ValueList items = iterate(v);
       return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
     }},
    {"last", [](const Value& v, CallArgs& a) {
       check_args(a, "last", {});
       if (v.is_generator() || (!v.is_list() && !v.is_dict() && !v.is_string() && !v.is_undefined()))
         throw TemplateError(std::string("'") + v.type_name() + "' object is not reversible");
       ValueList items = iterate(v);
       return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
     }},
    {"float", [](const Value& v, CallArgs& a) {
       check_args(a, "float", {"default"});
       auto def = arg(a, 0, "default");
       if (v.is_undefined()) v.fail_undefined();
       if (v.is_number()) return Value(v.get_number());
       if (v.is_string()) {
         std::string s = pystr::strip(v.get_string(), std::nullopt, true, true);
         char* end = nullptr;
         double f = std::strtod(s.c_str(), &end);
         if (!s.empty() && end == s.c_str() + s.size()) return Value(f);
       }
       return def ? *def : Value(0.0);
     }},
    {"int", [](const Value& v, CallArgs& a) {
       check_args(a, "int", {"default", "base"});
       Value def = arg(a, 0, "default").value_or(Value(0));
       int base = static_cast<int>(arg(a, 1, "base") ? arg(a, 1, "base")->get_int() : 10);
       if (v.is_undefined()) v.fail_undefined();
       if (v.is_int() || v.is_bool()) return Value(v.get_int());
       if (v.is_float()) return std::isfinite(v.get_number()) ? Value(static_cast<int64_t>(v.get_number())) : def;
       if (v.is_string()) {
         std::string s = pystr::strip(v.get_string(), std::nullopt, true, true);
         std::string digits;
         for (char c : s)
           if (c != '_') digits += c;
         char* end = nullptr;
         errno = 0;
         long long i = std::strtoll(digits.c_str(), &end, base);
         if (!digits.empty() && end == digits.c_str() + digits.size() && errno == 0) return Value(static_cast<int64_t>(i));
         // jinja2's quirk: "42.23"|int gives 42 through float().
         double f = std::strtod(s.c_str(), &end);
         if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(f)) return Value(static_cast<int64_t>(f));
       }
       return def;
     }},
    {"indent", [](const Value& v, CallArgs& a) {
       check_args(a, "indent", {"width", "first", "blank"});
       auto w = arg(a, 0, "width");
       std::string ind = !w ? "    " : w->is_string() ? w->get_string() : std::string(static_cast<size_t>(std::max<int64_t>(0, w->get_int())), ' ');
       // jinja2 appends "\n" to the value itself, so only strings get through.
       if (v.is_undefined()) v.fail_undefined();
       if (v.is_tuple()) throw TemplateError("can only concatenate tuple (not \"str\") to tuple");
       if (v.seq_kind() == Value::Seq::List && v.is_list())
         throw TemplateError("'list' object has no attribute 'splitlines'");
       if (!v.is_string())
         throw TemplateError(std::string("unsupported operand type(s) for +=: '") + v.type_name() + "' and 'str'");
       return Value(do_indent(soft_str(v), ind, opt_bool(arg(a, 1, "first"), false), opt_bool(arg(a, 2, "blank"), false)));
     }},
    {"items", [](const Value& v, CallArgs& a) {
       check_args(a, "items", {});
       return lazily([&] {
         ValueList out;
         if (v.is_undefined()) return out;
         if (!v.is_dict()) throw TemplateError("Can only get item pairs from a mapping.");
         for (const auto& [k, x] : v.get_dict().entries) out.push_back(Value::list({Value(k), x}, true));
         return out;
       });
     }},
    {"join", [](const Value& v, CallArgs& a) {
       check_args(a, "join", {"d", "attribute"});
       std::string sep = arg(a, 0, "d") ? arg(a, 0, "d")->to_str() : "";
       auto attribute = arg(a, 1, "attribute");
       std::string out;
       bool first = true;
       for (const Value& item : iterate(v)) {
         if (!first) out += sep;
         first = false;
         out += (attribute && !attribute->is_none() ? attr_path(item, attribute->to_str()) : item).to_str();
       }
       return Value(out);
     }},
    {"list", [](const Value& v, CallArgs& a) { check_args(a, "list", {}); return Value::list(iterate(v)); }},
    {"lower", [](const Value& v, CallArgs& a) { check_args(a, "lower", {}); return Value(pystr::lower(soft_str(v))); }},
    {"upper", [](const Value& v, CallArgs& a) { check_args(a, "upper", {}); return Value(pystr::upper(soft_str(v))); }},
    {"title", [](const Value& v, CallArgs& a) { check_args(a, "title", {}); return Value(pystr::jinja_title(soft_str(v))); }},
    {"map", [](const Value& v, CallArgs& a) { return map_impl(v, a); }},
    {"max", [](const Value& v, CallArgs& a) { return minmax(v, a, true); }},
    {"min", [](const Value& v, CallArgs& a) { return minmax(v, a, false); }},
    {"reject", [](const Value& v, CallArgs& a) { return select_impl(v, a, false, false); }},
    {"rejectattr", [](const Value& v, CallArgs& a) { return select_impl(v, a, true, false); }},
    {"select", [](const Value& v, CallArgs& a) { return select_impl(v, a, false, true); }},
    {"selectattr", [](const Value& v, CallArgs& a) { return select_impl(v, a, true, true); }},
    {"replace", [](const Value& v, CallArgs& a) {
       check_args(a, "replace", {"old", "new", "count"});
       auto o = arg(a, 0, "old"), n = arg(a, 1, "new"), c = arg(a, 2, "count");
       if (!o || !n) throw TemplateError("replace() needs old and new");
       return Value(pystr::replace(soft_str(v), o->to_str(), n->to_str(), c && !c->is_none() ? c->get_int() : -1));
     }},
    {"reverse", [](const Value& v, CallArgs& a) {
       check_args(a, "reverse", {});
       if (v.is_string()) return Value(pystr::slice(v.get_string(), std::nullopt, std::nullopt, -1));
       if (!v.is_undefined() && !v.is_list() && !v.is_dict()) throw TemplateError("argument must be iterable");
       ValueList items = iterate(v);
       std::reverse(items.begin(), items.end());
       // reversed(list) is an iterator; a generator has no reversed() and becomes a reversed list.
       return v.is_generator() ? Value::list(std::move(items)) : Value::sequence(std::move(items), Value::Seq::Generator);
     }},
    {"round", [](const Value& v, CallArgs& a) {
       check_args(a, "round", {"precision", "method"});
       int64_t prec = arg(a, 0, "precision") ? arg(a, 0, "precision")->get_int() : 0;
       std::string method = arg(a, 1, "method") ? arg(a, 1, "method")->to_str() : "common";
       if (!v.is_number()) throw TemplateError(std::string("type ") + v.type_name() + " doesn't define __round__ method");
       if (method == "common") {
         if (!v.is_float()) return Value(v.get_int());  // round(int, n) stays an int
         return Value(round_common(v.get_number(), prec));
       }
       if (method != "floor" && method != "ceil") throw TemplateError("method must be common, ceil or floor");
       double p = std::pow(10.0, static_cast<double>(prec));
       double x = v.get_number() * p;
       return Value((method == "floor" ? std::floor(x) : std::ceil(x)) / p);
     }},
    {"safe", [](const Value& v, CallArgs& a) { check_args(a, "safe", {}); return Value(soft_str(v)); }},
    {"sort", [](const Value& v, CallArgs& a) {
       check_args(a, "sort", {"reverse", "case_sensitive", "attribute"});
       bool rev = opt_bool(arg(a, 0, "reverse"), false), cs = opt_bool(arg(a, 1, "case_sensitive"), false);
       auto attribute = arg(a, 2, "attribute");
       ValueList items = iterate(v);
       std::vector<std::pair<Value, size_t>> keyed;
       for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(sort_key(items[i], attribute, cs), i);
       // Python's sort(reverse=True) keeps equal items in their original order.
       std::stable_sort(keyed.begin(), keyed.end(), [rev](const auto& p, const auto& q) {
         return rev ? values_less(q.first, p.first) : values_less(p.first, q.first);
       });
       ValueList out;
       for (const auto& [k, i] : keyed) out.push_back(items[i]);
       return Value::list(std::move(out));
     }},
    {"string", [](const Value& v, CallArgs& a) { check_args(a, "string", {}); return Value(soft_str(v)); }},
    {"sum", [](const Value& v, CallArgs& a) {
       check_args(a, "sum", {"attribute", "start"});
       auto attribute = arg(a, 0, "attribute");
       Value total = arg(a, 1, "start").value_or(Value(0));
       for (const Value& item : iterate(v))
         total = binary_op("+", total, attribute && !attribute->is_none() ? attr_path(item, attribute->to_str()) : item);
       return total;
     }},
    {"tojson", [](const Value& v, CallArgs& a) {
       check_args(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
       return Value(to_json(v, opt_bool(arg(a, 0, "ensure_ascii"), false), arg(a, 1, "indent").value_or(Value::none()),
                            arg(a, 2, "separators").value_or(Value::none()), opt_bool(arg(a, 3, "sort_keys"), false)));
     }},
    {"trim", [](const Value& v, CallArgs& a) {
       check_args(a, "trim", {"chars"});
       auto chars = arg(a, 0, "chars");
       std::optional<std::string> set;
       if (chars && !chars->is_none()) set = chars->to_str();
       return Value(pystr::strip(soft_str(v), set, true, true));
     }},
    {"truncate", [](const Value& v, CallArgs& a) {
       check_args(a, "truncate", {"length", "killwords", "end", "leeway"});
       std::string s = soft_str(v);
       int64_t length = arg(a, 0, "length") ? arg(a, 0, "length")->get_int() : 255;
       std::string end = arg(a, 2, "end") ? arg(a, 2, "end")->to_str() : "...";
       int64_t leeway = arg(a, 3, "leeway") && !arg(a, 3, "leeway")->is_none() ? arg(a, 3, "leeway")->get_int() : 5;
       if (static_cast<int64_t>(pystr::length(s)) <= length + leeway) return Value(s);
       int64_t keep = length - static_cast<int64_t>(pystr::length(end));
       std::string head = pystr::slice(s, std::nullopt, keep, std::nullopt);
       if (opt_bool(arg(a, 1, "killwords"), false)) return Value(head + end);
       return Value(pystr::rsplit(head, std::string(" "), 1).front() + end);
     }},
    {"unique", [](const Value& v, CallArgs& a) {
       check_args(a, "unique", {"case_sensitive", "attribute"});
       bool cs = opt_bool(arg(a, 0, "case_sensitive"), false);
       auto attribute = arg(a, 1, "attribute");
       return lazily([&] {
         ValueList out, seen;
         for (const Value& item : iterate(v)) {
           Value k = sort_key(item, attribute, cs);
           if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, k); })) continue;
           seen.push_back(k);
           out.push_back(item);
         }
         return out;
       });
     }},
    {"wordcount", [](const Value& v, CallArgs& a) {
       check_args(a, "wordcount", {});
       int64_t n = 0;
       bool in_word = false;
       for (uint32_t cp : pystr::decode(soft_str(v))) {
         bool w = cp == '_' || pystr::is_alnum(pystr::encode({cp}));
         n += w && !in_word;
         in_word = w;
       }
       return Value(n);
     }},
    {"format", [](const Value& v, CallArgs& a) {
       if (!a.args.empty() && !a.kwargs.empty()) throw TemplateError("can't handle positional and keyword arguments at the same time");
       if (!a.kwargs.empty()) {
         Dict d;
         for (const auto& [k, x] : a.kwargs) d.set(k, x);
         return Value(percent_format(soft_str(v), Value::dict(std::move(d))));
       }
       return Value(percent_format(soft_str(v), Value::list(a.args, true)));
     }},
};

}  // namespace

bool is_filter(std::string_view name) {
  for (const auto& [n, f] : kFilters)
    if (name == n) return true;
  return name == "e";
}

Value call_filter(const std::string& name, const Value& input, CallArgs& args) {
  const std::string& n = name == "e" ? std::string("escape") : name;
  for (const auto& [fname, f] : kFilters)
    if (n == fname) return f(input, args);
  throw TemplateError("No filter named '" + name + "' found.");
}

}  // namespace qlora::jinja
