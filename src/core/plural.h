// Counts in messages: "1 thread", "2 threads" rather than "1 threads".
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace longtron {

/// `n` and `noun`, with an "s" unless n is 1 (regular English plurals only: "file", "thread").
inline std::string count_of(int64_t n, std::string_view noun) {
  return std::to_string(n) + " " + std::string(noun) + (n == 1 ? "" : "s");
}

}  // namespace longtron
