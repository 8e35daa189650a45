// The Jinja lexer (jinja.h): template source -> tokens, with Jinja2's whitespace control as
// transformers sets it (trim_blocks and lstrip_blocks on; `{%-`/`-%}` strip, `{%+`/`+%}` keep).
#pragma once
#include <string>
#include <vector>

namespace longtron::text::jinja {

/// One token. Data is literal template text; inside tags: names, strings (escapes resolved),
/// integers, floats and operators; tag delimiters mark statements and expressions.
struct Token {
  enum class Kind { kData, kBlockBegin, kBlockEnd, kVarBegin, kVarEnd, kName, kString, kInt, kFloat,
                    kOperator, kEnd };
  Kind kind;
  std::string text;
  int line;  ///< 1-based line of the template where the token starts
};

/// Tokens of `source`, ending with kEnd. Throws Error naming `name` and the line for an unclosed
/// tag, comment or string, or a character that starts no token.
std::vector<Token> tokenize(const std::string& source, const std::string& name);

}  // namespace longtron::text::jinja
