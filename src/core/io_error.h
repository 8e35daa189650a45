// The cause of a failed write, for messages: "No space left on device" rather than only the path.
#pragma once
#include <cerrno>
#include <cstring>
#include <string>

namespace longtron {

/// strerror text of `err` (an errno saved right after the failing call, e.g. ENOSPC → "No space
/// left on device"); "I/O error" when the library left no errno (err == 0).
inline std::string io_error_text(int err = errno) {
  return err != 0 ? std::string(std::strerror(err)) : std::string("I/O error");
}

}  // namespace longtron
