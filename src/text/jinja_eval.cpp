// Jinja evaluator: walks the syntax tree with jinja2's scoping and reports located errors.
#include <cstring>
#include <ctime>

#include "core/error.h"
#include "text/jinja.h"
#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"

namespace qlora::jinja {

const char* const kRaisedByTemplateHint = "raised by the chat template's raise_exception()";

namespace {

struct Scope;
using ScopePtr = std::shared_ptr<Scope>;

// jinja2's frames: each loop iteration and macro call reads through to its parent but writes
// locally (so `set` inside a loop is gone after it, hence namespace()); `if` shares its scope.
struct Scope {
  ScopePtr parent;
  Dict vars;

  explicit Scope(ScopePtr p) : parent(std::move(p)) {}
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get())
      if (const Value* v = s->vars.find(name)) return v;
    return nullptr;
  }
};

struct BreakSignal {};
struct ContinueSignal {};
struct RaisedError {
  std::string message;
};

std::shared_ptr<const Function> make_fn(std::string name, std::function<Value(CallArgs&)> f) {
  auto fn = std::make_shared<Function>();
  fn->name = std::move(name);
  fn->call = std::move(f);
  return fn;
}

void check_ns_name(const std::string& name) {
  // transformers rejects underscore names so templates cannot reach Python internals.
  if (!name.empty() && name[0] == '_')
    throw TemplateError("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
                        name + "'. Please rename the attribute.");
}

Dict kwargs_dict(const CallArgs& args, const char* fn) {
  Dict d;
  if (!args.args.empty()) {
    if (args.args.size() > 1 || !args.args[0].is_dict())
      throw TemplateError(std::string(fn) + "() takes at most one mapping argument");
    d = args.args[0].get_dict();
  }
  for (const auto& [k, v] : args.kwargs) d.set(k, v);
  return d;
}

class Evaluator {
 public:
  Evaluator(const Program& prog, const RenderOptions& opts, std::vector<Span>* spans)
      : prog_(prog), opts_(opts), spans_(spans) {}

  std::string run(const Value& context) {
    auto globals = std::make_shared<Scope>(nullptr);
    install_globals(globals->vars);
    auto root = std::make_shared<Scope>(globals);
    if (context.is_dict()) root->vars = context.get_dict();
    std::string out;
    top_out_ = &out;
    try {
      exec(prog_.body, root, out);
    } catch (const RaisedError& e) {
      qlora::fail(ErrorKind::Data, where(), e.message, kRaisedByTemplateHint);
    } catch (const TemplateError& e) {
      qlora::fail(ErrorKind::Data, where(), e.what());
    } catch (const std::invalid_argument& e) {
      qlora::fail(ErrorKind::Data, where(), e.what());
    } catch (const std::out_of_range& e) {
      qlora::fail(ErrorKind::Data, where(), e.what());
    }
    return out;
  }

 private:
  const Program& prog_;
  const RenderOptions& opts_;
  std::vector<Span>* spans_;
  std::string* top_out_ = nullptr;
  Loc loc_;
  int call_depth_ = 0;

  std::string where() const {
    return prog_.name + ":" + std::to_string(loc_.line) + ":" + std::to_string(loc_.col);
  }

