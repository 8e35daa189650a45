// Rotary position embedding (Su et al. 2021) in the Hugging Face `rotate_half` form: the pairs are
// (i, i + d/2), angle(n, i) = indexes[n] · base^(−2i/d). Positions come from the packed `indexes`,
// so every document restarts at 0.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::ops {
namespace {

// cos[i] and sin[i] = cos and sign·sin of angle(p, i) = p · inv_freq[i], i < half: double angle,
// double cos/sin, one rounding to T (the table and the per-token path share it, so they agree
// bitwise).
template <typename T>
void angles_at(T* cos, T* sin, double p, const double* inv_freq, int64_t half, double sign) {
  for (int64_t i = 0; i < half; ++i) {
    const double angle = p * inv_freq[i];
    cos[i] = static_cast<T>(std::cos(angle));
    sin[i] = static_cast<T>(sign * std::sin(angle));
  }
}

// cos and sign·sin of angle(p, i) = p · inv_freq[i] for positions p < rows, row-major [rows, d/2]:
// the same values for every layer and for the forward and backward of a step, so they are
// computed once per thread and position and looked up afterwards instead of calling sin/cos per
// token and call (~1% of a training step). Each entry is computed exactly as a per-call sin/cos would (double
// angle, double cos/sin, one rounding to T), so the rotation is bitwise unchanged.
template <typename T>
struct RopeTable {
  std::vector<double> inv_freq;
  double sign = 0;
  int64_t rows = 0;
  std::vector<T> cos, sin;
};

// Calls with positions past this many table values (per cos or sin table: 4 MiB in float, so
// 16 Ki positions at head_dim 128) compute the angles per token instead, so a long context does
// not keep large tables per thread; there attention's quadratic cost dwarfs the angles anyway.
constexpr int64_t kMaxTableValues = int64_t{1} << 20;

// The calling thread's table for (inv_freq[half], sign) covering positions [0, rows) (grown and
// filled as needed), or nullptr when `rows` would exceed kMaxTableValues.
template <typename T>
const RopeTable<T>* rope_table(const double* inv_freq, int64_t half, double sign, int64_t rows) {
  if (rows * half > kMaxTableValues) return nullptr;
  thread_local RopeTable<T> tables[2];  // forward (sign +1), backward (−1)
  RopeTable<T>& t = tables[sign < 0 ? 1 : 0];
  if (t.sign != sign || t.inv_freq.size() != static_cast<size_t>(half) ||
      !std::equal(inv_freq, inv_freq + half, t.inv_freq.begin())) {
    t.inv_freq.assign(inv_freq, inv_freq + half);
    t.sign = sign;
    t.rows = 0;
  }
  if (t.rows >= rows) return &t;
  // Grow at least 2× so a slowly rising maximum position does not refill the table each call.
  const int64_t old_rows = t.rows;
  const int64_t new_rows = std::min(std::max(rows, 2 * old_rows), kMaxTableValues / half);
  t.cos.resize(static_cast<size_t>(new_rows * half));
  t.sin.resize(static_cast<size_t>(new_rows * half));
#pragma omp parallel for schedule(static)
  for (int64_t p = old_rows; p < new_rows; ++p)
    angles_at(&t.cos[p * half], &t.sin[p * half], static_cast<double>(p), inv_freq, half, sign);
  t.rows = new_rows;
  return &t;
}

// sign = +1 rotates by +angle (forward), −1 by −angle (the adjoint, since rotations are orthogonal).
template <typename T>
void rope_rotate(T* x, const int32_t* indexes, int64_t N, int64_t heads, int64_t d,
                 int64_t row_stride, const double* inv_freq, double sign) {
  const RopeRotation<T> rotation(indexes, N, d, inv_freq, sign);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) rotation.rotate(x + n * row_stride, heads, indexes[n]);
}

}  // namespace

template <typename T>
RopeRotation<T>::RopeRotation(const int32_t* indexes, int64_t N, int64_t d,
                              const double* inv_freq, double sign)
    : half_(d / 2), sign_(sign), inv_freq_(inv_freq) {
  check(d % 2 == 0, "rope: head_dim must be even, got {}", d);
  int32_t lo_pos = 0, hi_pos = -1;
  if (N > 0) {
    const auto [lo_it, hi_it] = std::minmax_element(indexes, indexes + N);
    lo_pos = *lo_it, hi_pos = *hi_it;
  }
  if (lo_pos < 0) return;
  if (const RopeTable<T>* t = rope_table<T>(inv_freq, half_, sign, int64_t{hi_pos} + 1)) {
    cos_ = t->cos.data(), sin_ = t->sin.data();
  }
}

template <typename T>
void RopeRotation<T>::rotate(T* x, int64_t heads, int32_t pos) const {
  const T* cos_t;
  const T* sin_t;
  thread_local std::vector<T> cos_own, sin_own;  // angles per token beyond the table
  if (cos_ != nullptr) {
    cos_t = cos_ + static_cast<size_t>(pos) * static_cast<size_t>(half_);
    sin_t = sin_ + static_cast<size_t>(pos) * static_cast<size_t>(half_);
  } else {
    cos_own.resize(static_cast<size_t>(half_)), sin_own.resize(static_cast<size_t>(half_));
    angles_at(cos_own.data(), sin_own.data(), static_cast<double>(pos), inv_freq_, half_, sign_);
    cos_t = cos_own.data(), sin_t = sin_own.data();
  }
  const int64_t half = half_;
  for (int64_t h = 0; h < heads; ++h) {
    T* lo = x + h * 2 * half;
    T* hi = lo + half;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const T a = lo[i], b = hi[i];
      lo[i] = a * cos_t[i] - b * sin_t[i];
      hi[i] = b * cos_t[i] + a * sin_t[i];
    }
  }
}

template class RopeRotation<float>;
template class RopeRotation<double>;

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
