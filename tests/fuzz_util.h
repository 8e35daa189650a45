// Seeded random mutations of valid files, for the reader fuzz tests: truncations, bit flips, bytes
// and integers set to edge values, deletions, insertions, duplicated chunks, deep nesting and
// numbers rewritten as edge-case decimals. The same seed gives the same cases on every machine.
#pragma once
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "core/error.h"

namespace longtron::testing {

/// One mutated file and where the mutation happened (for messages and for oracles that know
/// which region a change may alter).
struct Mutation {
  std::string bytes;
  std::string kind;   ///< "truncate", "bitflip", ... (reported when a case fails)
  size_t offset = 0;  ///< first byte changed
  bool in_place = false;  ///< same length, bytes changed only at [offset, offset + width)
  size_t width = 0;
};

/// Draws mutations from a seeded generator.
class Mutator {
 public:
  explicit Mutator(uint64_t seed) : gen_(seed) {}

  /// A random mutation of `in` whose first changed byte lies in [lo, hi) (clamped to the input).
  Mutation mutate(const std::string& in, size_t lo = 0, size_t hi = std::string::npos) {
    hi = std::min(hi, in.size());
    lo = std::min(lo, hi);
    Mutation m{in, "", 0, false, 0};
    const size_t at = lo + (hi > lo ? below(hi - lo) : 0);
    m.offset = at;
    switch (below(11)) {
      case 0:
        m.kind = "truncate";
        m.bytes.resize(at);
        break;
      case 1:
      case 2: {
        m.kind = "bitflip";
        if (at < m.bytes.size()) {
          m.bytes[at] = char(uint8_t(m.bytes[at]) ^ (1u << below(8)));
          m.in_place = true;
          m.width = 1;
        }
        break;
      }
      case 3: {
        m.kind = "edge byte";
        static constexpr char kEdges[] = {'\0', '\xff', '\x7f', '\x80', '0', '9', '-', '[',
                                          '{',  '"',    ',',    '\n',   ' ', '.', 'e', ']'};
        if (at < m.bytes.size()) {
          m.bytes[at] = kEdges[below(sizeof(kEdges))];
          m.in_place = true;
          m.width = 1;
        }
        break;
      }
      case 4: {
        m.kind = "edge integer";
        static constexpr uint64_t kValues[] = {0,
                                               1,
                                               ~uint64_t{0},
                                               0x7fffffffu,
                                               0x80000000u,
                                               0xffffffffu,
                                               0x7fffffffffffffffu,
                                               0x8000000000000000u,
                                               0x7ffffffffffffffeu,
                                               uint64_t{1} << 62,
                                               uint64_t{1} << 32};
        uint64_t v = kValues[below(std::size(kValues))];
        if (below(4) == 0) v = in.size() + below(3) - 1;  // around the file size
        const size_t width = below(2) ? 8 : 4;
        if (at + width <= m.bytes.size()) {
          std::memcpy(m.bytes.data() + at, &v, width);
          m.in_place = true;
          m.width = width;
        }
        break;
      }
      case 5:
        m.kind = "delete";
        m.bytes.erase(at, 1 + below(16));
        break;
      case 6: {
        m.kind = "insert";
        std::string extra(1 + below(16), '\0');
        for (auto& c : extra) c = char(below(256));
        m.bytes.insert(at, extra);
        break;
      }
      case 7: {
        m.kind = "duplicate chunk";
        const size_t from = below(in.size() + 1);
        m.bytes.insert(at, in.substr(from, 1 + below(32)));
        break;
      }
      case 8: {
        m.kind = "append";
        m.bytes.append(1 + below(16), char(below(256)));
        m.offset = in.size();
        break;
      }
      case 9: {
        m.kind = "deep nesting";
        static constexpr size_t kDepths[] = {70, 1000, 100000};
        const char open = "[{(\""[below(4)];
        m.bytes.insert(at, std::string(kDepths[below(3)], open));
        break;
      }
      default: {
        m.kind = "edge number";
        static const char* kNumbers[] = {"-1", "0", "2147483648", "-2147483649", "4294967296",
                                         "9223372036854775807", "9223372036854775808",
                                         "18446744073709551616", "-9223372036854775809", "1e400",
                                         "99999999999999999999999999", "1.5", "-0"};
        size_t start = at;  // rewrite the run of digits at or after `at`, else insert
        while (start < m.bytes.size() && !std::isdigit(uint8_t(m.bytes[start]))) ++start;
        size_t end = start;
        while (end < m.bytes.size() && std::isdigit(uint8_t(m.bytes[end]))) ++end;
        if (start == m.bytes.size()) start = end = at;
        const std::string number = kNumbers[below(std::size(kNumbers))];
        m.bytes.replace(start, end - start, number);
        m.offset = start;
        m.in_place = number.size() == end - start;
        m.width = m.in_place ? number.size() : 0;
        break;
      }
    }
    return m;
  }

  /// Uniform in [0, n) (0 when n == 0).
  size_t below(size_t n) { return n == 0 ? 0 : size_t(gen_() % n); }
  std::mt19937_64& gen() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

/// Where the fuzz tests put their files: /dev/shm when it is a writable folder (thousands of small
/// files are created and truncated; on a busy disk each open can take milliseconds), else the
/// usual temporary folder.
inline std::filesystem::path fuzz_temp_base() {
  std::error_code ec;
  const std::filesystem::path shm = "/dev/shm";
  if (std::filesystem::is_directory(shm, ec) && ::access(shm.c_str(), W_OK) == 0) return shm;
  return std::filesystem::temp_directory_path();
}

/// Counts what the cases of one fuzz test ended in, and prints it with the elapsed time.
struct FuzzTally {
  const char* name;
  int errors = 0;
  int reads = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  int cases() const { return errors + reads; }
  ~FuzzTally() {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("[fuzz] %s: %d cases (%d clean errors, %d correct reads) in %.2f s\n", name,
                cases(), errors, reads, s);
  }
};

/// Checks a clean longtron error: a one-sentence message of bounded size (an untrusted value is
/// never printed whole) naming `file`.
inline void expect_clean_error(const Error& e, const std::string& file, const Mutation& m) {
  const std::string what = e.what();
  EXPECT_LT(what.size(), 2000u) << m.kind << " at " << m.offset << ": " << what.substr(0, 300);
  EXPECT_NE(what.find(file), std::string::npos) << m.kind << " at " << m.offset << ": "
                                                << what.substr(0, 300);
}

}  // namespace longtron::testing
