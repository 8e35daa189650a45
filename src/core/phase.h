// What the process is doing, for the "out of memory while …" message: a std::bad_alloc carries no
// context, so the code names its phases (RAII, nested phases restore the outer one) and the
// top-level handlers report the innermost.
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
};

/// The innermost live phase ("" when none).
const std::string& current_phase();

/// "out of memory while <phase>" (or "out of memory" without one), for a caught std::bad_alloc.
std::string out_of_memory_message();

}  // namespace longtron
