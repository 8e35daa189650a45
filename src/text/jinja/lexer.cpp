// The Jinja lexer (see jinja_lexer.h), following Jinja2's lexer: newlines normalised to "\n", one
// trailing newline dropped (keep_trailing_newline off), whitespace control as transformers sets it.
#include "text/jinja/lexer.h"

#include <array>
#include <cctype>

#include "core/error.h"
#include "core/utf8.h"
#include "text/jinja/value.h"

namespace longtron::text::jinja {

namespace {

// Python's str.rstrip() (Unicode whitespace).
std::string rstrip_space(const std::string& s) { return py_strip(s, nullptr, false, true); }

// Length of the leading whitespace of `s` from `at` (Python's \s*).
size_t space_run(const std::string& s, size_t at) {
  const std::string rest = s.substr(at);
  return rest.size() - py_strip(rest, nullptr, true, false).size();
}

bool only_space(const std::string& s) {
  return !s.empty() && py_strip(s, nullptr, true, true).empty();
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name) : name_(name) {
    // Jinja2: "\r\n" and "\r" become "\n"; one trailing newline is dropped.
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t open = std::string::npos;
      char kind = 0;
      for (size_t at = src_.find('{', pos_); at != std::string::npos; at = src_.find('{', at + 1)) {
        if (at + 1 < src_.size() && (src_[at + 1] == '{' || src_[at + 1] == '%' || src_[at + 1] == '#')) {
          open = at;
          kind = src_[at + 1];
          break;
        }
      }
      if (open == std::string::npos) {
        emit_data(src_.substr(pos_), src_.size());
        break;
      }
      std::string data = src_.substr(pos_, open - pos_);
      const char sign = open + 2 < src_.size() ? src_[open + 2] : 0;
      if (sign == '-') {
        data = rstrip_space(data);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        const size_t l_pos = data.rfind('\n') == std::string::npos ? 0 : data.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) && only_space(data.substr(l_pos))) data.resize(l_pos);
      }
      emit_data(data, open);
      pos_ = open + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      if (kind == '#') {
        const size_t close = src_.find("#}", pos_);
        check(close != std::string::npos, "{}: template line {}: the comment is not closed", name_, line_);
        const char before = close > pos_ ? src_[close - 1] : 0;
        advance_to(close + 2);
        line_starting = finish_tag(before, /*trim=*/true);
        continue;
      }
      tokens_.push_back({kind == '%' ? Token::Kind::kBlockBegin : Token::Kind::kVarBegin, "", line_});
      line_starting = lex_tag(kind == '%');
    }
    tokens_.push_back({Token::Kind::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  void emit_data(const std::string& data, size_t next) {
    if (!data.empty()) tokens_.push_back({Token::Kind::kData, data, line_});
    advance_to(next);
  }

  void advance_to(size_t next) {
    for (size_t i = pos_; i < next && i < src_.size(); ++i) line_ += src_[i] == '\n';
    pos_ = next;
  }

  // After a tag's closing delimiter: `-` strips the following whitespace, `+` keeps it, otherwise
  // trim_blocks drops one newline (block tags and comments). Returns whether a line starts here.
  bool finish_tag(char sign, bool trim) {
    if (sign == '-') {
      const size_t n = space_run(src_, pos_);
      advance_to(pos_ + n);
      return n > 0 && src_[pos_ - 1] == '\n';
    }
    if (trim && sign != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
      return true;
    }
    return false;
  }

  [[noreturn]] void error(const std::string& what) {
    fail("{}: template line {}: {}", name_, line_, what);
  }

  // Tokens of one `{% … %}` or `{{ … }}`; returns whether a line starts after it.
  bool lex_tag(bool block) {
    int depth = 0;  // open brackets: a `}` inside a dict literal does not close the tag
    const int start_line = line_;
    while (true) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_]))) advance_to(pos_ + 1);
      if (pos_ >= src_.size())
        fail("{}: template line {}: the {} opened here is not closed", name_, start_line,
             block ? "block tag" : "expression");
      const std::string_view rest(src_.data() + pos_, src_.size() - pos_);
      if (depth == 0) {
        const std::string close = block ? "%}" : "}}";
        for (const char sign : {'-', '+', '\0'}) {
          const std::string with = sign ? std::string(1, sign) + close : close;
          if (rest.substr(0, with.size()) == with) {
            tokens_.push_back({block ? Token::Kind::kBlockEnd : Token::Kind::kVarEnd, "", line_});
            advance_to(pos_ + with.size());
            return finish_tag(sign, block);
          }
        }
      }
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos_;
        while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
        tokens_.push_back({Token::Kind::kName, src_.substr(pos_, end - pos_), line_});
        advance_to(end);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const std::array<const char*, 6> two = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* t : two)
          if (rest.substr(0, 2) == t) op = t;
        if (op.size() == 1 && std::string("+-*/%~<>=()[]{},.:|;").find(c) == std::string::npos)
          error(fmt::format("unexpected character '{}'", c));
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) error(fmt::format("unexpected '{}'", op));
          --depth;
        }
        tokens_.push_back({Token::Kind::kOperator, op, line_});
        advance_to(pos_ + op.size());
      }
    }
  }

  void lex_number() {
    size_t end = pos_;
    auto digits = [&] {
      while (end < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
    };
    digits();
    bool real = false;
    const bool after_dot = !tokens_.empty() && tokens_.back().kind == Token::Kind::kOperator &&
                           tokens_.back().text == ".";
    if (!after_dot && end + 1 < src_.size() && src_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      real = true;
      ++end;
      digits();
    }
    if (!after_dot && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        real = true;
        end = e;
        digits();
      }
    }
    std::string text = src_.substr(pos_, end - pos_);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    tokens_.push_back({real ? Token::Kind::kFloat : Token::Kind::kInt, text, line_});
    advance_to(end);
  }

  // A quoted string with Python's escapes (\n \t \r \\ \' \" \xHH \uHHHH \UHHHHHHHH; others kept).
  void lex_string(char quote) {
    const int start_line = line_;
    std::string out;
    size_t i = pos_ + 1;
    while (true) {
      if (i >= src_.size()) error("the string is not closed");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\' || i + 1 >= src_.size()) {
        out += c;
        ++i;
        continue;
      }
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          check(i + n <= src_.size(), "{}: template line {}: truncated \\{} escape", name_, line_, e);
          const std::string hex = src_.substr(i, n);
          check(hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos,
                "{}: template line {}: bad \\{} escape", name_, line_, e);
          unicode::append_utf8(out, static_cast<char32_t>(std::stoul(hex, nullptr, 16)));
          i += n;
          break;
        }
        default: out += '\\'; out += e;
      }
    }
    tokens_.push_back({Token::Kind::kString, out, start_line});
    advance_to(i + 1);
  }

  std::string src_;
  const std::string& name_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const std::string& name) {
  return Lexer(source, name).run();
}

}  // namespace longtron::text::jinja
