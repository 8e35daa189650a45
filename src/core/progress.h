// Progress reporting: a live, self-overwriting line on a terminal; plain lines in a log file.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace longtron {

/// Reports progress of `total` units of work on stderr. On a terminal the line is redrawn at most
/// ~10 times a second; otherwise a plain line ("tokenize: 120/400 bytes (30%) ...") is printed at
/// every 10% step.
class Progress {
 public:
  /// `unit` names what is counted ("bytes"); empty for plain counts.
  Progress(std::string label, int64_t total, std::string unit = "");
  /// Sets the number of completed units and an optional suffix (e.g. a rate).
  void update(int64_t done, const std::string& suffix = "");
  /// Prints the final line.
  void finish(const std::string& suffix = "");

 private:
  std::string label_;
  int64_t total_;
  std::string unit_;
  bool tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point last_draw_{};
};

/// True when stderr is a terminal.
bool stderr_is_tty();

}  // namespace longtron
