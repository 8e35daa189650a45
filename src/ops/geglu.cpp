// GeGLU gate with the tanh approximation of GELU (Shazeer 2020; Hendrycks & Gimpel 2016):
// out = gelu_tanh(a) ⊙ b, Gemma's FFN down(gelu_tanh(gate z) ⊙ up z).
#include <cstdint>

#include "ops/fast_math.h"
#include "ops/ops.h"

namespace longtron::ops {
namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // √(2/π)
constexpr double kCubic = 0.044715;

/// tanh(u) = 1 − 2 / (e^{2u} + 1): through fast_exp, so that the float loop vectorises; at the
/// clamps of fast_exp it gives ±1 (and in double, e^{2u} = ∞ gives 1).
template <typename T>
inline T tanh_of(T u) {
  return T(1) - T(2) / (detail::fast_exp(T(2) * u) + T(1));
}

}  // namespace

template <typename T>
void geglu_tanh_forward(T* out, const T* a, const T* b, int64_t count) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const T x = a[i];
    const T t = tanh_of(T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x));
    out[i] = T(0.5) * x * (T(1) + t) * b[i];
  }
}

// gelu_tanh'(x) = ½(1 + t) + ½x(1 − t²)·√(2/π)(1 + 3·0.044715x²), t = tanh(√(2/π)(x + 0.044715x³)).
template <typename T>
void geglu_tanh_backward(T* da, T* db, const T* dout, const T* a, const T* b, int64_t count) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const T x = a[i];
    const T t = tanh_of(T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x));
    const T gelu = T(0.5) * x * (T(1) + t);
    const T slope = T(0.5) * (T(1) + t) +
                    T(0.5) * x * (T(1) - t * t) * T(kSqrt2OverPi) * (T(1) + T(3 * kCubic) * x * x);
    const T g = dout[i];
    if (da != nullptr) da[i] = g * b[i] * slope;
    if (db != nullptr) db[i] = g * gelu;
  }
}

#define LONGTRON_INSTANTIATE(T)                                             \
  template void geglu_tanh_forward<T>(T*, const T*, const T*, int64_t);     \
  template void geglu_tanh_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
