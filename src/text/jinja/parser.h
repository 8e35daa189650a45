// The Jinja parser (jinja.h): tokens -> a tree of expressions and statements, with Jinja2's
// grammar and operator precedence (jinja2/parser.py).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/lexer.h"
#include "text/jinja/value.h"

namespace longtron::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

/// An expression. `args` holds the operands in the order the comment of each kind gives.
struct Expr {
  enum class Kind {
    kConst,      // value
    kName,       // name
    kList,       // args: items (tuple set for (a, b))
    kDict,       // args: key, value, key, value, ...
    kAttr,       // args[0].name
    kItem,       // args[0][args[1]]
    kSlice,      // args[0][args[1]:args[2]:args[3]] (null where left out)
    kCall,       // args[0](args[1..], kwargs)
    kFilter,     // args[0] | name(args[1..], kwargs)
    kTest,       // args[0] is [not] name(args[1..], kwargs); negate
    kNot,        // not args[0]
    kNeg,        // -args[0]
    kPos,        // +args[0]
    kBinary,     // args[0] op args[1]: + - * / // % ** ~ == != < <= > >= in "not in"
    kAnd,        // args[0] and args[1]
    kOr,         // args[0] or args[1]
    kCond,       // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  ///< name, attribute, filter, test or operator
  bool tuple = false;
  bool negate = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  int height = 1;  ///< 1 + the largest height of args and kwargs (bounded by the parser)
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

/// A statement of the template.
struct Stmt {
  enum class Kind {
    kText,        // text
    kPrint,       // {{ expr }}
    kIf,          // branches: (condition, body)...; else_body
    kFor,         // targets in expr [if filter]: body; else_body
    kSet,         // targets (or target.attr) = expr
    kSetBlock,    // {% set targets %}body{% endset %}
    kMacro,       // name(params = defaults): body
    kBreak,
    kContinue,
    kBody,        // body as is ({% generation %} of transformers)
  };
  Kind kind;
  int line = 0;
  std::string text;                  ///< kText; kMacro's name
  ExprPtr expr;                      ///< printed, iterated or assigned value
  ExprPtr filter;                    ///< for ... if filter
  std::vector<std::string> targets;  ///< loop or set names
  std::string attr;                  ///< set targets[0].attr = ...
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  ///< one per param, null for none
};

/// Parses `tokens` of template `name`. Throws Error naming `name` and the line of the first token
/// that does not fit the grammar (an unknown tag, a missing end tag, an unexpected token).
Body parse(const std::vector<Token>& tokens, const std::string& name);

}  // namespace longtron::text::jinja
