// Small inline helpers shared by the kernels: a branch-free exp that GCC vectorises inside
// `#pragma omp simd` loops (float), and the exact std::exp for double (the finite-difference
// tests run in double, so their accuracy is not limited by the approximation).
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "ops/kernel_isa.h"

LONGTRON_ISA_BEGIN

/// e^x for float: 2^n · p(r), n = round(x·log2 e), r = x − n·ln 2 (Cody–Waite split), p a
/// degree-6 Taylor/minimax polynomial (Cephes expf coefficients). Relative error ≈ 2 ulp for
/// x in [−87, 88]; inputs below −87 return 0 (exact underflow, which masked scores rely on).
inline float fast_exp(float x) {
  // Branch-free and conversion-free so GCC vectorises it without -ffast-math: min/max instead of
  // ?:, and n = round(x·log2 e) by adding 1.5·2²³ (the integer lands in the low mantissa bits),
  // since a float→int conversion is not vectorised under the default -ftrapping-math.
  constexpr float kMagic = 12582912.0f;
  const float clamped = std::min(std::max(x, -87.0f), 88.0f);
  const float shifted = clamped * 1.44269504088896341f + kMagic;
  const float n = shifted - kMagic;
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kMagic) + 127)
                       << 23;
  return p * std::bit_cast<float>(bits) * static_cast<float>(x >= -87.0f);
}

inline double fast_exp(double x) { return std::exp(x); }

LONGTRON_ISA_END
