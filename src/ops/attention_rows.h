// Row-wise softmax steps shared by the fp32/double and bf16 attention kernels: the online-softmax
// update of the forward and P, dS of the backward, both on fp32 (or double) score rows whose
// visible keys are [lo, hi) of the tile (the rest masked to 0).
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

#include "ops/fast_math.h"

// GCC tunes Sapphire Rapids-class CPUs to auto-vectorise with 256-bit vectors; these exp loops
// are the attention's largest non-GEMM cost, and 512-bit vectors halve their instructions.
#if defined(__AVX512F__)
#define LONGTRON_WIDE_SIMD __attribute__((target("prefer-vector-width=512")))
#else
#define LONGTRON_WIDE_SIMD
#endif

namespace longtron::ops::detail {

/// Online-softmax update of one score row (FlashAttention-2, Algorithm 1): p = exp(scale·s − m)
/// over [lo, hi), 0 elsewhere, m and l updated. Returns exp(m_old − m_new), the factor by which
/// the row's output accumulator must be scaled (1 when the row sees nothing here, which leaves m
/// and l as they are).
template <typename T>
LONGTRON_WIDE_SIMD T softmax_row_update(T* srow, int64_t bj, int64_t lo, int64_t hi, T scale, T& m, T& l) {
  if (lo >= hi) {
    std::fill(srow, srow + bj, T(0));
    return T(1);
  }
  T row_max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : row_max)
  for (int64_t c = lo; c < hi; ++c) row_max = srow[c] > row_max ? srow[c] : row_max;
  const T m_new = std::max(m, row_max * scale);
  const T alpha = fast_exp(m - m_new);  // m = −inf on the first visible block → 0
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = lo; c < hi; ++c) {
    const T p = fast_exp(srow[c] * scale - m_new);
    srow[c] = p;
    sum += p;
  }
  std::fill(srow, srow + lo, T(0));
  std::fill(srow + hi, srow + bj, T(0));
  l = l * alpha + sum;
  m = m_new;
  return alpha;
}

/// Backward of one row (FlashAttention-2, Algorithm 2): P = exp(scale·S − lse) into srow and
/// dS = P ∘ (dP − D) · scale into dprow over [lo, hi), both 0 elsewhere.
template <typename T>
LONGTRON_WIDE_SIMD void dscores_row(T* srow, T* dprow, int64_t bj, int64_t lo, int64_t hi, T lse, T delta,
                 T scale) {
#pragma omp simd
  for (int64_t c = lo; c < hi; ++c) {
    const T p = fast_exp(srow[c] * scale - lse);
    srow[c] = p;
    dprow[c] = p * (dprow[c] - delta) * scale;
  }
  for (int64_t c = 0; c < std::min(lo, bj); ++c) srow[c] = dprow[c] = T(0);
  for (int64_t c = std::max(lo, hi); c < bj; ++c) srow[c] = dprow[c] = T(0);
}

}  // namespace longtron::ops::detail
