// Jinja values (see jinja_value.h): Python's semantics for the operations templates use.
#include "text/jinja/value.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace longtron::text::jinja {

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items)
    if (k == key) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

Value Value::undefined(std::string name) {
  Value v;
  v.text = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::from(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.boolean = b;
  return v;
}
Value Value::from(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.integer = i;
  return v;
}
Value Value::from(double d) {
  Value v;
  v.kind = Kind::kFloat;
  v.real = d;
  return v;
}
Value Value::from(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.text = std::move(s);
  return v;
}
Value Value::from(List items, bool tuple) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<List>(std::move(items));
  v.tuple = tuple;
  return v;
}
Value Value::from(std::shared_ptr<Dict> dict) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::move(dict);
  return v;
}
Value Value::from(Function f) {
  Value v;
  v.kind = Kind::kFunction;
  v.function = std::make_shared<Function>(std::move(f));
  return v;
}

double Value::as_double() const {
  switch (kind) {
    case Kind::kBool: return boolean ? 1.0 : 0.0;
    case Kind::kInt: return static_cast<double>(integer);
    case Kind::kFloat: return real;
    default: return 0.0;
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.boolean;
    case Value::Kind::kInt: return v.integer != 0;
    case Value::Kind::kFloat: return v.real != 0.0;
    case Value::Kind::kString: return !v.text.empty();
    case Value::Kind::kList: return !v.list->empty();
    case Value::Kind::kDict: return !v.dict->items.empty();
    case Value::Kind::kFunction: return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat)
      return (a.kind == Value::Kind::kBool ? a.boolean : a.integer) ==
             (b.kind == Value::Kind::kBool ? b.boolean : b.integer);
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.text == b.text;
    case Value::Kind::kList: {
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kFunction: return a.function == b.function;
    default: return false;
  }
}

bool less(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat)
      return (a.kind == Value::Kind::kBool ? a.boolean : a.integer) <
             (b.kind == Value::Kind::kBool ? b.boolean : b.integer);
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.text < b.text;  // UTF-8 byte order = code point order
  if (a.is_list() && b.is_list()) {
    const auto& x = *a.list;
    const auto& y = *b.list;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equal(x[i], y[i])) continue;
      return less(x[i], y[i], line);
    }
    return x.size() < y.size();
  }
  fail("template line {}: '<' not supported between instances of '{}' and '{}'", line, type_name(a),
       type_name(b));
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList: return v.tuple ? "tuple" : "list";
    case Value::Kind::kDict: return v.namespace_ ? "Namespace" : "dict";
    case Value::Kind::kFunction: return "function";
  }
  return "object";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out as Python's repr does.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string out;
  if (exponent < -4 || exponent >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  } else if (exponent < 0) {
    out = "0.";
    out.append(static_cast<size_t>(-exponent - 1), '0');
    out += digits;
  } else {
    const auto point = static_cast<size_t>(exponent + 1);
    if (digits.size() <= point) out = digits + std::string(point - digits.size(), '0') + ".0";
    else out = digits.substr(0, point) + "." + digits.substr(point);
  }
  return negative ? "-" + out : out;
}

namespace {

// Python's repr of a str: single quotes unless the text has ' and no ".
std::string repr_string(const std::string& s) {
  const bool double_quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = double_quote ? '"' : '\'';
  std::string out(1, q);
  for (const unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) out += std::string("\\") + q;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out + q;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (const unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

void json_dump(const Value& v, int indent, int level, std::string& out) {
  auto newline = [&](int at) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * at), ' ');
  };
  const char* item_separator = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.boolean ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.integer); return;
    case Value::Kind::kFloat:
      out += std::isnan(v.real) ? "NaN" : std::isinf(v.real) ? (v.real > 0 ? "Infinity" : "-Infinity")
                                                             : float_repr(v.real);
      return;
    case Value::Kind::kString: json_string(v.text, out); return;
    case Value::Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += item_separator;
        newline(level + 1);
        json_dump((*v.list)[i], indent, level + 1, out);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, item] : v.dict->items) {
        if (!first) out += item_separator;
        first = false;
        newline(level + 1);
        json_string(k, out);
        out += ": ";
        json_dump(item, indent, level + 1, out);
      }
      newline(level);
      out += '}';
      return;
    }
    default: fail("tojson: Object of type {} is not JSON serializable", type_name(v));
  }
}

template <typename Json>
Value json_to_value(const Json& j, int depth) {
  check(depth > 0, "a JSON value nests too deeply for a chat template");
  if (j.is_null()) return Value::none();
  if (j.is_boolean()) return Value::from(j.template get<bool>());
  if (j.is_number_integer()) return Value::from(j.template get<int64_t>());
  if (j.is_number()) return Value::from(j.template get<double>());
  if (j.is_string()) return Value::from(j.template get<std::string>());
  if (j.is_array()) {
    List items;
    for (const auto& item : j) items.push_back(json_to_value(item, depth - 1));
    return Value::from(std::move(items));
  }
  auto dict = std::make_shared<Dict>();
  for (auto it = j.begin(); it != j.end(); ++it) dict->set(it.key(), json_to_value(it.value(), depth - 1));
  return Value::from(std::move(dict));
}

}  // namespace

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString: return repr_string(v.text);
    case Value::Kind::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) out += (i ? ", " : "") + repr((*v.list)[i]);
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = v.namespace_ ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, item] : v.dict->items) {
        out += (first ? "" : ", ") + repr_string(k) + ": " + repr(item);
        first = false;
      }
      return out + (v.namespace_ ? "}>" : "}");
    }
    default: return str(v);
  }
}

std::string str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.boolean ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.integer);
    case Value::Kind::kFloat: return float_repr(v.real);
    case Value::Kind::kString: return v.text;
    case Value::Kind::kFunction: return "<function>";
    default: return repr(v);
  }
}

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_dump(v, indent, 0, out);
  return out;
}

Value from_json(const nlohmann::ordered_json& j, int max_depth) { return json_to_value(j, max_depth); }
Value from_json(const nlohmann::json& j, int max_depth) { return json_to_value(j, max_depth); }

std::vector<size_t> code_point_offsets(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  out.push_back(s.size());
  return out;
}

size_t code_point_count(const std::string& s) { return code_point_offsets(s).size() - 1; }

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

namespace {

char32_t decode_at(const std::string& s, size_t begin, size_t end) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  char32_t c = p[begin];
  const size_t n = end - begin;
  if (n == 1) return c;
  c &= n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07;
  for (size_t i = begin + 1; i < end; ++i) c = (c << 6) | (p[i] & 0x3F);
  return c;
}

}  // namespace

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const auto offsets = code_point_offsets(s);
  const size_t n = offsets.size() - 1;
  std::vector<char32_t> set;
  if (chars) {
    const auto co = code_point_offsets(*chars);
    for (size_t i = 0; i + 1 < co.size(); ++i) set.push_back(decode_at(*chars, co[i], co[i + 1]));
  }
  auto strip_it = [&](size_t i) {
    const char32_t c = decode_at(s, offsets[i], offsets[i + 1]);
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c);
  };
  size_t begin = 0, end = n;
  if (left)
    while (begin < end && strip_it(begin)) ++begin;
  if (right)
    while (end > begin && strip_it(end - 1)) --end;
  return s.substr(offsets[begin], offsets[end] - offsets[begin]);
}

}  // namespace longtron::text::jinja
