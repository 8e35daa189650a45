// Progress reporting for work that can take more than a couple of seconds (tokenizing, loading a
// model, saving a checkpoint): a start line at once, then on a terminal a self-overwriting line
// (what, how much, rate) redrawn at most ~10 times a second, and an end line. When stderr is not a
// terminal (a log file) only the start and end lines are written.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace longtron {

/// Reports progress of `total` units of work on stderr: "<label>: <total> <unit>" when
/// constructed, then (terminal only) "<label> [####   ]  42.0% <done>/<total> <unit>, <rate>
/// <suffix>", and "<label>: done in <s> s (<rate>) <suffix>" from finish(). Amounts in "bytes" are
/// printed as KB/MB/GB (10^3 multiples) and their rate as MB/s; other units as counts per second.
/// A disabled Progress (e.g. on every rank but 0) prints nothing.
class Progress {
 public:
  /// `unit` names what is counted ("bytes"); empty for plain counts.
  Progress(std::string label, int64_t total, std::string unit = "", bool enabled = true);
  /// Sets the number of completed units and an optional suffix (e.g. a second rate).
  void update(int64_t done, const std::string& suffix = "");
  /// Prints the end line (once; later calls do nothing).
  void finish(const std::string& suffix = "");
  /// Seconds since construction.
  double seconds() const;

 private:
  std::string amount(int64_t n) const;
  std::string rate(int64_t done) const;
  std::string label_;
  int64_t total_;
  std::string unit_;
  bool enabled_;
  bool tty_;
  bool finished_ = false;
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_{};
};

/// Reading or writing fewer bytes than this takes about a second or less: loads and saves of such
/// sizes show no progress lines (a small model's eval or generate prints only its result).
inline constexpr int64_t kProgressMinBytes = int64_t{256} << 20;

/// True when stderr is a terminal.
bool stderr_is_tty();

}  // namespace longtron
