// Rotary position embedding (Su et al. 2021) in the Hugging Face `rotate_half` form: the pairs are
// (i, i + d/2), angle(n, i) = indexes[n] · base^(−2i/d). Positions come from the packed `indexes`,
// so every document restarts at 0.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::ops {
namespace {

// sign = +1 rotates by +angle (forward), −1 by −angle (the adjoint, since rotations are orthogonal).
template <typename T>
void rope_rotate(T* x, const int32_t* indexes, int64_t N, int64_t heads, int64_t d,
                 int64_t row_stride, const double* inv_freq, double sign) {
  check(d % 2 == 0, "rope: head_dim must be even, got {}", d);
  const int64_t half = d / 2;
#pragma omp parallel
  {
    std::vector<T> cos_t(half), sin_t(half);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(indexes[n]) * inv_freq[i];
        cos_t[i] = static_cast<T>(std::cos(angle));
        sin_t[i] = static_cast<T>(sign * std::sin(angle));
      }
      for (int64_t h = 0; h < heads; ++h) {
        T* lo = x + n * row_stride + h * d;
        T* hi = lo + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const T a = lo[i], b = hi[i];
          lo[i] = a * cos_t[i] - b * sin_t[i];
          hi[i] = b * cos_t[i] + a * sin_t[i];
        }
      }
    }
  }
}

}  // namespace

std::vector<double> rope_inv_freq(double base, int64_t d) {
  std::vector<double> inv_freq(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i)
    inv_freq[size_t(i)] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  return inv_freq;
}

template <typename T>
void rope_forward(T* x, const int32_t* indexes, int64_t N, int64_t heads, int64_t d,
                  int64_t row_stride, double base) {
  rope_rotate(x, indexes, N, heads, d, row_stride, rope_inv_freq(base, d).data(), 1.0);
}

template <typename T>
void rope_backward(T* dx, const int32_t* indexes, int64_t N, int64_t heads, int64_t d,
                   int64_t row_stride, double base) {
  rope_rotate(dx, indexes, N, heads, d, row_stride, rope_inv_freq(base, d).data(), -1.0);
}

template <typename T>
void rope_forward(T* x, const int32_t* indexes, int64_t N, int64_t heads, int64_t d,
                  int64_t row_stride, const double* inv_freq) {
  rope_rotate(x, indexes, N, heads, d, row_stride, inv_freq, 1.0);
}

template <typename T>
void rope_backward(T* dx, const int32_t* indexes, int64_t N, int64_t heads, int64_t d,
                   int64_t row_stride, const double* inv_freq) {
  rope_rotate(dx, indexes, N, heads, d, row_stride, inv_freq, -1.0);
}

#define LONGTRON_INSTANTIATE(T)                                                          \
  template void rope_forward<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                double);                                                 \
  template void rope_backward<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                 double);                                                 \
  template void rope_forward<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                const double*);                                          \
  template void rope_backward<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                 const double*);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
