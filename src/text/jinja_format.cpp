// Python string formatting for templates: `fmt % args` (and the |format filter) and str.format().
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "text/jinja_builtins.h"
#include "text/jinja_pystr.h"

namespace qlora::jinja {

namespace {

std::string pad(const std::string& s, size_t width, char align, const std::string& fill) {
  size_t len = pystr::length(s);
  if (len >= width) return s;
  size_t n = width - len;
  auto rep = [&](size_t k) {
    std::string out;
    for (size_t i = 0; i < k; ++i) out += fill;
    return out;
  };
  if (align == '<') return s + rep(n);
  if (align == '^') return rep(n / 2) + s + rep(n - n / 2);
  if (align == '=' && !s.empty() && (s[0] == '-' || s[0] == '+' || s[0] == ' ')) return s.substr(0, 1) + rep(n) + s.substr(1);
  return rep(n) + s;
}

std::string c_format(const std::string& spec, double x) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), spec.c_str(), x);
  return buf;
}

std::string c_format_int(const std::string& spec, long long x) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), spec.c_str(), x);
  return buf;
}

double as_number(const Value& v, char type) {
  if (!v.is_number())
    throw TemplateError(std::string("%") + type + " format: a real number is required, not " + v.type_name());
  return v.get_number();
}

std::string group_digits(const std::string& s, char sep) {
  size_t start = (!s.empty() && (s[0] == '-' || s[0] == '+' || s[0] == ' ')) ? 1 : 0;
  size_t end = s.find_first_not_of("0123456789", start);
  if (end == std::string::npos) end = s.size();
  std::string digits = s.substr(start, end - start), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += sep;
    out += digits[i];
  }
  return s.substr(0, start) + out + s.substr(end);
}

// One value under a str.format spec: [[fill]align][sign][#][0][width][,_][.precision][type].
std::string format_spec(const Value& v, const std::string& spec) {
  if (spec.empty()) return v.to_str();
  auto cps = pystr::decode(spec);
  size_t i = 0;
  std::string fill = " ";
  char align = 0;
  auto is_align = [](uint32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (cps.size() >= 2 && is_align(cps[1])) {
    fill = pystr::encode({cps[0]});
    align = static_cast<char>(cps[1]);
    i = 2;
  } else if (!cps.empty() && is_align(cps[0])) {
    align = static_cast<char>(cps[0]);
    i = 1;
  }
  char sign = '-';
  if (i < cps.size() && (cps[i] == '+' || cps[i] == '-' || cps[i] == ' ')) sign = static_cast<char>(cps[i++]);
  bool alt = false;
  if (i < cps.size() && cps[i] == '#') alt = true, ++i;
  if (i < cps.size() && cps[i] == '0') {
    if (!align) align = '=', fill = "0";
    ++i;
  }
  size_t width = 0;
  while (i < cps.size() && cps[i] >= '0' && cps[i] <= '9') width = width * 10 + (cps[i++] - '0');
  char group = 0;
  if (i < cps.size() && (cps[i] == ',' || cps[i] == '_')) group = static_cast<char>(cps[i++]);
  int prec = -1;
  if (i < cps.size() && cps[i] == '.') {
    prec = 0;
    ++i;
    while (i < cps.size() && cps[i] >= '0' && cps[i] <= '9') prec = prec * 10 + static_cast<int>(cps[i++] - '0');
  }
  char type = i < cps.size() ? static_cast<char>(cps[i++]) : 0;
  if (i != cps.size()) throw TemplateError("Invalid format specifier '" + spec + "'");

  std::string body;
  std::string sflag = sign == '+' ? "+" : sign == ' ' ? " " : "";
  if (v.is_string() || type == 's') {
    if (!v.is_string()) throw TemplateError("Unknown format code 's' for object of type '" + std::string(v.type_name()) + "'");
    body = prec >= 0 ? pystr::slice(v.get_string(), std::nullopt, prec, std::nullopt) : v.get_string();
    return pad(body, width, align ? align : '<', fill);
  }
  if (!v.is_number()) throw TemplateError(std::string("unsupported format string passed to ") + v.type_name() + ".__format__");
  if ((type == 0 || type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b') && !v.is_float()) {
    long long x = v.get_int();
    if (type == 'b') {
      unsigned long long u = x < 0 ? -static_cast<unsigned long long>(x) : x;
      std::string bits;
      do bits.insert(bits.begin(), static_cast<char>('0' + (u & 1))); while (u >>= 1);
      body = (x < 0 ? "-" : sflag) + std::string(alt ? "0b" : "") + bits;
    } else {
      std::string conv = type == 'x' ? "x" : type == 'X' ? "X" : type == 'o' ? "o" : "d";
      body = c_format_int("%" + sflag + (alt ? "#" : "") + "ll" + conv, x);
      if (alt && type == 'o') body.insert(body.find('0'), "o");  // Python writes 0o17
    }
  } else {
    double x = v.get_number();
    if (type == 0 && prec < 0) {
      body = (x >= 0 && !sflag.empty() ? sflag : "") + (v.is_float() ? py_float_repr(x) : std::to_string(v.get_int()));
    } else {
      char t = type == 0 ? 'g' : type;
      if (t == '%') x *= 100;
      std::string conv = t == '%' ? "f" : std::string(1, t == 'n' ? 'g' : t);
      if (std::string("fFeEgG").find(conv) == std::string::npos) throw TemplateError(std::string("Unknown format code '") + type + "' for float");
      body = c_format("%" + sflag + (alt ? "#" : "") + "." + std::to_string(prec < 0 ? 6 : prec) + conv, x);
      if (t == '%') body += "%";
    }
  }
  if (group) body = group_digits(body, group);
  return pad(body, width, align ? align : '>', fill);
}

}  // namespace

std::string percent_format(const std::string& fmt, const Value& args) {
  ValueList positional = args.is_tuple() ? args.get_list() : ValueList{args};
  const Dict* mapping = args.is_dict() ? &args.get_dict() : nullptr;
  size_t next_arg = 0;
  std::string out;
  auto take = [&]() -> const Value& {
    if (next_arg >= positional.size()) throw TemplateError("not enough arguments for format string");
    return positional[next_arg++];
  };
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw TemplateError("incomplete format");
    const Value* value = nullptr;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos || !mapping) throw TemplateError("format requires a mapping");
      const Value* v = mapping->find(fmt.substr(i + 1, close - i - 1));
      if (!v) throw TemplateError("KeyError: '" + fmt.substr(i + 1, close - i - 1) + "'");
      value = v;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos) flags += fmt[i++];
    std::string width, prec;
    if (i < fmt.size() && fmt[i] == '*') width = std::to_string(take().get_int()), ++i;
    while (i < fmt.size() && isdigit(static_cast<unsigned char>(fmt[i]))) width += fmt[i++];
    if (i < fmt.size() && fmt[i] == '.') {
      prec = ".";
      ++i;
      if (i < fmt.size() && fmt[i] == '*') prec += std::to_string(take().get_int()), ++i;
      while (i < fmt.size() && isdigit(static_cast<unsigned char>(fmt[i]))) prec += fmt[i++];
    }
    while (i < fmt.size() && (fmt[i] == 'l' || fmt[i] == 'h' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) throw TemplateError("incomplete format");
    char type = fmt[i];
    if (type == '%') {
      out += '%';
      continue;
    }
    const Value& v = value ? *value : (mapping ? args : take());
    std::string piece;
    switch (type) {
      case 's':
      case 'r':
      case 'a': {
        piece = type == 's' ? v.to_str() : v.repr();
        if (prec.size() > 1) piece = pystr::slice(piece, std::nullopt, std::stoll(prec.substr(1)), std::nullopt);
        size_t w = width.empty() ? 0 : std::stoul(width);
        piece = pad(piece, w, flags.find('-') != std::string::npos ? '<' : '>', " ");
        break;
      }
      case 'd':
      case 'i':
      case 'u': {
        // %d truncates a float toward zero, as Python's int() does.
        long long x = v.is_float() ? static_cast<long long>(as_number(v, type)) : (as_number(v, type), v.get_int());
        piece = c_format_int("%" + flags + width + prec + "lld", x);
        break;
      }
      case 'x':
      case 'X':
      case 'o':
        if (!v.is_int() && !v.is_bool()) throw TemplateError(std::string("%") + type + " format: an integer is required");
        piece = c_format_int("%" + flags + width + prec + "ll" + type, v.get_int());
        break;
      case 'c':
        piece = v.is_string() ? v.get_string() : pystr::encode({static_cast<uint32_t>(v.get_int())});
        break;
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': piece = c_format("%" + flags + width + prec + type, as_number(v, type)); break;
      default: throw TemplateError(std::string("unsupported format character '") + type + "'");
    }
    out += piece;
  }
  // Python skips this check when the argument could be a mapping (anything subscriptable but a tuple).
  bool mapping_like = mapping || args.is_undefined() || (args.is_sequence() && !args.is_tuple());
  if (!mapping_like && next_arg < positional.size() && !(args.is_tuple() && positional.empty()))
    throw TemplateError("not all arguments converted during string formatting");
  return out;
}