  void install_globals(Dict& g) {
    g.set("range", Value::function(make_fn("range", [](CallArgs& a) {
      if (!a.kwargs.empty() || a.args.empty() || a.args.size() > 3)
        throw TemplateError("range() takes 1 to 3 integer arguments");
      for (const Value& v : a.args)
        if (!v.is_int() && !v.is_bool())
          throw TemplateError(std::string("'") + v.type_name() + "' object cannot be interpreted as an integer");
      int64_t start = 0, stop, step = 1;
      if (a.args.size() == 1) {
        stop = a.args[0].get_int();
      } else {
        start = a.args[0].get_int();
        stop = a.args[1].get_int();
        if (a.args.size() == 3) step = a.args[2].get_int();
      }
      if (step == 0) throw TemplateError("range() arg 3 must not be zero");
      ValueList out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        // jinja2's sandbox caps ranges at 100000 items.
        if (out.size() >= 100000) throw TemplateError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        out.push_back(Value(i));
      }
      return Value::list(std::move(out));
    })));
    g.set("namespace", Value::function(make_fn("namespace", [](CallArgs& a) {
      auto ns = std::make_shared<Namespace>();
      ns->attrs = kwargs_dict(a, "namespace");
      for (const auto& [k, v] : ns->attrs.entries) check_ns_name(k);
      return Value::ns(std::move(ns));
    })));
    g.set("dict", Value::function(make_fn("dict", [](CallArgs& a) { return Value::dict(kwargs_dict(a, "dict")); })));
    g.set("raise_exception", Value::function(make_fn("raise_exception", [](CallArgs& a) -> Value {
      throw RaisedError{a.args.empty() ? std::string() : a.args[0].to_str()};
    })));
    g.set("strftime_now", Value::function(make_fn("strftime_now", [this](CallArgs& a) {
      check_args(a, "strftime_now", {"format"});
      auto fmt = arg(a, 0, "format");
      if (!fmt || !fmt->is_string()) throw TemplateError("strftime_now() needs a format string");
      return Value(strftime_now(fmt->get_string()));
    })));
  }

  std::string strftime_now(const std::string& fmt) const {
    std::tm tm{};
    if (opts_.now) {
      tm = opts_.now();
    } else {
      std::time_t t = std::time(nullptr);
      localtime_r(&t, &tm);
    }
    if (fmt.empty()) return "";
    std::vector<char> buf(256);
    while (true) {
      size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
      if (n > 0 || buf.size() > 65536) return std::string(buf.data(), n);
      buf.resize(buf.size() * 4);
    }
  }

  // ---- statements ----

  void exec(const NodeList& nodes, const ScopePtr& scope, std::string& out) {
    for (const auto& n : nodes) exec_node(*n, scope, out);
  }

  void exec_node(const Node& n, const ScopePtr& scope, std::string& out) {
    loc_ = n.loc;
    switch (n.kind) {
      case Node::Kind::Text: out += n.text; return;
      case Node::Kind::Print: out += eval(*n.expr, scope).to_str(); return;
      case Node::Kind::If:
        if (eval(*n.expr, scope).truthy())
          exec(n.body, scope, out);
        else
          exec(n.else_body, scope, out);
        return;
      case Node::Kind::For: exec_for(n, scope, out); return;
      case Node::Kind::Set: {
        Value v = eval(*n.expr, scope);
        loc_ = n.loc;
        assign(n.target, std::move(v), *scope);
        return;
      }
      case Node::Kind::SetBlock: {
        std::string text;
        exec(n.body, scope, text);
        Value v(std::move(text));
        if (n.filter) v = apply_filter_chain(*n.filter, std::move(v), scope);
        loc_ = n.loc;
        assign(n.target, std::move(v), *scope);
        return;
      }
      case Node::Kind::Macro: scope->vars.set(n.text, make_macro(n, scope)); return;
      case Node::Kind::Break: throw BreakSignal{};
      case Node::Kind::Continue: throw ContinueSignal{};
      case Node::Kind::Generation: {
        size_t begin = out.size();
        exec(n.body, scope, out);
        // Offsets are only meaningful in the final text (as transformers' tracker records them).
        if (spans_ && &out == top_out_) spans_->push_back(Span{begin, out.size()});
        return;
      }
      case Node::Kind::FilterBlock: {
        std::string text;
        exec(n.body, scope, text);
        out += apply_filter_chain(*n.filter, Value(std::move(text)), scope).to_str();
        return;
      }
      case Node::Kind::With: {
        auto inner = std::make_shared<Scope>(scope);
        for (const auto& [target, expr] : n.assigns) assign(target, eval(*expr, inner), *inner);
        exec(n.body, inner, out);
        return;
      }
    }
  }

  void assign(const Target& t, Value v, Scope& scope) {
    if (!t.attr.empty()) {
      const Value* ns = scope.find(t.names[0]);
      if (!ns || !ns->is_namespace()) throw TemplateError("cannot assign attribute on non-namespace object");
      check_ns_name(t.attr);
      ns->get_namespace().attrs.set(t.attr, std::move(v));
      return;
    }
    if (!t.tuple) {
      scope.vars.set(t.names[0], std::move(v));
      return;
    }
    if (v.is_undefined()) v.fail_undefined();
    ValueList items = iterate(v);
    if (items.size() != t.names.size()) {
      if (items.size() > t.names.size())
        throw TemplateError("too many values to unpack (expected " + std::to_string(t.names.size()) + ")");
      throw TemplateError("not enough values to unpack (expected " + std::to_string(t.names.size()) + ", got " +
                          std::to_string(items.size()) + ")");
    }
    for (size_t i = 0; i < items.size(); ++i) scope.vars.set(t.names[i], std::move(items[i]));
  }

  void exec_for(const Node& n, const ScopePtr& scope, std::string& out) {
    Value seq = eval(*n.expr, scope);
    loc_ = n.loc;
    if (!seq.is_undefined() && !seq.is_list() && !seq.is_dict() && !seq.is_string())
      throw TemplateError(std::string("'") + seq.type_name() + "' object is not iterable");
    ValueList items = iterate(seq);
    if (n.cond) {
      // `for x in xs if cond` filters first: loop.index/length count the kept items only.
      ValueList kept;
      for (auto& item : items) {
        auto s = std::make_shared<Scope>(scope);
        assign(n.target, item, *s);
        if (eval(*n.cond, s).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      auto s = std::make_shared<Scope>(scope);
      exec(n.else_body, s, out);
      return;
    }
    int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      auto s = std::make_shared<Scope>(scope);
      assign(n.target, items[i], *s);
      s->vars.set("loop", loop_object(items, i));
      try {
        exec(n.body, s, out);
      } catch (const BreakSignal&) {
        break;
      } catch (const ContinueSignal&) {
        continue;
      }
    }
  }

  static Value loop_object(const ValueList& items, int64_t i) {
    int64_t len = static_cast<int64_t>(items.size());
    Dict d;
    d.entries.reserve(12);
    d.entries.emplace_back("index", Value(i + 1));
    d.entries.emplace_back("index0", Value(i));
    d.entries.emplace_back("revindex", Value(len - i));
    d.entries.emplace_back("revindex0", Value(len - i - 1));
    d.entries.emplace_back("first", Value(i == 0));
    d.entries.emplace_back("last", Value(i == len - 1));
    d.entries.emplace_back("length", Value(len));
    d.entries.emplace_back("depth", Value(1));
    d.entries.emplace_back("depth0", Value(0));
    d.entries.emplace_back("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    d.entries.emplace_back("nextitem", i + 1 < len ? items[i + 1] : Value::undefined("there is no next item"));
    d.entries.emplace_back("cycle", Value::function(make_fn("cycle", [i](CallArgs& a) {
      if (a.args.empty()) throw TemplateError("no items for cycling given");
      return a.args[static_cast<size_t>(i) % a.args.size()];
    })));
    return Value::dict(std::move(d));
  }

  Value make_macro(const Node& n, const ScopePtr& scope) {
    const Node* node = &n;
    // The macro lives in its defining scope's variables: holding that scope strongly would make a
    // cycle that leaks every scope that defines a macro. The scope outlives every call made while
    // the template runs.
    std::weak_ptr<Scope> def_scope = scope;
    return Value::function(make_fn(n.text, [this, node, def_scope](CallArgs& a) {
      ScopePtr parent = def_scope.lock();
      if (!parent) throw TemplateError("macro '" + node->text + "' called after the scope that defined it ended");
      if (++call_depth_ > 200) throw TemplateError("macro recursion is too deep");
      auto s = std::make_shared<Scope>(parent);
      ValueList extra;
      for (size_t i = 0; i < a.args.size(); ++i) {
        if (i < node->params.size())
          s->vars.set(node->params[i].name, a.args[i]);
        else
          extra.push_back(a.args[i]);
      }
      Dict extra_kw;
      for (auto& [k, v] : a.kwargs) {
        bool known = false;
        for (const auto& p : node->params) known |= p.name == k;
        if (known)
          s->vars.set(k, v);
        else
          extra_kw.set(k, v);
      }
      for (const auto& p : node->params) {
        if (s->vars.find(p.name)) continue;
        s->vars.set(p.name, p.default_value ? eval(*p.default_value, s) : Value::undefined("'" + p.name + "' is undefined"));
      }
      s->vars.set("varargs", Value::list(std::move(extra), true));
      s->vars.set("kwargs", Value::dict(std::move(extra_kw)));
      std::string text;
      Loc saved = loc_;
      exec(node->body, s, text);
      loc_ = saved;
      --call_depth_;
      return Value(std::move(text));
    }));
  }

  // ---- expressions ----

  Value apply_filter_chain(const Expr& f, Value input, const ScopePtr& scope) {
    // args[0] is the filtered expression; null inside a filter/set block, whose body is `input`.
    Value in = !f.args[0]                               ? std::move(input)
               : f.args[0]->kind == Expr::Kind::Filter ? apply_filter_chain(*f.args[0], std::move(input), scope)
                                                        : eval(*f.args[0], scope);
    CallArgs ca = eval_args(f, 1, scope);
    loc_ = f.loc;
    return call_filter(f.name, in, ca);
  }

  CallArgs eval_args(const Expr& e, size_t first, const ScopePtr& scope) {
    CallArgs ca;
    for (size_t i = first; i < e.args.size(); ++i) ca.args.push_back(eval(*e.args[i], scope));
    for (const auto& [k, v] : e.kwargs) ca.kwargs.emplace_back(k, eval(*v, scope));
    return ca;
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    loc_ = e.loc;
    switch (e.kind) {
      case Expr::Kind::Const: return e.value;
      case Expr::Kind::Name: {
        const Value* v = scope->find(e.name);
        return v ? *v : Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        ValueList items;
        items.reserve(e.args.size());
        for (const auto& a : e.args) items.push_back(eval(*a, scope));
        return Value::list(std::move(items), e.kind == Expr::Kind::Tuple);
      }
      case Expr::Kind::Dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], scope);
          Value v = eval(*e.args[i + 1], scope);
          loc_ = e.args[i]->loc;
          if (!k.is_string()) throw TemplateError("dict keys must be strings in these templates");
          d.set(k.get_string(), std::move(v));
        }
        return Value::dict(std::move(d));
      }
      case Expr::Kind::GetAttr: {
        Value obj = eval(*e.args[0], scope);
        loc_ = e.loc;
        return get_attr(obj, e.name);
      }
      case Expr::Kind::GetItem: {
        Value obj = eval(*e.args[0], scope);
        Value key = eval(*e.args[1], scope);
        loc_ = e.loc;
        return get_item(obj, key);
      }
      case Expr::Kind::Slice: {
        Value obj = eval(*e.args[0], scope);
        Value b[3];
        for (int i = 0; i < 3; ++i) b[i] = e.args[i + 1] ? eval(*e.args[i + 1], scope) : Value::none();
        loc_ = e.loc;
        return get_slice(obj, b[0], b[1], b[2]);
      }
      case Expr::Kind::Call: {
        Value fn = eval(*e.args[0], scope);
        CallArgs ca = eval_args(e, 1, scope);
        loc_ = e.loc;
        if (fn.is_undefined()) fn.fail_undefined();
        if (!fn.is_function()) throw TemplateError(std::string("'") + fn.type_name() + "' object is not callable");
        return fn.get_function().call(ca);
      }
      case Expr::Kind::Filter: return apply_filter_chain(e, Value(), scope);
      case Expr::Kind::Test: {
        Value v = eval(*e.args[0], scope);
        CallArgs ca = eval_args(e, 1, scope);
        loc_ = e.loc;
        return Value(call_test(e.name, v, ca) != e.negated);
      }
      case Expr::Kind::Unary: {
        Value v = eval(*e.args[0], scope);
        loc_ = e.loc;
        if (e.name == "not") return Value(!v.truthy());
        if (v.is_undefined()) v.fail_undefined();
        if (!v.is_number())
          throw TemplateError("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
        if (e.name == "+") return v.is_bool() ? Value(v.get_int()) : v;
        if (v.is_float()) return Value(-v.get_number());
        return Value(-v.get_int());
      }
      case Expr::Kind::Binary: {
        Value a = eval(*e.args[0], scope);
        if (e.name == "and") return a.truthy() ? eval(*e.args[1], scope) : a;
        if (e.name == "or") return a.truthy() ? a : eval(*e.args[1], scope);
        Value b = eval(*e.args[1], scope);
        loc_ = e.loc;
        if (e.name == "~") return Value(a.to_str() + b.to_str());
        return binary_op(e.name, a, b);
      }
      case Expr::Kind::Compare: {
        Value left = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], scope);
          loc_ = e.loc;
          if (!compare(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::CondExpr: {
        if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
        if (e.args[2]) return eval(*e.args[2], scope);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.loc.line) +
                                " evaluated to false and no else section was defined.");
      }
    }
    return Value();
  }

  static bool compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return values_equal(a, b);
    if (op == "!=") return !values_equal(a, b);
    if (op == "in") return contains(b, a);
    if (op == "notin") return !contains(b, a);
    if (a.is_undefined()) a.fail_undefined();
    if (b.is_undefined()) b.fail_undefined();
    if (op == "<") return values_less(a, b, "<");
    if (op == ">") return values_less(b, a, ">", true);
    if (op == "<=") return values_less(a, b, "<=") || values_equal(a, b);
    return values_less(b, a, ">=", true) || values_equal(a, b);
  }
};

}  // namespace

Template Template::parse(const std::string& source, const std::string& name) {
  return Template(jinja::parse(source, name));
}

std::string Template::render(const Value& context, const RenderOptions& opts, std::vector<Span>* spans) const {
  if (spans) spans->clear();
  return Evaluator(*program_, opts, spans).run(context);
}

const std::string& Template::name() const { return program_->name; }
bool Template::marks_generation() const { return program_->marks_generation; }

}  // namespace qlora::jinja
