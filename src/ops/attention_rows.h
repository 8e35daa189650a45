// Row-wise softmax steps shared by the fp32/double and bf16 attention kernels: the online-softmax
// update of the forward and P, dS of the backward, both on fp32 (or double) score rows whose
// visible keys are [lo, hi) of the tile (the rest masked to 0).
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

#include "ops/attention_plan.h"
#include "ops/fast_math.h"
#include "ops/kernel_isa.h"

// GCC tunes Sapphire Rapids-class CPUs to auto-vectorise with 256-bit vectors; these exp loops
// are the attention's largest non-GEMM cost, and 512-bit vectors halve their instructions.
#if defined(__AVX512F__)
#define LONGTRON_WIDE_SIMD __attribute__((target("prefer-vector-width=512")))
#else
#define LONGTRON_WIDE_SIMD
#endif

LONGTRON_ISA_BEGIN

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

/// Rows [i0, i1) of a stacked query tile (rows h·bi + r, one head's rows) that need keys
/// [0, 16·nv) of a key block only.
struct RowGroup {
  int64_t i0, i1, nv;
};

/// The row groups of a forward tile (queries [r0, r0 + bi) of segment g, G heads stacked; keys
/// [c0, c0 + bj), bj ≤ 64) whose rows do not all see every key (the causal edge): per head,
/// consecutive queries whose last visible key falls in the same 16-key vector. The tile's
/// products then stop at that vector for each group (the forward's S and PV both; the keys left
/// out hold P = 0, so the values are the same), which leaves out the masked half of diagonal
/// tiles but for its last vector: ~5% of the products on rows of documents of a few hundred
/// tokens. Writes at most 4·G groups; returns their number.
inline int64_t edge_row_groups(RowGroup* groups, const AttnPlan& p, const AttnSegment& g,
                               int64_t r0, int64_t bi, int64_t G, int64_t c0, int64_t bj) {
  const auto vectors = [&](int64_t r) {
    const int64_t e = std::clamp<int64_t>(p.key_hi(g, r0 + r) - c0, 0, bj);
    return std::max<int64_t>(1, (e + 15) / 16);
  };
  int64_t n = 0;
  for (int64_t r = 0; r < bi;) {  // key_hi increases with r: at most 4 groups
    const int64_t nv = vectors(r);
    int64_t end = r + 1;
    while (end < bi && vectors(end) == nv) ++end;
    groups[n++] = {r, end, nv};
    r = end;
  }
  for (int64_t h = 1; h < G; ++h)
    for (int64_t k = 0; k < n; ++k)
      groups[h * n + k] = {groups[k].i0 + h * bi, groups[k].i1 + h * bi, groups[k].nv};
  return n * G;
}

LONGTRON_ISA_END