std::string brace_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      throw TemplateError("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw TemplateError("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1), spec;
    char conv = 0;
    size_t colon = field.find(':');
    if (colon != std::string::npos) spec = field.substr(colon + 1), field.resize(colon);
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conv = bang + 1 < field.size() ? field[bang + 1] : 0;
      field.resize(bang);
    }
    // field: "", "0", "name", optionally followed by .attr / [key] parts.
    size_t part_end = field.find_first_of(".[");
    std::string head = field.substr(0, part_end);
    Value v;
    if (head.empty()) {
      if (auto_index >= args.args.size()) throw TemplateError("Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple");
      v = args.args[auto_index++];
    } else if (std::all_of(head.begin(), head.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      size_t k = std::stoul(head);
      if (k >= args.args.size()) throw TemplateError("Replacement index " + head + " out of range for positional args tuple");
      v = args.args[k];
    } else {
      auto found = arg(CallArgs{{}, args.kwargs}, 0, head);
      if (!found) throw TemplateError("KeyError: '" + head + "'");
      v = *found;
    }
    while (part_end != std::string::npos && part_end < field.size()) {
      if (field[part_end] == '.') {
        size_t e = field.find_first_of(".[", part_end + 1);
        v = get_attr(v, field.substr(part_end + 1, e == std::string::npos ? std::string::npos : e - part_end - 1));
        part_end = e;
      } else {
        size_t e = field.find(']', part_end);
        if (e == std::string::npos) throw TemplateError("Missing ']' in format string");
        std::string key = field.substr(part_end + 1, e - part_end - 1);
        bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char d) { return d >= '0' && d <= '9'; });
        v = get_item(v, digits ? Value(static_cast<int64_t>(std::stoll(key))) : Value(key));
        part_end = e + 1 < field.size() ? e + 1 : std::string::npos;
      }
    }
    if (v.is_undefined()) v.fail_undefined();
    if (conv == 'r' || conv == 'a') v = Value(v.repr());
    else if (conv == 's') v = Value(v.to_str());
    out += format_spec(v, spec);
    i = close;
  }
  return out;
}

}  // namespace qlora::jinja
