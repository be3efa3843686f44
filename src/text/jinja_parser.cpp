// Jinja parser: tokens -> syntax tree, following jinja2's grammar and operator precedence.
#include <algorithm>

#include "core/error.h"
#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"

namespace qlora::jinja {

namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& toks, const std::string& name) : toks_(toks), name_(name) {}

  NodeList parse_template() {
    NodeList body = subparse({});
    if (cur().type != Tok::Eof) fail(cur().loc, "unexpected " + describe(cur()));
    return body;
  }

  bool saw_generation = false;  // a {% generation %} block was parsed

 private:
  const std::vector<Token>& toks_;
  const std::string& name_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;  // recursion depth: parsing and evaluation recurse once per nesting level

  // Bounds nesting so a pathological template is an error, not a stack overflow.
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > 256) p.fail(p.cur().loc, "template nested too deeply (more than 256 levels)");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return toks_[i_]; }
  const Token& peek() const { return toks_[std::min(i_ + 1, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[i_];
    if (i_ + 1 < toks_.size()) ++i_;
    return t;
  }

  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  [[noreturn]] void fail(Loc l, const std::string& what, const std::string& hint = "",
                         ErrorKind kind = ErrorKind::Format) const {
    qlora::fail(kind, name_ + ":" + std::to_string(l.line) + ":" + std::to_string(l.col), what, hint);
  }

  void expect_op(const char* op) {
    if (!skip_op(op)) fail(cur().loc, std::string("expected '") + op + "', got " + describe(cur()));
  }
  const Token& expect_name() {
    if (cur().type != Tok::Name) fail(cur().loc, "expected a name, got " + describe(cur()));
    return next();
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail(cur().loc, std::string("expected ") + what + ", got " + describe(cur()));
    next();
  }

  static ExprPtr make(Expr::Kind k, Loc l) { return std::make_unique<Expr>(k, l); }
  static NodePtr make_node(Node::Kind k, Loc l) { return std::make_unique<Node>(k, l); }

  // ---- statements ----

  // Parses nodes until a `{% <end tag>` (left with the tag name as the current token) or the end.
  NodeList subparse(const std::vector<std::string>& end_tags) {
    DepthGuard guard(*this);
    NodeList out;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Data) {
        auto n = make_node(Node::Kind::Text, t.loc);
        n->text = t.text;
        out.push_back(std::move(n));
        next();
      } else if (t.type == Tok::VarBegin) {
        next();
        auto n = make_node(Node::Kind::Print, t.loc);
        n->expr = parse_tuple(false, true, {}, false);
        expect(Tok::VarEnd, "end of print statement '}}'");
        out.push_back(std::move(n));
      } else if (t.type == Tok::BlockBegin) {
        next();
        if (cur().type != Tok::Name) fail(cur().loc, "expected a tag name, got " + describe(cur()));
        if (std::find(end_tags.begin(), end_tags.end(), cur().text) != end_tags.end()) return out;
        out.push_back(parse_statement(end_tags));
        expect(Tok::BlockEnd, "end of statement block '%}'");
      } else {
        return out;  // Eof
      }
    }
  }

  // After a tag's own arguments: its `%}`, the body, and (drop_needle) the end tag's name.
  NodeList parse_body(const std::vector<std::string>& end_tags, const Token& opener, bool drop_needle) {
    expect(Tok::BlockEnd, "end of statement block '%}'");
    NodeList body = subparse(end_tags);
    if (cur().type == Tok::Eof) {
      std::string want;
      for (const auto& e : end_tags) want += (want.empty() ? "" : " or ") + ("{% " + e + " %}");
      fail(cur().loc,
           "unexpected end of template: the '" + opener.text + "' tag at line " + std::to_string(opener.loc.line) +
               " is not closed",
           "expected " + want);
    }
    if (drop_needle) next();
    return body;
  }

  NodePtr parse_statement(const std::vector<std::string>& enclosing_end_tags) {
    const Token& t = cur();
    const std::string& tag = t.text;
    if (tag == "if") return parse_if(next());
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(t.loc, "'" + tag + "' outside of a loop");
      next();
      return make_node(tag == "break" ? Node::Kind::Break : Node::Kind::Continue, t.loc);
    }
    if (tag == "generation") {
      saw_generation = true;
      const Token& opener = next();
      auto n = make_node(Node::Kind::Generation, t.loc);
      n->body = parse_body({"endgeneration"}, opener, true);
      return n;
    }
    if (tag == "filter") {
      const Token& opener = next();
      auto n = make_node(Node::Kind::FilterBlock, t.loc);
      n->filter = parse_filter(nullptr, true);
      n->body = parse_body({"endfilter"}, opener, true);
      return n;
    }
    if (tag == "with") return parse_with();
    if (tag == "print") {
      next();
      auto n = make_node(Node::Kind::Print, t.loc);
      n->expr = parse_tuple(false, true, {}, false);
      return n;
    }
    static const char* kUnsupported[] = {"extends", "include", "import", "from", "block", "call", "autoescape", "raw"};
    for (const char* u : kUnsupported)
      if (tag == u)
        fail(t.loc, "the '" + tag + "' tag is not supported",
             "chat templates render from one source; inline the other template", ErrorKind::Unsupported);
    std::string hint;
    if (!enclosing_end_tags.empty()) {
      hint = "the open block expects ";
      for (size_t k = 0; k < enclosing_end_tags.size(); ++k)
        hint += (k ? " or '" : "'") + enclosing_end_tags[k] + "'";
    }
    fail(t.loc, "unknown tag '" + tag + "'", hint);
  }

  // `if` (or `elif`) already consumed.
  NodePtr parse_if(const Token& opener) {
    auto n = make_node(Node::Kind::If, opener.loc);
    n->expr = parse_tuple(false, false, {}, false);
    n->body = parse_body({"elif", "else", "endif"}, opener, false);
    const Token& t = next();
    if (t.text == "elif") {
      n->else_body.push_back(parse_if(t));
    } else if (t.text == "else") {
      n->else_body = parse_body({"endif"}, opener, true);
    }
    return n;
  }

  NodePtr parse_for() {
    const Token& opener = next();
    auto n = make_node(Node::Kind::For, opener.loc);
    n->target = parse_assign_target(false, "in");
    if (!skip_name("in")) fail(cur().loc, "expected 'in' in the for tag, got " + describe(cur()));
    n->expr = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) n->cond = parse_expression(true);
    if (is_name("recursive"))
      fail(cur().loc, "recursive loops are not supported", "", ErrorKind::Unsupported);
    ++loop_depth_;
    n->body = parse_body({"endfor", "else"}, opener, false);
    --loop_depth_;
    if (next().text == "else") n->else_body = parse_body({"endfor"}, opener, true);
    return n;
  }

  Target parse_assign_target(bool with_namespace, const char* end_name) {
    Target t;
    if (with_namespace && cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
      t.names.push_back(next().text);
      next();
      t.attr = expect_name().text;
      return t;
    }
    bool paren = skip_op("(");
    while (true) {
      if (!t.names.empty() && !skip_op(",")) break;
      if (cur().type != Tok::Name || (end_name && is_name(end_name))) {
        if (!t.names.empty()) break;  // trailing comma: `a, in`
        fail(cur().loc, "can't assign to " + describe(cur()), "an assignment target is a name or names");
      }
      static const char* kConst[] = {"true", "false", "none", "True", "False", "None"};
      for (const char* c : kConst)
        if (cur().text == c) fail(cur().loc, "can't assign to '" + cur().text + "'");
      t.names.push_back(next().text);
      if (is_op(",")) t.tuple = true;
    }
    if (paren) {
      expect_op(")");
      t.tuple = t.tuple || t.names.size() > 1;
    }
    return t;
  }

  NodePtr parse_set() {
    const Token& opener = next();
    auto n = make_node(Node::Kind::Set, opener.loc);
    n->target = parse_assign_target(true, nullptr);
    if (skip_op("=")) {
      n->expr = parse_tuple(false, true, {}, false);
      return n;
    }
    n->kind = Node::Kind::SetBlock;
    if (is_op("|")) n->filter = parse_filter(nullptr, false);
    n->body = parse_body({"endset"}, opener, true);
    return n;
  }

  NodePtr parse_macro() {
    const Token& opener = next();
    auto n = make_node(Node::Kind::Macro, opener.loc);
    n->text = expect_name().text;
    expect_op("(");
    while (!is_op(")")) {
      if (!n->params.empty()) expect_op(",");
      MacroParam p;
      p.name = expect_name().text;
      if (skip_op("=")) {
        p.default_value = parse_expression(true);
      } else if (!n->params.empty() && n->params.back().default_value) {
        fail(cur().loc, "non-default argument follows default argument");
      }
      n->params.push_back(std::move(p));
    }
    next();
    int saved = loop_depth_;
    loop_depth_ = 0;  // a macro body is not inside the caller's loop
    n->body = parse_body({"endmacro"}, opener, true);
    loop_depth_ = saved;
    return n;
  }

  NodePtr parse_with() {
    const Token& opener = next();
    auto n = make_node(Node::Kind::With, opener.loc);
    while (cur().type != Tok::BlockEnd) {
      if (!n->assigns.empty()) expect_op(",");
      Target t = parse_assign_target(false, nullptr);
      expect_op("=");
      n->assigns.emplace_back(std::move(t), parse_expression(true));
    }
    n->body = parse_body({"endwith"}, opener, true);
    return n;
  }

  // ---- expressions ----

  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || cur().type == Tok::Eof || is_op(")"))
      return true;
    return cur().type == Tok::Name &&
           std::find(extra_end.begin(), extra_end.end(), cur().text) != extra_end.end();
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                      bool explicit_parens) {
    Loc loc = cur().loc;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail(cur().loc, "expected an expression, got " + describe(cur()));
    }
    auto e = make(Expr::Kind::Tuple, loc);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    ExprPtr e1 = parse_or();
    while (is_name("if")) {
      Loc loc = next().loc;
      auto c = make(Expr::Kind::CondExpr, loc);
      ExprPtr test = parse_or();
      ExprPtr other = skip_name("else") ? parse_condexpr() : nullptr;
      c->args.push_back(std::move(e1));
      c->args.push_back(std::move(test));
      c->args.push_back(std::move(other));
      e1 = std::move(c);
    }
    return e1;
  }

  ExprPtr binary(const std::string& op, Loc loc, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Kind::Binary, loc);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      Loc loc = next().loc;
      left = binary("or", loc, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      Loc loc = next().loc;
      left = binary("and", loc, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      Loc loc = next().loc;
      auto e = make(Expr::Kind::Unary, loc);
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    Loc loc = cur().loc;
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      static const char* kCmp[] = {"==", "!=", "<", "<=", ">", ">="};
      std::string op;
      for (const char* c : kCmp)
        if (is_op(c)) op = c;
      if (!op.empty()) {
        next();
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      ops.push_back(op);
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(Expr::Kind::Compare, loc);
    e->args.push_back(std::move(first));
    for (auto& o : operands) e->args.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      left = binary(t.text, t.loc, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      Loc loc = next().loc;
      left = binary("~", loc, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      left = binary(t.text, t.loc, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      Loc loc = next().loc;
      left = binary("**", loc, std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      node = make(Expr::Kind::Unary, t.loc);
      node->name = t.text;
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr constant(Value v, Loc loc) {
    auto e = make(Expr::Kind::Const, loc);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::Name: {
        next();
        if (t.text == "true" || t.text == "True") return constant(Value(true), t.loc);
        if (t.text == "false" || t.text == "False") return constant(Value(false), t.loc);
        if (t.text == "none" || t.text == "None") return constant(Value::none(), t.loc);
        auto e = make(Expr::Kind::Name, t.loc);
        e->name = t.text;
        return e;
      }
      case Tok::String: {
        // Adjacent literals concatenate, as in Python.
        std::string s;
        while (cur().type == Tok::String) s += next().text;
        return constant(Value(std::move(s)), t.loc);
      }
      case Tok::Int: next(); return constant(Value(t.int_value), t.loc);
      case Tok::Float: next(); return constant(Value(t.float_value), t.loc);
      case Tok::Op:
        if (t.text == "(") {
          next();
          ExprPtr e = parse_tuple(false, true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    fail(t.loc, "unexpected " + describe(t), "an expression was expected here");
  }

  ExprPtr parse_list() {
    auto e = make(Expr::Kind::List, next().loc);
    while (!is_op("]")) {
      if (!e->args.empty()) expect_op(",");
      if (is_op("]")) break;
      e->args.push_back(parse_expression(true));
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    auto e = make(Expr::Kind::Dict, next().loc);
    while (!is_op("}")) {
      if (!e->args.empty()) expect_op(",");
      if (is_op("}")) break;
      e->args.push_back(parse_expression(true));
      expect_op(":");
      e->args.push_back(parse_expression(true));
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("["))
        node = parse_subscript(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        return node;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|"))
        node = parse_filter(std::move(node), false);
      else if (is_name("is"))
        node = parse_test(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        return node;
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();
    if (t.text == ".") {
      const Token& a = cur();
      if (a.type == Tok::Name) {
        next();
        auto e = make(Expr::Kind::GetAttr, t.loc);
        e->name = a.text;
        e->args.push_back(std::move(node));
        return e;
      }
      if (a.type == Tok::Int) {
        next();
        auto e = make(Expr::Kind::GetItem, t.loc);
        e->args.push_back(std::move(node));
        e->args.push_back(constant(Value(a.int_value), a.loc));
        return e;
      }
      fail(a.loc, "expected a name or number after '.', got " + describe(a));
    }
    // '[': an index or a slice
    ExprPtr index;
    std::vector<ExprPtr> bounds;  // start, stop, step when slicing
    bool is_slice = false;
    if (is_op(":")) {
      is_slice = true;
      bounds.push_back(nullptr);
    } else {
      index = parse_expression(true);
      if (is_op(":")) {
        is_slice = true;
        bounds.push_back(std::move(index));
      }
    }
    if (is_slice) {
      next();  // ':'
      if (is_op(":") || is_op("]") || is_op(","))
        bounds.push_back(nullptr);
      else
        bounds.push_back(parse_expression(true));
      if (skip_op(":")) {
        if (is_op("]") || is_op(","))
          bounds.push_back(nullptr);
        else
          bounds.push_back(parse_expression(true));
      } else {
        bounds.push_back(nullptr);
      }
    }
    if (is_op(","))
      fail(cur().loc, "multi-dimensional subscripts are not supported", "", ErrorKind::Unsupported);
    expect_op("]");
    auto e = make(is_slice ? Expr::Kind::Slice : Expr::Kind::GetItem, t.loc);
    e->args.push_back(std::move(node));
    if (is_slice)
      for (auto& b : bounds) e->args.push_back(std::move(b));
    else
      e->args.push_back(std::move(index));
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**"))
        fail(cur().loc, "*args / **kwargs in calls are not supported", "", ErrorKind::Unsupported);
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail(cur().loc, "positional argument follows keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(Expr::Kind::Call, node->loc);  // errors point at the callee, not at '('
    e->args.push_back(std::move(node));
    parse_call_args(*e);
    return e;
  }

  // node may be null: the body of a filter/set block is the input.
  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const Token& t = expect_name();
      auto e = make(Expr::Kind::Filter, t.loc);
      e->name = t.text;
      e->args.push_back(std::move(node));
      if (is_op("(")) parse_call_args(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    Loc loc = next().loc;  // 'is'
    bool negated = skip_name("not");
    const Token& t = expect_name();
    auto e = make(Expr::Kind::Test, loc);
    e->name = t.text;
    e->negated = negated;
    e->args.push_back(std::move(node));
    const Token& c = cur();
    bool arg_start = c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Int || c.type == Tok::Float ||
                     (c.type == Tok::Op && (c.text == "[" || c.text == "{"));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail(c.loc, "you cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }
};

// jinja2 rejects unknown filters and tests when compiling, except inside `if` statements and
// inline if-expressions ("soft" frames), where they fail only when evaluated. Loop, macro, block
// and with bodies start a new, hard frame.
class NameCheck {
 public:
  explicit NameCheck(const std::string& name) : name_(name) {}

  void nodes(const NodeList& list, bool soft) {
    for (const auto& n : list) node(*n, soft);
  }

 private:
  const std::string& name_;

  void node(const Node& n, bool soft) {
    switch (n.kind) {
      case Node::Kind::If:
        expr(n.expr.get(), true);
        nodes(n.body, true);
        nodes(n.else_body, true);
        return;
      case Node::Kind::For:
        expr(n.expr.get(), soft);
        expr(n.cond.get(), false);
        nodes(n.body, false);
        nodes(n.else_body, false);
        return;
      case Node::Kind::Macro:
        for (const auto& p : n.params) expr(p.default_value.get(), false);
        nodes(n.body, false);
        return;
      case Node::Kind::With:
        for (const auto& [t, e] : n.assigns) expr(e.get(), false);
        nodes(n.body, false);
        return;
      case Node::Kind::FilterBlock:
        expr(n.filter.get(), soft);
        nodes(n.body, false);
        return;
      case Node::Kind::SetBlock:
        expr(n.filter.get(), false);
        nodes(n.body, false);
        return;
      case Node::Kind::Generation: nodes(n.body, false); return;
      default:
        expr(n.expr.get(), soft);
        return;
    }
  }

  void expr(const Expr* e, bool soft) {
    if (!e) return;
    if (e->kind == Expr::Kind::CondExpr) soft = true;
    if (!soft && e->kind == Expr::Kind::Filter && !is_filter(e->name)) unknown("filter", *e);
    if (!soft && e->kind == Expr::Kind::Test && !is_test(e->name)) unknown("test", *e);
    for (const auto& a : e->args) expr(a.get(), soft);
    for (const auto& [k, v] : e->kwargs) expr(v.get(), soft);
  }

  [[noreturn]] void unknown(const char* what, const Expr& e) const {
    // jinja2 filters this interpreter leaves out: none of the chat templates we know use them.
    static const char* kNotImplemented[] = {"batch", "filesizeformat", "forceescape", "groupby", "pprint", "random",
                                            "slice", "striptags", "urlencode", "urlize", "wordwrap", "xmlattr"};
    bool jinja2_has = false;
    for (const char* f : kNotImplemented) jinja2_has |= e.kind == Expr::Kind::Filter && e.name == f;
    std::string where = name_ + ":" + std::to_string(e.loc.line) + ":" + std::to_string(e.loc.col);
    if (jinja2_has)
      qlora::fail(ErrorKind::Unsupported, where, "the '" + e.name + "' filter is not implemented",
                  "chat templates rarely need it; open an issue with the template");
    qlora::fail(ErrorKind::Format, where, std::string("no ") + what + " named '" + e.name + "'",
                std::string("jinja2 rejects this template too: check the ") + what + " name");
  }
};

}  // namespace

std::shared_ptr<const Program> parse(const std::string& source, const std::string& name) {
  std::vector<Token> toks = lex(source, name);
  auto prog = std::make_shared<Program>();
  prog->name = name;
  Parser parser(toks, name);
  prog->body = parser.parse_template();
  prog->marks_generation = parser.saw_generation;
  NameCheck(name).nodes(prog->body, false);
  return prog;
}

}  // namespace qlora::jinja
