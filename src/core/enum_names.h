// Enum <-> name tables: each enum that a config key, an option or a file spells as a string lists
// its {value, name} pairs once, in one array; the lookups below read that array both ways, so a
// name and its value can never drift apart. The callers keep their own error messages.
#pragma once
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace longtron {

/// One value of an enum and its spelling.
template <class E>
struct EnumName {
  E value;
  const char* name;
};

/// The value spelt `name`, or nullopt.
template <class E, size_t N>
std::optional<E> find_enum(const std::array<EnumName<E>, N>& table, std::string_view name) {
  for (const auto& e : table)
    if (name == e.name) return e.value;
  return std::nullopt;
}

/// The spelling of `value` ("?" for a value the table does not list).
template <class E, size_t N>
const char* enum_name(const std::array<EnumName<E>, N>& table, E value) {
  for (const auto& e : table)
    if (e.value == value) return e.name;
  return "?";
}

/// The names in table order, each between `quote`s, joined by `separator` (e.g. `"a", "b"`).
template <class E, size_t N>
std::string enum_names(const std::array<EnumName<E>, N>& table, std::string_view separator,
                       std::string_view quote = "") {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += separator;
    out.append(quote).append(table[i].name).append(quote);
  }
  return out;
}

}  // namespace longtron
