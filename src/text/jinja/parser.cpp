// The Jinja parser (see jinja_parser.h). Precedence, loosest first, as jinja2/parser.py:
// conditional `x if c else y`, or, and, not, comparisons (== != < <= > >= in, not in), + -, ~,
// * / // %, **, unary - +, then primary with postfix (.attr [item] (call)) and filters/tests.
#include "text/jinja/parser.h"

#include <algorithm>

#include "core/error.h"
#include "text/jinja/builtins.h"

namespace longtron::text::jinja {

namespace {

using K = Token::Kind;

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& name) : t_(tokens), name_(name) {}

  Body parse_all() {
    Body body = parse_body({});
    if (peek().kind != K::kEnd) error(peek(), "unexpected end tag");
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() {
    const Token& token = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return token;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == K::kOperator && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == K::kName && peek(ahead).text == name;
  }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  [[noreturn]] void error(const Token& at, const std::string& what) const {
    fail("{}: template line {}: {}", name_, at.line, what);
  }
  std::string describe(const Token& token) const {
    switch (token.kind) {
      case K::kEnd: return "the end of the template";
      case K::kBlockEnd: return "'%}'";
      case K::kVarEnd: return "'}}'";
      case K::kData: return "text";
      default: return "'" + token.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) error(peek(), fmt::format("expected '{}', got {}", op, describe(peek())));
  }
  std::string expect_name() {
    if (peek().kind != K::kName) error(peek(), fmt::format("expected a name, got {}", describe(peek())));
    return next().text;
  }
  void expect(K kind, const char* what) {
    if (peek().kind != kind) error(peek(), fmt::format("expected {}, got {}", what, describe(peek())));
    next();
  }
  void end_block() { expect(K::kBlockEnd, "'%}'"); }

  // Statements up to a block tag whose keyword is in `ends` (left unread: the caller reads it).
  Body parse_body(const std::vector<std::string>& ends) {
    Body body;
    while (true) {
      const Token& token = peek();
      if (token.kind == K::kEnd) {
        if (!ends.empty())
          error(token, fmt::format("the template ends before '{{% {} %}}'", ends.back()));
        return body;
      }
      if (token.kind == K::kData) {
        auto s = make(Stmt::Kind::kText, token.line);
        s->text = next().text;
        body.push_back(std::move(s));
      } else if (token.kind == K::kVarBegin) {
        next();
        auto s = make(Stmt::Kind::kPrint, token.line);
        s->expr = parse_tuple_or_expr();
        expect(K::kVarEnd, "'}}'");
        body.push_back(std::move(s));
      } else if (token.kind == K::kBlockBegin) {
        const Token& keyword = peek(1);
        if (keyword.kind == K::kName &&
            std::find(ends.begin(), ends.end(), keyword.text) != ends.end()) {
          next();  // leave the keyword for the caller
          return body;
        }
        next();
        body.push_back(parse_statement());
      } else {
        error(token, fmt::format("unexpected {}", describe(token)));
      }
    }
  }

  std::unique_ptr<Stmt> make(Stmt::Kind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  std::unique_ptr<Stmt> parse_statement() {
    Depth depth(*this);
    const Token& keyword = peek();
    if (keyword.kind != K::kName) error(keyword, fmt::format("expected a statement, got {}", describe(keyword)));
    const std::string word = next().text;
    const int line = keyword.line;
    if (word == "if") return parse_if(line);
    if (word == "for") return parse_for(line);
    if (word == "set") return parse_set(line);
    if (word == "macro") return parse_macro(line);
    if (word == "break" || word == "continue") {
      check_loop(keyword, word);
      end_block();
      return make(word == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, line);
    }
    if (word == "generation") {  // transformers' assistant-mask marker: renders its body
      end_block();
      auto s = make(Stmt::Kind::kBody, line);
      s->body = parse_body({"endgeneration"});
      next();
      end_block();
      return s;
    }
    error(keyword, fmt::format("unknown tag '{}'", word));
  }

  void check_loop(const Token& at, const std::string& word) {
    if (loops_ == 0) error(at, fmt::format("'{}' outside a for loop", word));
  }

  std::unique_ptr<Stmt> parse_if(int line) {
    auto s = make(Stmt::Kind::kIf, line);
    auto condition = parse_expression();
    end_block();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(condition), std::move(body));
      const std::string word = next().text;
      if (word == "elif") {
        condition = parse_expression();
        end_block();
        continue;
      }
      end_block();
      if (word == "else") {
        s->else_body = parse_body({"endif"});
        next();
        end_block();
      }
      return s;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names{expect_name()};
    while (accept_op(",")) names.push_back(expect_name());
    return names;
  }

  std::unique_ptr<Stmt> parse_for(int line) {
    auto s = make(Stmt::Kind::kFor, line);
    s->targets = parse_targets();
    if (!accept_name("in")) error(peek(), fmt::format("expected 'in', got {}", describe(peek())));
    s->expr = parse_tuple_or_expr(/*no_condition=*/true);
    if (accept_name("if")) s->filter = parse_expression();
    if (is_name("recursive")) error(peek(), "recursive loops are not supported");
    end_block();
    ++loops_;
    s->body = parse_body({"else", "endfor"});
    --loops_;
    if (next().text == "else") {
      end_block();
      s->else_body = parse_body({"endfor"});
      next();
    }
    end_block();
    return s;
  }

  std::unique_ptr<Stmt> parse_set(int line) {
    auto s = make(Stmt::Kind::kSet, line);
    s->targets = {expect_name()};
    if (accept_op(".")) {
      s->attr = expect_name();
    } else {
      while (accept_op(",")) s->targets.push_back(expect_name());
    }
    if (accept_op("=")) {
      s->expr = parse_tuple_or_expr();
      end_block();
      return s;
    }
    if (!s->attr.empty() || s->targets.size() != 1) error(peek(), "expected '='");
    s->kind = Stmt::Kind::kSetBlock;
    end_block();
    s->body = parse_body({"endset"});
    next();
    end_block();
    return s;
  }

  std::unique_ptr<Stmt> parse_macro(int line) {
    auto s = make(Stmt::Kind::kMacro, line);
    s->text = expect_name();
    expect_op("(");
    while (!accept_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (accept_op(")")) break;
      s->params.push_back(expect_name());
      s->defaults.push_back(accept_op("=") ? parse_expression() : nullptr);
    }
    end_block();
    const int saved = loops_;
    loops_ = 0;
    s->body = parse_body({"endmacro"});
    loops_ = saved;
    next();
    end_block();
    return s;
  }

  // ---- expressions ----

  ExprPtr node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  ExprPtr node(Expr::Kind kind, int line, ExprPtr a, ExprPtr b = nullptr) {
    auto e = node(kind, line);
    e->args.push_back(std::move(a));
    if (b) e->args.push_back(std::move(b));
    seal(*e);
    return e;
  }

  // Sets e.height from its operands' (already sealed). Chains such as a.b.c..., x|f|f|... or
  // 1+1+1+... are parsed in loops, not by recursion, but evaluating and freeing them recurses
  // once per link: a template of 100 000 links would overflow the stack.
  void seal(Expr& e) {
    int h = 0;
    for (const auto& a : e.args)
      if (a) h = std::max(h, a->height);
    for (const auto& [key, a] : e.kwargs)
      if (a) h = std::max(h, a->height);
    e.height = h + 1;
    if (e.height > kMaxHeight) error(peek(), "the expression nests too deeply");
  }
  static constexpr int kMaxHeight = 1000;

  // `a, b` without brackets is a tuple where Jinja2 allows one ({{ }}, for ... in, set =).
  ExprPtr parse_tuple_or_expr(bool no_condition = false) {
    const int line = peek().line;
    auto first = no_condition ? parse_or() : parse_expression();
    if (!is_op(",")) return first;
    auto tuple = node(Expr::Kind::kList, line);
    tuple->tuple = true;
    tuple->args.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == K::kBlockEnd || peek().kind == K::kVarEnd || is_name("if")) break;
      tuple->args.push_back(no_condition ? parse_or() : parse_expression());
    }
    seal(*tuple);
    return tuple;
  }

  struct Depth {
    explicit Depth(Parser& p) : p_(p) {
      if (++p_.depth_ > 200) p_.error(p_.peek(), "the expression nests too deeply");
    }
    ~Depth() { --p_.depth_; }
    Parser& p_;
  };

  ExprPtr parse_expression() {
    Depth depth(*this);
    auto value = parse_or();
    while (is_name("if")) {
      const int line = next().line;
      auto condition = parse_or();
      ExprPtr otherwise = accept_name("else") ? parse_expression() : nullptr;
      auto cond = node(Expr::Kind::kCond, line, std::move(value), std::move(condition));
      cond->args.push_back(std::move(otherwise));
      seal(*cond);
      value = std::move(cond);
    }
    return value;
  }

  ExprPtr parse_or() {
    auto left = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      left = node(Expr::Kind::kOr, line, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    auto left = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      left = node(Expr::Kind::kAnd, line, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Depth depth(*this);
      const int line = next().line;
      return node(Expr::Kind::kNot, line, parse_not());
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    auto left = parse_math1();
    while (true) {
      const int line = peek().line;
      std::string op;
      for (const char* o : {"==", "!=", "<", "<=", ">", ">="})
        if (is_op(o)) op = o;
      if (!op.empty()) {
        next();
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return left;
      }
      auto e = node(Expr::Kind::kBinary, line, std::move(left), parse_math1());
      e->name = op;
      left = std::move(e);
    }
  }

  ExprPtr binary(const std::string& op, int line, ExprPtr a, ExprPtr b) {
    auto e = node(Expr::Kind::kBinary, line, std::move(a), std::move(b));
    e->name = op;
    return e;
  }

  ExprPtr parse_math1() {
    auto left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      left = binary(op.text, op.line, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    auto left = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      left = binary("~", line, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    auto left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      left = binary(op.text, op.line, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    auto left = parse_unary(true);
    while (is_op("**")) {
      const int line = next().line;
      left = binary("**", line, std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    Depth depth(*this);
    ExprPtr e;
    const int line = peek().line;
    if (accept_op("-")) e = node(Expr::Kind::kNeg, line, parse_unary(false));
    else if (accept_op("+")) e = node(Expr::Kind::kPos, line, parse_unary(false));
    else e = parse_primary();
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& token = peek();
    auto constant = [&](Value v) {
      auto e = node(Expr::Kind::kConst, token.line);
      e->value = std::move(v);
      return e;
    };
    switch (token.kind) {
      case K::kName: {
        next();
        const std::string& n = token.text;
        if (n == "true" || n == "True") return constant(Value::from(true));
        if (n == "false" || n == "False") return constant(Value::from(false));
        if (n == "none" || n == "None") return constant(Value::none());
        auto e = node(Expr::Kind::kName, token.line);
        e->name = n;
        return e;
      }
      case K::kString: {
        std::string text = next().text;
        while (peek().kind == K::kString) text += next().text;  // adjacent strings concatenate
        return constant(Value::from(std::move(text)));
      }
      case K::kInt: {
        next();
        try {
          return constant(Value::from(static_cast<int64_t>(std::stoll(token.text))));
        } catch (const std::exception&) {
          error(token, fmt::format("integer {} is out of range", token.text));
        }
      }
      case K::kFloat: next(); return constant(Value::from(std::stod(token.text)));
      case K::kOperator:
        if (token.text == "(") {
          next();
          if (accept_op(")")) {
            auto e = node(Expr::Kind::kList, token.line);
            e->tuple = true;
            return e;
          }
          auto inner = parse_expression();
          if (is_op(",")) {
            auto tuple = node(Expr::Kind::kList, token.line);
            tuple->tuple = true;
            tuple->args.push_back(std::move(inner));
            while (accept_op(",") && !is_op(")")) tuple->args.push_back(parse_expression());
            seal(*tuple);
            inner = std::move(tuple);
          }
          expect_op(")");
          return inner;
        }
        if (token.text == "[") {
          next();
          auto e = node(Expr::Kind::kList, token.line);
          while (!accept_op("]")) {
            if (!e->args.empty()) {
              expect_op(",");
              if (accept_op("]")) break;
            }
            e->args.push_back(parse_expression());
          }
          seal(*e);
          return e;
        }
        if (token.text == "{") {
          next();
          auto e = node(Expr::Kind::kDict, token.line);
          while (!accept_op("}")) {
            if (!e->args.empty()) {
              expect_op(",");
              if (accept_op("}")) break;
            }
            e->args.push_back(parse_expression());
            expect_op(":");
            e->args.push_back(parse_expression());
          }
          seal(*e);
          return e;
        }
        break;
      default: break;
    }
    error(token, fmt::format("unexpected {}", describe(token)));
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!accept_op(")")) {
      if (!first) {
        expect_op(",");
        if (accept_op(")")) break;
      }
      first = false;
      if (peek().kind == K::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.kwargs.empty()) error(peek(), "a positional argument follows a keyword argument");
        e.args.push_back(parse_expression());
      }
    }
    seal(e);
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (accept_op(".")) {
        auto attr = node(Expr::Kind::kAttr, line, std::move(e));
        if (peek().kind == K::kInt) {  // x.0 is x[0]
          auto index = node(Expr::Kind::kConst, line);
          index->value = Value::from(static_cast<int64_t>(std::stoll(next().text)));
          attr->kind = Expr::Kind::kItem;
          attr->args.push_back(std::move(index));
          seal(*attr);
        } else {
          attr->name = expect_name();
        }
        e = std::move(attr);
      } else if (accept_op("[")) {
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        auto call = node(Expr::Kind::kCall, line, std::move(e));
        parse_call_args(*call);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr subject, int line) {
    ExprPtr parts[3];
    bool slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!is_op(":") && !is_op("]")) parts[k] = parse_expression();
      if (k < 2 && accept_op(":")) {
        slice = true;
        continue;
      }
      break;
    }
    expect_op("]");
    if (!slice) {
      if (!parts[0]) error(peek(), "expected a subscript");
      return node(Expr::Kind::kItem, line, std::move(subject), std::move(parts[0]));
    }
    auto e = node(Expr::Kind::kSlice, line);
    e->args.push_back(std::move(subject));
    for (auto& p : parts) e->args.push_back(std::move(p));
    seal(*e);
    return e;
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (accept_op("|")) {
        auto f = node(Expr::Kind::kFilter, line, std::move(e));
        f->name = expect_name();
        if (!is_filter(f->name)) error(peek(), fmt::format("no filter named '{}'", f->name));
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        next();
        auto t = node(Expr::Kind::kTest, line, std::move(e));
        t->negate = accept_name("not");
        t->name = expect_name();
        if (!is_test(t->name)) error(peek(), fmt::format("no test named '{}'", t->name));
        const Token& after = peek();
        if (is_op("(")) {
          parse_call_args(*t);
        } else if (after.kind == K::kString || after.kind == K::kInt || after.kind == K::kFloat ||
                   is_op("[") || is_op("{") ||
                   (after.kind == K::kName && !is_name("else") && !is_name("or") && !is_name("and") &&
                    !is_name("if") && !is_name("is") && !is_name("in") && !is_name("not"))) {
          t->args.push_back(parse_postfix(parse_primary()));
          seal(*t);
        }
        e = std::move(t);
      } else if (is_op("(")) {
        auto call = node(Expr::Kind::kCall, line, std::move(e));
        parse_call_args(*call);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  const std::string& name_;
  size_t i_ = 0;
  int loops_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& name) {
  return Parser(tokens, name).parse_all();
}

}  // namespace longtron::text::jinja
