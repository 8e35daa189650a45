// The operators, attribute access, methods, filters and tests of the Jinja interpreter (jinja.h),
// with Python's and Jinja2's semantics. Every function names the template line in its errors.
#pragma once
#include <string>

#include "text/jinja/value.h"

namespace longtron::text::jinja {

/// Calls a template callable (a filter like map calls back into tests and filters).
Value call(const Value& callee, const CallArgs& args, int line);
/// obj.name: a dict's key (dict methods first, as Jinja2's getattr), a str/list/dict method bound
/// to obj, or undefined; an attribute of undefined is an error.
Value get_attr(const Value& obj, const std::string& name, int line);
/// obj[key]: list/str index (negative from the end), dict key; undefined when absent.
Value get_item(const Value& obj, const Value& key, int line);
/// obj[start:stop:step] for lists and strings (by code point); null parts are left out.
Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step, int line);
/// a op b for + - * / // % ** ~ == != < <= > >= in, "not in".
Value binary(const std::string& op, const Value& a, const Value& b, int line);
/// A filter applied to `subject`. Throws Error for an unknown filter.
Value apply_filter(const std::string& name, const Value& subject, const CallArgs& args, int line);
/// A test (`x is name(args)`). Throws Error for an unknown test.
bool apply_test(const std::string& name, const Value& subject, const CallArgs& args, int line);
/// Whether `name` is a filter apply_filter knows (checked when a template is parsed, as Jinja2 does).
bool is_filter(const std::string& name);
/// Whether `name` is a test apply_test knows.
bool is_test(const std::string& name);
/// The elements of an iterable: a list's items, a dict's keys, a string's characters; undefined
/// is empty. Throws Error for other values.
List iterate(const Value& v, int line);
/// Error for using undefined `v` (other than printing, testing or truth).
[[noreturn]] void undefined_error(const Value& v, int line);

}  // namespace longtron::text::jinja
