// What the process is doing, for the "out of memory while …" message: a std::bad_alloc carries no
// context, so the code names its phases (RAII, nested phases restore the outer one) and the
// top-level handlers report the innermost. A phase left by an exception keeps its name, so the
// handler that catches it still sees where it was thrown.
#pragma once
#include <string>

namespace longtron {

/// Names the current phase (e.g. "allocating the parameters (12.3 MiB)") while it lives.
class Phase {
 public:
  explicit Phase(std::string what);
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  std::string outer_;
  int uncaught_;  // std::uncaught_exceptions() at construction
};

/// The innermost live phase ("" when none).
const std::string& current_phase();

/// "out of memory while <phase>" (or "out of memory" without one), for a caught std::bad_alloc.
std::string out_of_memory_message();

}  // namespace longtron
