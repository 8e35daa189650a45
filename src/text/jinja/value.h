// Values of the Jinja interpreter (jinja.h): Python's data model as far as chat templates use it —
// undefined, None, bool, int, float, str, list/tuple, dict (insertion-ordered, string keys),
// namespace and callables — with Python's truth, equality, ordering, str() and repr(), and the
// JSON text of transformers' `tojson` filter (json.dumps with ensure_ascii=False).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"

namespace longtron::text::jinja {

struct Value;
using List = std::vector<Value>;

/// A dict: string keys in insertion order (Python 3.7+ dicts; chat messages are JSON objects).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  /// The value at `key`, nullptr if absent.
  const Value* find(const std::string& key) const;
  /// Sets `key` (replacing in place, else appending).
  void set(const std::string& key, Value value);
};

/// Arguments of a call: positional, then keyword.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

/// A callable value (a global function, a bound method, a macro). `line` is the caller's line.
using Function = std::function<Value(const CallArgs& args, int line)>;

/// One value. Lists and dicts are shared (Python reference semantics); strings are UTF-8.
struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0.0;
  std::string text;  ///< a string's bytes; an undefined value's name (for messages)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Function> function;
  bool tuple = false;      ///< a list written (a, b): repr uses parentheses
  bool namespace_ = false;  ///< a dict made by namespace(): attributes are assignable

  static Value undefined(std::string name = "");
  static Value none();
  static Value from(bool b);
  static Value from(int64_t i);
  static Value from(double d);
  static Value from(std::string s);
  static Value from(const char* s) { return from(std::string(s)); }
  static Value from(List items, bool tuple = false);
  static Value from(std::shared_ptr<Dict> dict);
  static Value from(Function f);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool is_function() const { return kind == Kind::kFunction; }
  double as_double() const;
};

/// Python's bool(v); undefined is false.
bool truthy(const Value& v);
/// Python's ==: numbers compare by value (True == 1), lists and dicts element-wise.
bool equal(const Value& a, const Value& b);
/// Python's <, for numbers, strings (code point order) and lists; throws Error for other pairs.
bool less(const Value& a, const Value& b, int line);
/// Python's str(v) (what `{{ v }}` prints): undefined "", None "None", True "True", floats as
/// repr, containers as repr.
std::string str(const Value& v);
/// Python's repr(v) ('text' quoted as Python quotes it).
std::string repr(const Value& v);
/// Python's type name of v ("str", "dict object" style is the caller's).
std::string type_name(const Value& v);
/// Python's float repr: shortest round-trip digits, exponent form below 1e-4 and from 1e16.
std::string float_repr(double d);

/// json.dumps(v, ensure_ascii=False, indent=indent (< 0: none), separators as Python's defaults
/// for that indent, sort_keys=False). Throws Error for undefined or a function.
std::string to_json(const Value& v, int indent);
/// A JSON document as a Value (objects keep their key order). Depth beyond `max_depth` throws.
Value from_json(const nlohmann::ordered_json& j, int max_depth = 64);
Value from_json(const nlohmann::json& j, int max_depth = 64);

// UTF-8 helpers: Python indexes strings by code point.
/// Byte offsets of each code point start of `s`, plus s.size() at the end.
std::vector<size_t> code_point_offsets(const std::string& s);
/// Number of code points.
size_t code_point_count(const std::string& s);
/// Python's str.strip/lstrip/rstrip: `chars` null = Unicode whitespace, else any of its code points.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
/// True for the code points Python's str.isspace() accepts.
bool py_isspace(char32_t c);

}  // namespace longtron::text::jinja
