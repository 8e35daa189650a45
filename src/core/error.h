// Errors: every failure a user can cause is a longtron::Error whose message names the file, the
// offset, line or config key, and what was expected. The CLI prints it as one line and exits 1.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace longtron {

/// The one exception type of longtron. `what()` is a complete, user-facing sentence.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// Throws Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

/// Throws Error(message...) unless `condition` holds.
template <typename... Args>
void check(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace longtron
