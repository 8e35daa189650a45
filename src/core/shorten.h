// Untrusted text in error messages: a corrupt file may hold a name or value of any length, and a
// message must stay one readable line.
#pragma once
#include <string>
#include <string_view>

namespace longtron {

/// An untrusted value (a name or text read from a file) made safe to put in a message: at most
/// `max` bytes of it, control bytes shown as '?', and when cut the total length appended
/// ("abc... (1000000 bytes)"). Messages never carry a corrupt file's value whole.
inline std::string shorten(std::string_view text, size_t max = 80) {
  std::string out;
  for (char c : text.substr(0, max))
    out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (text.size() > max) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace longtron
