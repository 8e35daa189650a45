// A small Jinja2 interpreter for chat templates (the `chat_template` of a Hugging Face
// tokenizer_config.json), rendering as transformers' apply_chat_template does: Jinja2 semantics
// (jinja2 3.x) in an immutable sandbox with trim_blocks and lstrip_blocks, the loop controls
// extension (break/continue), transformers' `tojson`, `raise_exception` and `strftime_now`.
//
// Supported: {{ }}, {% if/elif/else %}, {% for a[, b] in x [if c] %} with loop.* and {% else %},
// {% set %} (names, a.b on namespaces, block set), {% macro %}, {% generation %}, comments,
// whitespace control; literals, lists, tuples, dicts, attribute/item access, slicing, calls,
// filters, tests, `in`, `not`, `and`, `or`, comparisons, arithmetic, `~`, conditional expressions;
// the str/dict methods and filters chat templates use (jinja_builtins.cpp lists them). Undefined
// follows Jinja2's default Undefined: prints as "", is false, iterates as empty, and any other use
// (an attribute, arithmetic) is an error.
#pragma once
#include <ctime>
#include <memory>
#include <string>

#include "core/error.h"
#include "text/jinja/value.h"

namespace longtron::text::jinja {

struct Stmt;

/// What `raise_exception(message)` throws: the template refuses its input.
class Raised : public Error {
 public:
  Raised(const std::string& template_name, int line, std::string message);
  int line;             ///< template line of the raise_exception call
  std::string message;  ///< the template's own message
};

/// A parsed template. Rendering is const and thread-safe (each render has its own state).
class Template {
 public:
  /// Parses `source`; `name` names the template in errors. Throws Error naming the line of a
  /// syntax error.
  static Template parse(const std::string& source, const std::string& name);
  /// The template rendered with `variables` (plus the globals range, namespace, dict,
  /// raise_exception and strftime_now, which formats `now`: the current time when now < 0).
  /// Throws Raised for raise_exception, Error naming the line for any other failure.
  std::string render(const Dict& variables, std::time_t now = -1) const;
  const std::string& name() const { return name_; }

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
  std::string name_;
};

}  // namespace longtron::text::jinja
