// Operators, attributes, methods, filters and tests of the Jinja interpreter (see
// jinja_builtins.h). Semantics follow Python 3 and Jinja2 3.x (jinja2/filters.py, jinja2/tests.py);
// `tojson` is transformers' (json.dumps with ensure_ascii=False and the given indent).
#include "text/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace longtron::text::jinja {

namespace {

[[noreturn]] void type_error(int line, const std::string& what) { fail("template line {}: {}", line, what); }

// By value: `fallback` is often a temporary.
Value arg(const CallArgs& a, size_t i, const char* key, const Value& fallback) {
  for (const auto& [k, v] : a.kwargs)
    if (k == key) return v;
  return i < a.args.size() ? a.args[i] : fallback;
}

bool has_arg(const CallArgs& a, size_t i, const char* key) {
  if (i < a.args.size()) return true;
  for (const auto& [k, v] : a.kwargs)
    if (k == key) return true;
  return false;
}

const std::string& need_string(const Value& v, int line, const char* what) {
  if (v.is_undefined()) undefined_error(v, line);
  if (!v.is_string()) type_error(line, fmt::format("{} must be a string, got {}", what, type_name(v)));
  return v.text;
}

int64_t need_int(const Value& v, int line, const char* what) {
  if (v.is_undefined()) undefined_error(v, line);
  if (v.kind == Value::Kind::kInt) return v.integer;
  if (v.kind == Value::Kind::kBool) return v.boolean;
  type_error(line, fmt::format("{} must be an integer, got {}", what, type_name(v)));
}

// Python's slice.indices for a sequence of length n.
std::vector<int64_t> slice_indices(int64_t n, const Value* start, const Value* stop, const Value* step,
                                   int line) {
  auto given = [](const Value* v) { return v && !v->is_none() && !v->is_undefined(); };
  const int64_t s = given(step) ? need_int(*step, line, "a slice step") : 1;
  if (s == 0) type_error(line, "slice step cannot be zero");
  auto clamp = [&](const Value* v, int64_t fallback) {
    if (!given(v)) return fallback;
    int64_t i = need_int(*v, line, "a slice index");
    if (i < 0) i += n;
    if (s > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t a = clamp(start, s > 0 ? 0 : n - 1);
  const int64_t b = clamp(stop, s > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = a; s > 0 ? i < b : i > b; i += s) out.push_back(i);
  return out;
}

std::string upper_ascii(std::string s, bool up) {
  for (char& c : s) c = static_cast<char>(up ? std::toupper(static_cast<unsigned char>(c))
                                             : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Python's str.title()/capitalize() for ASCII letters (other bytes kept).
std::string title_case(const std::string& s) {
  std::string out = s;
  bool previous_cased = false;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(previous_cased ? std::tolower(u) : std::toupper(u));
      previous_cased = true;
    } else {
      previous_cased = false;
    }
  }
  return out;
}

std::vector<std::string> py_split(const std::string& s, const Value& sep, int64_t maxsplit, int line) {
  std::vector<std::string> out;
  if (sep.is_none() || sep.is_undefined()) {  // runs of whitespace, no empty parts
    const auto offsets = code_point_offsets(s);
    std::string word;
    size_t i = 0;
    auto space_at = [&](size_t k) {
      const std::string c = s.substr(offsets[k], offsets[k + 1] - offsets[k]);
      return py_strip(c, nullptr, true, true).empty();
    };
    const size_t n = offsets.size() - 1;
    while (i < n) {
      while (i < n && space_at(i)) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(offsets[i]);
        out.push_back(py_strip(rest, nullptr, false, true));
        return out;
      }
      const size_t begin = i;
      while (i < n && !space_at(i)) ++i;
      out.push_back(s.substr(offsets[begin], offsets[i] - offsets[begin]));
    }
    return out;
  }
  const std::string& d = need_string(sep, line, "split's separator");
  if (d.empty()) type_error(line, "split: empty separator");
  size_t at = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t hit = s.find(d, at);
    if (hit == std::string::npos) break;
    out.push_back(s.substr(at, hit - at));
    at = hit + d.size();
  }
  out.push_back(s.substr(at));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `with` between code points (and at both ends)
    const auto offsets = code_point_offsets(s);
    int64_t done = 0;
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (count < 0 || done < count) out += with, ++done;
      out += s.substr(offsets[i], offsets[i + 1] - offsets[i]);
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t at = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, at);
    if (hit == std::string::npos) break;
    out += s.substr(at, hit - at) + with;
    at = hit + old.size();
    ++done;
  }
  return out + s.substr(at);
}

