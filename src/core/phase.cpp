// Phases for error messages (see phase.h).
#include "core/phase.h"

#include <exception>
#include <utility>

namespace longtron {
namespace {
std::string& phase() {
  static std::string current;
  return current;
}
}  // namespace

Phase::Phase(std::string what)
    : outer_(std::exchange(phase(), std::move(what))), uncaught_(std::uncaught_exceptions()) {}

Phase::~Phase() {
  // Unwinding: keep the innermost name for the top-level handler.
  if (std::uncaught_exceptions() > uncaught_) return;
  phase() = std::move(outer_);
}

const std::string& current_phase() { return phase(); }

std::string out_of_memory_message() {
  const std::string& p = phase();
  return p.empty() ? std::string("out of memory (a memory allocation failed)")
                   : "out of memory while " + p + " (a memory allocation failed)";
}

}  // namespace longtron
