// Jinja lexer: template text -> tokens with jinja2's whitespace control (trim/lstrip blocks, -/+).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace qlora::jinja {

struct Loc {
  int line = 1, col = 1;
};

enum class Tok {
  Data,        // literal template text (newlines normalized to \n)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,      // text holds the unescaped value
  Int,
  Float,
  Op,          // text holds the operator: + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { }
  Eof,
};

struct Token {
  Tok type = Tok::Eof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  Loc loc;
};

// Errors: Error(Format, "<name>:<line>:<col>", what) for unclosed tags/comments/strings, unknown
// characters and unbalanced brackets.
std::vector<Token> lex(const std::string& source, const std::string& name);

// Short description of a token for parse errors: "'x'", "end of print statement", ...
std::string describe(const Token& t);

}  // namespace qlora::jinja