Value string_list(const std::vector<std::string>& parts) {
  List items;
  for (const auto& p : parts) items.push_back(Value::from(p));
  return Value::from(std::move(items));
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, int line) {
  auto one = [&](const Value& a) {
    const std::string& t = need_string(a, line, prefix ? "startswith's argument" : "endswith's argument");
    if (t.size() > s.size()) return false;
    return prefix ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  if (affix.is_list()) return std::any_of(affix.list->begin(), affix.list->end(), one);
  return one(affix);
}

Value method(const Value& self, const std::string& name, const CallArgs& a, int line) {
  const Value none = Value::none();
  if (self.is_string()) {
    const std::string& s = self.text;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value& chars = arg(a, 0, "chars", none);
      const std::string* set = chars.is_none() ? nullptr : &need_string(chars, line, "strip's argument");
      return Value::from(py_strip(s, set, name != "rstrip", name != "lstrip"));
    }
    if (name == "startswith" || name == "endswith")
      return Value::from(affix_match(s, arg(a, 0, "prefix", none), name == "startswith", line));
    if (name == "split") {
      const Value& maxsplit = arg(a, 1, "maxsplit", Value::from(int64_t{-1}));
      return string_list(py_split(s, arg(a, 0, "sep", none), need_int(maxsplit, line, "maxsplit"), line));
    }
    if (name == "replace") {
      const Value& count = arg(a, 2, "count", Value::from(int64_t{-1}));
      return Value::from(py_replace(s, need_string(arg(a, 0, "old", none), line, "replace's argument"),
                                    need_string(arg(a, 1, "new", none), line, "replace's argument"),
                                    need_int(count, line, "replace's count")));
    }
    if (name == "upper" || name == "lower") return Value::from(upper_ascii(s, name == "upper"));
    if (name == "title") return Value::from(title_case(s));
    if (name == "capitalize") {
      std::string out = upper_ascii(s, false);
      if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
      return Value::from(out);
    }
    if (name == "find" || name == "count") {
      const std::string t = need_string(arg(a, 0, "sub", none), line, "the argument");
      if (name == "find") {
        const size_t at = s.find(t);
        if (at == std::string::npos) return Value::from(int64_t{-1});
        return Value::from(static_cast<int64_t>(code_point_count(s.substr(0, at))));
      }
      if (t.empty()) return Value::from(static_cast<int64_t>(code_point_count(s) + 1));
      int64_t n = 0;
      for (size_t at = s.find(t); at != std::string::npos; at = s.find(t, at + t.size())) ++n;
      return Value::from(n);
    }
    if (name == "join") {
      std::string out;
      bool first = true;
      for (const auto& item : iterate(arg(a, 0, "iterable", none), line)) {
        if (!first) out += s;
        first = false;
        out += need_string(item, line, "join's items");
      }
      return Value::from(out);
    }
    if (name == "splitlines") {
      std::vector<std::string> parts = py_split(s, Value::from("\n"), -1, line);
      if (!parts.empty() && parts.back().empty()) parts.pop_back();
      return string_list(parts);
    }
  } else if (self.is_dict()) {
    const Dict& d = *self.dict;
    if (name == "get") {
      const Value* found = d.find(need_string(arg(a, 0, "key", none), line, "get's key"));
      return found ? *found : arg(a, 1, "default", none);
    }
    List out;
    for (const auto& [k, v] : d.items) {
      if (name == "keys") out.push_back(Value::from(k));
      else if (name == "values") out.push_back(v);
      else out.push_back(Value::from(List{Value::from(k), v}, true));
    }
    return Value::from(std::move(out));
  }
  type_error(line, fmt::format("'{}' object has no method '{}'", type_name(self), name));
}

