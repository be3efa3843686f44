// Jinja syntax tree: expressions and statements as the parser builds them and the evaluator walks them.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_lexer.h"
#include "text/jinja_value.h"

namespace qlora::jinja {

struct Expr;
struct Node;
using ExprPtr = std::unique_ptr<Expr>;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct Expr {
  enum class Kind {
    Const,     // value
    Name,      // name
    List,      // args = items
    Tuple,     // args = items
    Dict,      // args = key0, value0, key1, value1, ...
    GetAttr,   // args[0].name
    GetItem,   // args[0][args[1]]
    Slice,     // args[0][args[1]:args[2]:args[3]] (null for an omitted bound)
    Call,      // args[0](args[1..], kwargs)
    Filter,    // args[0] | name(args[1..], kwargs)
    Test,      // args[0] is name(args[1..], kwargs); negated for `is not`
    Unary,     // name: "-", "+", "not"
    Binary,    // name: + - * / // % ** ~ and or
    Compare,   // args[0] ops[0] args[1] ops[1] args[2] ... (chained, as Python)
    CondExpr,  // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  Loc loc;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;

  Expr(Kind k, Loc l) : kind(k), loc(l) {}
};

// Assignment target of `for` and `set`: one or more names, or `ns.attr`.
struct Target {
  std::vector<std::string> names;
  bool tuple = false;     // `a, b` unpacks even when there is one name: `a,`
  std::string attr;       // set ns.attr = ...: names[0] is the namespace
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null when required
};

struct Node {
  enum class Kind {
    Text,        // text
    Print,       // expr
    If,          // expr test; body; else_body (an elif is a nested If in else_body)
    For,         // target in expr [if cond]; body; else_body
    Set,         // target = expr
    SetBlock,    // target = rendered body (piped through filter when given)
    Macro,       // name(params): body
    Break,
    Continue,
    Generation,  // {% generation %} body: text the assistant produces (transformers' extension)
    FilterBlock, // {% filter f %} body
    With,        // {% with a = 1 %} body: assignments scoped to the body
  };
  Kind kind;
  Loc loc;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  ExprPtr filter;  // SetBlock/FilterBlock: a Filter expr whose args[0] is null (the body's text)
  Target target;
  std::vector<std::pair<Target, ExprPtr>> assigns;  // With
  std::vector<MacroParam> params;
  NodeList body, else_body;

  Node(Kind k, Loc l) : kind(k), loc(l) {}
};

struct Program {
  std::string name;
  NodeList body;
  bool marks_generation = false;  // the source has a {% generation %} block
};

// Parses a template. Errors: Error(Format, "<name>:<line>:<col>", what, hint), including unknown
// filters and tests (jinja2 rejects those when compiling too) and unsupported tags
// (extends/include/import/call/block).
std::shared_ptr<const Program> parse(const std::string& source, const std::string& name);

}  // namespace qlora::jinja
