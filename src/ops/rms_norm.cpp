// RMSNorm (Zhang & Sennrich 2019) as in InternLM2 / Llama: y = x · rstd ⊙ weight; Gemma's with
// offset 1: y = x · rstd ⊙ (1 + weight).
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::ops {

template <typename T>
void rms_norm_forward(T* out, T* rstd, const T* x, const T* weight, int64_t N, int64_t H, T eps,
                      uint16_t* out16, T offset) {
  check(out16 == nullptr || std::is_same_v<T, float>, "rms_norm_forward: bf16 bits of a double");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * H;
    double sum = 0.0;  // the mean of squares in double: H can be thousands of elements
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < H; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const T r = static_cast<T>(1.0 / std::sqrt(sum / static_cast<double>(H) + eps));
    rstd[n] = r;
    T* o = out + n * H;
#pragma omp simd
    for (int64_t i = 0; i < H; ++i) o[i] = xr[i] * r * (weight[i] + offset);
    if constexpr (std::is_same_v<T, float>)
      if (out16 != nullptr) round_to_bf16_serial(o, H, out16 + n * H);
  }
}

// With x̂ = x·r: dx = r·(g − x̂·mean(g ⊙ x̂)), g = dout ⊙ (offset + weight);
// dweight += Σ_n dout ⊙ x̂ (d(offset + w)/dw = 1).
template <typename T>
void rms_norm_backward(T* dx, T* dweight, const T* dout, const T* x, const T* weight,
                       const T* rstd, int64_t N, int64_t H, T offset) {
  if (dx != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * H;
      const T* gr = dout + n * H;
      const T r = rstd[n];
      double dot = 0.0;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < H; ++i)
        dot += static_cast<double>(gr[i]) * (weight[i] + offset) * xr[i];
      const T c = static_cast<T>(dot / static_cast<double>(H)) * r * r;
      T* d = dx + n * H;
#pragma omp simd
      for (int64_t i = 0; i < H; ++i) d[i] = r * (gr[i] * (weight[i] + offset) - xr[i] * c);
    }
  }
  if (dweight == nullptr) return;
  // Threads own blocks of 64 features, so the sum over tokens needs no reduction step.
  const int64_t blocks = (H + 63) / 64;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * 64, end = begin + 64 < H ? begin + 64 : H;
    double acc[64] = {};
    for (int64_t n = 0; n < N; ++n) {
      const T r = rstd[n];
      for (int64_t i = begin; i < end; ++i)
        acc[i - begin] += static_cast<double>(dout[n * H + i]) * x[n * H + i] * r;
    }
    for (int64_t i = begin; i < end; ++i) dweight[i] += static_cast<T>(acc[i - begin]);
  }
}

#define LONGTRON_INSTANTIATE(T)                                                                \
  template void rms_norm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, T,          \
                                    uint16_t*, T);                                             \
  template void rms_norm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, \
                                     int64_t, T);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