bool is_method(const Value& v, const std::string& name) {
  static const std::vector<std::string> str_methods = {
      "strip", "lstrip", "rstrip", "startswith", "endswith", "split", "replace", "upper", "lower",
      "title", "capitalize", "find", "count", "join", "splitlines"};
  static const std::vector<std::string> dict_methods = {"get", "keys", "values", "items"};
  const auto& names = v.is_string() ? str_methods : dict_methods;
  if (!v.is_string() && !(v.is_dict() && !v.namespace_)) return false;
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Bounds on the values a template builds, so that a hostile template (a string doubled in a loop,
// "x" * 10**12) fails with a message instead of exhausting memory.
constexpr size_t kMaxText = size_t{1} << 28;        // bytes in one string (256 MiB)
constexpr size_t kMaxListItems = size_t{1} << 20;   // items in one list (range() gives at most 10^6)

std::string checked_concat(const std::string& a, const std::string& b, int line) {
  check(a.size() + b.size() <= kMaxText, "template line {}: a string longer than {} bytes", line, kMaxText);
  return a + b;
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  const bool ints = a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat;
  auto as_int = [](const Value& v) { return v.kind == Value::Kind::kBool ? int64_t{v.boolean} : v.integer; };
  if (ints) {
    const int64_t x = as_int(a), y = as_int(b);
    if ((op == "//" || op == "%" || op == "/") && y == 0) type_error(line, "division by zero");
    // Python's integers do not overflow; a result outside int64 is refused rather than wrapped.
    int64_t r = 0;
    auto overflow = [&] { type_error(line, fmt::format("integer overflow in {} {} {}", x, op, y)); };
    if (op == "+") return Value::from(__builtin_add_overflow(x, y, &r) ? (overflow(), r) : r);
    if (op == "-") return Value::from(__builtin_sub_overflow(x, y, &r) ? (overflow(), r) : r);
    if (op == "*") return Value::from(__builtin_mul_overflow(x, y, &r) ? (overflow(), r) : r);
    if (op == "/") return Value::from(static_cast<double>(x) / static_cast<double>(y));
    if ((op == "//" || op == "%") && x == INT64_MIN && y == -1) {
      if (op == "%") return Value::from(int64_t{0});
      overflow();
    }
    if (op == "//") return Value::from(floor_div(x, y));
    if (op == "%") return Value::from(x - floor_div(x, y) * y);
    if (op == "**") {
      if (y < 0) return Value::from(std::pow(static_cast<double>(x), static_cast<double>(y)));
      r = 1;  // square-and-multiply: at most 63 squarings
      int64_t base = x;
      for (int64_t e = y; e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) overflow();
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) overflow();
      }
      return Value::from(r);
    }
  }
  const double x = a.as_double(), y = b.as_double();
  if ((op == "//" || op == "%" || op == "/") && y == 0) type_error(line, "float division by zero");
  if (op == "+") return Value::from(x + y);
  if (op == "-") return Value::from(x - y);
  if (op == "*") return Value::from(x * y);
  if (op == "/") return Value::from(x / y);
  if (op == "//") return Value::from(std::floor(x / y));
  if (op == "%") return Value::from(x - std::floor(x / y) * y);
  return Value::from(std::pow(x, y));
}

}  // namespace

void undefined_error(const Value& v, int line) {
  fail("template line {}: {}", line, v.text.empty() ? "a value is undefined" : v.text);
}

List iterate(const Value& v, int line) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return *v.list;
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, item] : v.dict->items) keys.push_back(Value::from(k));
      return keys;
    }
    case Value::Kind::kString: {
      const auto offsets = code_point_offsets(v.text);
      List chars;
      for (size_t i = 0; i + 1 < offsets.size(); ++i)
        chars.push_back(Value::from(v.text.substr(offsets[i], offsets[i + 1] - offsets[i])));
      return chars;
    }
    default: type_error(line, fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

Value call(const Value& callee, const CallArgs& args, int line) {
  if (callee.is_undefined()) undefined_error(callee, line);
  if (!callee.is_function()) type_error(line, fmt::format("'{}' object is not callable", type_name(callee)));
  return (*callee.function)(args, line);
}

Value get_attr(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) undefined_error(obj, line);
  if (is_method(obj, name)) {
    Value self = obj;
    return Value::from(Function([self, name](const CallArgs& a, int at) { return method(self, name, a, at); }));
  }
  if (obj.is_dict()) {
    if (const Value* found = obj.dict->find(name)) return *found;
  }
  std::string owner = type_name(obj) + " object";
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", owner, name));
}

