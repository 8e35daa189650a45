#include "core/progress.h"

#include <fmt/core.h>
#include <unistd.h>

#include <cstdio>

namespace longtron {

bool stderr_is_tty() { return isatty(fileno(stderr)) != 0; }

Progress::Progress(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)), total_(total), unit_(std::move(unit)), tty_(stderr_is_tty()) {}

void Progress::update(int64_t done, const std::string& suffix) {
  const double frac = total_ > 0 ? double(done) / double(total_) : 1.0;
  if (tty_) {
    auto now = std::chrono::steady_clock::now();
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const int width = 30, filled = int(frac * width);
    fmt::print(stderr, "\r{} [{}{}] {:5.1f}% {}\033[K", label_, std::string(filled, '#'),
               std::string(width - filled, ' '), 100.0 * frac, suffix);
    std::fflush(stderr);
  } else {
    const int decile = int(frac * 10);
    if (decile == last_decile_) return;
    last_decile_ = decile;
    fmt::print(stderr, "{}: {}/{}{} ({:.0f}%) {}\n", label_, done, total_,
               unit_.empty() ? "" : " " + unit_, 100.0 * frac, suffix);
  }
}

void Progress::finish(const std::string& suffix) {
  if (tty_) fmt::print(stderr, "\r\033[K");
  fmt::print(stderr, "{}: done {}\n", label_, suffix);
}

}  // namespace longtron
