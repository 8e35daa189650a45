#include "core/progress.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace longtron {

bool stderr_is_tty() { return isatty(fileno(stderr)) != 0; }

Progress::Progress(std::string label, int64_t total, std::string unit, bool enabled)
    : label_(std::move(label)), total_(total), unit_(std::move(unit)), enabled_(enabled),
      tty_(enabled && stderr_is_tty()), start_(std::chrono::steady_clock::now()) {
  if (!enabled_) return;
  fmt::print(stderr, "{}: {}\n", label_, amount(total_));
  std::fflush(stderr);
}

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string Progress::amount(int64_t n) const {
  if (unit_ != "bytes") return unit_.empty() ? fmt::format("{}", n) : fmt::format("{} {}", n, unit_);
  const double b = static_cast<double>(n);
  if (b >= 1e9) return fmt::format("{:.2f} GB", b * 1e-9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b * 1e-6);
  if (b >= 1e3) return fmt::format("{:.1f} kB", b * 1e-3);
  return fmt::format("{} bytes", n);
}

std::string Progress::rate(int64_t done) const {
  const double s = std::max(seconds(), 1e-9);
  if (unit_ == "bytes") return fmt::format("{:.0f} MB/s", static_cast<double>(done) * 1e-6 / s);
  return fmt::format("{:.0f} {}/s", static_cast<double>(done) / s, unit_.empty() ? "" : unit_);
}

void Progress::update(int64_t done, const std::string& suffix) {
  done_ = done;
  if (!tty_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double frac = total_ > 0 ? std::min(1.0, double(done) / double(total_)) : 1.0;
  const int width = 30, filled = int(frac * width);
  fmt::print(stderr, "\r{} [{}{}] {:5.1f}% {}/{}, {}{}\033[K", label_, std::string(filled, '#'),
             std::string(width - filled, ' '), 100.0 * frac, amount(done), amount(total_),
             rate(done), suffix.empty() ? "" : " " + suffix);
  std::fflush(stderr);
}

void Progress::finish(const std::string& suffix) {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (tty_) fmt::print(stderr, "\r\033[K");
  fmt::print(stderr, "{}: done in {:.1f} s ({}){}\n", label_, seconds(), rate(done_),
             suffix.empty() ? "" : " " + suffix);
  std::fflush(stderr);
}

}  // namespace longtron