Value get_item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) undefined_error(obj, line);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* found = obj.dict->find(key.text)) return *found;
    return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(obj), key.text));
  }
  if ((obj.is_list() || obj.is_string()) && (key.kind == Value::Kind::kInt || key.kind == Value::Kind::kBool)) {
    const std::vector<size_t> offsets = obj.is_string() ? code_point_offsets(obj.text) : std::vector<size_t>{};
    const auto n = static_cast<int64_t>(obj.is_list() ? obj.list->size() : offsets.size() - 1);
    int64_t i = need_int(key, line, "an index");
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(fmt::format("{} index out of range", type_name(obj)));
    if (obj.is_list()) return (*obj.list)[static_cast<size_t>(i)];
    return Value::from(obj.text.substr(offsets[i], offsets[i + 1] - offsets[i]));
  }
  if (key.is_string()) return get_attr(obj, key.text, line);
  return Value::undefined(fmt::format("'{}' object has no item {}", type_name(obj), repr(key)));
}

Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step, int line) {
  if (obj.is_undefined()) undefined_error(obj, line);
  if (obj.is_list()) {
    List out;
    for (const int64_t i : slice_indices(static_cast<int64_t>(obj.list->size()), start, stop, step, line))
      out.push_back((*obj.list)[static_cast<size_t>(i)]);
    return Value::from(std::move(out), obj.tuple);
  }
  if (obj.is_string()) {
    const auto offsets = code_point_offsets(obj.text);
    std::string out;
    for (const int64_t i : slice_indices(static_cast<int64_t>(offsets.size() - 1), start, stop, step, line))
      out += obj.text.substr(offsets[i], offsets[i + 1] - offsets[i]);
    return Value::from(out);
  }
  type_error(line, fmt::format("'{}' object is not subscriptable", type_name(obj)));
}

Value binary(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return Value::from(equal(a, b));
  if (op == "!=") return Value::from(!equal(a, b));
  if (op == "~") return Value::from(checked_concat(str(a), str(b), line));
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      found = b.text.find(need_string(a, line, "the left operand of 'in <string>'")) != std::string::npos;
    } else if (b.is_dict()) {
      found = a.is_string() && b.dict->find(a.text) != nullptr;
    } else {
      for (const auto& item : iterate(b, line)) found = found || equal(a, item);
    }
    return Value::from(found != (op == "not in"));
  }
  if (a.is_undefined()) undefined_error(a, line);
  if (b.is_undefined()) undefined_error(b, line);
  if (op == "<") return Value::from(less(a, b, line));
  if (op == ">") return Value::from(less(b, a, line));
  if (op == "<=") return Value::from(!less(b, a, line));
  if (op == ">=") return Value::from(!less(a, b, line));
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b, line);
  if (op == "+" && a.is_string() && b.is_string()) return Value::from(checked_concat(a.text, b.text, line));
  if (op == "+" && a.is_list() && b.is_list() && a.tuple == b.tuple) {
    check(a.list->size() + b.list->size() <= kMaxListItems, "template line {}: a list longer than {} items",
          line, kMaxListItems);
    List out = *a.list;
    out.insert(out.end(), b.list->begin(), b.list->end());
    return Value::from(std::move(out), a.tuple);
  }
  if (op == "*" && (a.is_string() || a.is_list()) && b.kind == Value::Kind::kInt) {
    const size_t unit = a.is_string() ? a.text.size() : a.list->size();
    const size_t limit = a.is_string() ? kMaxText : kMaxListItems;
    if (b.integer <= 0 || unit == 0) return a.is_string() ? Value::from(std::string()) : Value::from(List{}, a.tuple);
    check(static_cast<uint64_t>(b.integer) <= limit / unit, "template line {}: {} * {} would hold more than {} {}",
          line, type_name(a), b.integer, limit, a.is_string() ? "bytes" : "items");
    if (a.is_string()) {
      std::string out;
      out.reserve(unit * static_cast<size_t>(b.integer));
      for (int64_t i = 0; i < b.integer; ++i) out += a.text;
      return Value::from(out);
    }
    List out;
    for (int64_t i = 0; i < b.integer; ++i) out.insert(out.end(), a.list->begin(), a.list->end());
    return Value::from(std::move(out), a.tuple);
  }
  type_error(line, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a),
                               type_name(b)));
}

