// Scratch buffers of the parallel ops: grown on demand, reused across calls.
#pragma once

#include <cstdint>
#include <vector>

namespace longtron::parallel {

/// Returns b.data() with at least n floats. When b is smaller it is reallocated and zero-filled
/// (its old contents are lost); otherwise it is left as it is (callers overwrite what they read).
inline float* ensure(std::vector<float>& b, int64_t n) {
  if (static_cast<int64_t>(b.size()) < n) b.assign(static_cast<size_t>(n), 0.0f);
  return b.data();
}

}  // namespace longtron::parallel