namespace {

CallArgs rest_args(const CallArgs& a, size_t from) {
  CallArgs out;
  if (from < a.args.size()) out.args.assign(a.args.begin() + static_cast<std::ptrdiff_t>(from), a.args.end());
  out.kwargs = a.kwargs;
  return out;
}

// Attribute "a.b" (dots walk into dicts; digits index lists), as Jinja2's make_attrgetter.
Value attribute_path(const Value& v, const std::string& path, int line) {
  Value out = v;
  size_t at = 0;
  while (true) {
    const size_t dot = path.find('.', at);
    const std::string part = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    out = digits ? get_item(out, Value::from(static_cast<int64_t>(std::stoll(part))), line)
                 : get_item(out, Value::from(part), line);
    if (dot == std::string::npos) return out;
    at = dot + 1;
  }
}

Value select_items(const Value& subject, const CallArgs& a, int line, bool by_attribute, bool keep) {
  List out;
  const size_t test_at = by_attribute ? 1 : 0;
  const std::string attribute =
      by_attribute ? need_string(arg(a, 0, "attribute", Value()), line, "the attribute") : "";
  const bool has_test = a.args.size() > test_at;
  const std::string test = has_test ? need_string(a.args[test_at], line, "the test name") : "";
  const CallArgs test_args = rest_args(a, test_at + 1);
  for (const auto& item : iterate(subject, line)) {
    const Value v = by_attribute ? attribute_path(item, attribute, line) : item;
    const bool pass = has_test ? apply_test(test, v, test_args, line) : truthy(v);
    if (pass == keep) out.push_back(item);
  }
  return Value::from(std::move(out));
}

std::string indent_text(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::string out;
  size_t at = 0;
  bool is_first = true;
  while (true) {
    const size_t nl = s.find('\n', at);
    const std::string line = s.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    const bool add = (is_first ? first : true) && (blank || !line.empty());
    out += (add ? pad : "") + line;
    if (nl == std::string::npos) break;
    out += '\n';
    at = nl + 1;
    is_first = false;
  }
  return out;
}

}  // namespace

bool is_filter(const std::string& name) {
  static const std::vector<std::string> names = {
      "safe", "string", "trim", "upper", "lower", "title", "capitalize", "default", "d", "tojson",
      "indent", "length", "count", "first", "last", "list", "reverse", "join", "replace", "int",
      "float", "abs", "items", "map", "select", "reject", "selectattr", "rejectattr", "unique",
      "sort", "sum", "min", "max", "round", "dictsort"};
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool is_test(const std::string& name) {
  static const std::vector<std::string> names = {
      "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number",
      "string", "mapping", "iterable", "sequence", "callable", "sameas", "eq", "equalto", "==",
      "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "in",
      "odd", "even", "divisibleby", "lower", "upper"};
  return std::find(names.begin(), names.end(), name) != names.end();
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& a, int line) {
  const Value none = Value::none();
  if (name == "safe") return v;
  if (name == "string") return Value::from(str(v));
  if (name == "trim") {
    const Value& chars = arg(a, 0, "chars", none);
    return Value::from(py_strip(str(v), chars.is_none() ? nullptr : &need_string(chars, line, "trim's chars"),
                                true, true));
  }
  if (name == "upper" || name == "lower") return Value::from(upper_ascii(str(v), name == "upper"));
  if (name == "title") return Value::from(title_case(str(v)));
  if (name == "capitalize") return method(Value::from(str(v)), "capitalize", {}, line);
  if (name == "default" || name == "d") {
    const bool boolean = truthy(arg(a, 1, "boolean", Value::from(false)));
    if (v.is_undefined() || (boolean && !truthy(v))) return arg(a, 0, "default_value", Value::from(""));
    return v;
  }
  if (name == "tojson") {
    const Value& indent = arg(a, 0, "indent", none);
    check(!has_arg(a, 99, "separators"), "template line {}: tojson: separators are not supported", line);
    if (truthy(arg(a, 99, "ensure_ascii", Value::from(false))))
      type_error(line, "tojson: ensure_ascii=True is not supported");
    const int64_t n = indent.is_none() ? -1 : need_int(indent, line, "indent");
    check(n >= -4096 && n <= 4096, "template line {}: tojson indent {} is outside [-4096, 4096]", line, n);
    return Value::from(to_json(v, static_cast<int>(n)));
  }
  if (name == "indent") {
    const Value& width = arg(a, 0, "width", Value::from(int64_t{4}));
    const int64_t w = width.is_string() ? 0 : need_int(width, line, "width");
    check(w <= 4096, "template line {}: indent width {} is larger than 4096", line, w);
    const std::string pad = width.is_string() ? width.text : std::string(static_cast<size_t>(std::max<int64_t>(w, 0)), ' ');
    return Value::from(indent_text(str(v), pad, truthy(arg(a, 1, "first", Value::from(false))),
                                   truthy(arg(a, 2, "blank", Value::from(false)))));
  }
  if (v.is_undefined() && name != "list" && name != "join" && name != "length" && name != "count")
    undefined_error(v, line);
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::from(static_cast<int64_t>(code_point_count(v.text)));
    if (v.is_dict()) return Value::from(static_cast<int64_t>(v.dict->items.size()));
    if (v.is_list()) return Value::from(static_cast<int64_t>(v.list->size()));
    if (v.is_undefined()) return Value::from(int64_t{0});
    type_error(line, fmt::format("object of type '{}' has no len()", type_name(v)));
  }
  if (name == "first" || name == "last") {
    const List items = iterate(v, line);
    if (items.empty()) return Value::undefined("No first item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::from(iterate(v, line));
  if (name == "reverse") {
    if (v.is_string()) {
      const Value step = Value::from(int64_t{-1});
      return get_slice(v, nullptr, nullptr, &step, line);
    }
    List items = iterate(v, line);
    std::reverse(items.begin(), items.end());
    return Value::from(std::move(items));
  }
  if (name == "join") {
    const std::string sep = str(arg(a, 0, "d", Value::from("")));
    const bool by_attribute = has_arg(a, 1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& item : iterate(v, line)) {
      if (!first) out += sep;
      first = false;
      out += str(by_attribute ? attribute_path(item, str(arg(a, 1, "attribute", none)), line) : item);
    }
    return Value::from(out);
  }
  if (name == "replace") {
    const Value& count = arg(a, 2, "count", none);
    return Value::from(py_replace(str(v), str(arg(a, 0, "old", none)), str(arg(a, 1, "new", none)),
                                  count.is_none() ? -1 : need_int(count, line, "count")));
  }
  if (name == "int") {
    if (v.kind == Value::Kind::kInt || v.kind == Value::Kind::kBool) return Value::from(need_int(v, line, "int"));
    if (v.kind == Value::Kind::kFloat) return Value::from(static_cast<int64_t>(v.real));
    try {
      size_t used = 0;
      const std::string t = py_strip(str(v), nullptr, true, true);
      const int64_t i = std::stoll(t, &used);
      if (used == t.size()) return Value::from(i);
    } catch (const std::exception&) {
    }
    return arg(a, 0, "default", Value::from(int64_t{0}));
  }
  if (name == "float") {
    if (v.is_number()) return Value::from(v.as_double());
    try {
      return Value::from(std::stod(str(v)));
    } catch (const std::exception&) {
      return arg(a, 0, "default", Value::from(0.0));
    }
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::kFloat) return Value::from(std::fabs(v.real));
    return Value::from(std::abs(need_int(v, line, "abs")));
  }
  if (name == "items") {
    if (!v.is_dict()) type_error(line, "items: not a mapping");
    return method(v, "items", {}, line);
  }
  if (name == "map") {
    List out;
    const bool by_attribute = has_arg(a, 99, "attribute");
    for (const auto& item : iterate(v, line)) {
      if (by_attribute) {
        Value got = attribute_path(item, need_string(arg(a, 99, "attribute", none), line, "attribute"), line);
        out.push_back(got.is_undefined() && has_arg(a, 99, "default") ? arg(a, 99, "default", none) : got);
      } else {
        if (a.args.empty()) type_error(line, "map: give a filter name or attribute=");
        out.push_back(apply_filter(need_string(a.args[0], line, "the filter name"), item, rest_args(a, 1), line));
      }
    }
    return Value::from(std::move(out));
  }
  if (name == "select" || name == "reject") return select_items(v, a, line, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return select_items(v, a, line, true, name == "selectattr");
  if (name == "unique") {
    List out;
    for (const auto& item : iterate(v, line))
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equal(o, item); })) out.push_back(item);
    return Value::from(std::move(out));
  }
  if (name == "sort") {
    List items = iterate(v, line);
    const bool reverse = truthy(arg(a, 0, "reverse", Value::from(false)));
    const bool by_attribute = has_arg(a, 2, "attribute");
    const std::string attribute = by_attribute ? str(arg(a, 2, "attribute", none)) : "";
    auto key = [&](const Value& x) { return by_attribute ? attribute_path(x, attribute, line) : x; };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return reverse ? less(key(y), key(x), line) : less(key(x), key(y), line);
    });
    return Value::from(std::move(items));
  }
  if (name == "sum") {
    Value total = arg(a, 1, "start", Value::from(int64_t{0}));
    for (const auto& item : iterate(v, line)) total = binary("+", total, item, line);
    return total;
  }
  if (name == "min" || name == "max") {
    const List items = iterate(v, line);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    Value best = items[0];
    for (const auto& item : items)
      if (name == "min" ? less(item, best, line) : less(best, item, line)) best = item;
    return best;
  }
  if (name == "round") {
    const int64_t digits = need_int(arg(a, 0, "precision", Value::from(int64_t{0})), line, "precision");
    const double scale = std::pow(10.0, static_cast<double>(digits));
    return Value::from(std::nearbyint(v.as_double() * scale) / scale);
  }
  if (name == "dictsort") {
    if (!v.is_dict()) type_error(line, "dictsort: not a mapping");
    List items = iterate(method(v, "items", {}, line), line);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return less((*x.list)[0], (*y.list)[0], line);
    });
    return Value::from(std::move(items));
  }
  type_error(line, fmt::format("no filter named '{}'", name));
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& a, int line) {
  const Value none = Value::none();
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind == K::kBool;
  if (name == "true") return v.kind == K::kBool && v.boolean;
  if (name == "false") return v.kind == K::kBool && !v.boolean;
  if (name == "integer") return v.kind == K::kInt;
  if (name == "float") return v.kind == K::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.namespace_;
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.namespace_);
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.namespace_);
  if (name == "callable") return v.is_function();
  if (name == "sameas") {
    const Value& o = arg(a, 0, "other", none);
    if (v.kind != o.kind) return false;
    if (v.is_list()) return v.list == o.list;
    if (v.is_dict()) return v.dict == o.dict;
    return equal(v, o);
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, arg(a, 0, "other", none));
  if (name == "ne" || name == "!=") return !equal(v, arg(a, 0, "other", none));
  if (name == "lt" || name == "lessthan" || name == "<") return truthy(binary("<", v, arg(a, 0, "other", none), line));
  if (name == "le" || name == "<=") return truthy(binary("<=", v, arg(a, 0, "other", none), line));
  if (name == "gt" || name == "greaterthan" || name == ">") return truthy(binary(">", v, arg(a, 0, "other", none), line));
  if (name == "ge" || name == ">=") return truthy(binary(">=", v, arg(a, 0, "other", none), line));
  if (name == "in") return truthy(binary("in", v, arg(a, 0, "seq", none), line));
  if (name == "odd" || name == "even") return (need_int(v, line, "the value") % 2 != 0) == (name == "odd");
  if (name == "divisibleby") return need_int(v, line, "the value") % need_int(arg(a, 0, "num", none), line, "num") == 0;
  if (name == "lower" || name == "upper") return str(v) == upper_ascii(str(v), name == "upper");
  type_error(line, fmt::format("no test named '{}'", name));
}

}  // namespace longtron::text::jinja
