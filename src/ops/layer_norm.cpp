// LayerNorm forward/backward (see layer_norm.h).
#include "ops/layer_norm.h"

#include <cmath>

namespace longtron::ops {

template <typename T>
void layer_norm_forward(T* out, T* mean, T* rstd, const T* x, const T* weight, const T* bias,
                        int64_t N, int64_t H, T eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * H;
    double e = 0.0, s = 0.0;
    for (int64_t i = 0; i < H; ++i) {
      e += static_cast<double>(xr[i]);
      s += static_cast<double>(xr[i]) * xr[i];
    }
    const double mu = e / static_cast<double>(H);
    const double var = s / static_cast<double>(H) - mu * mu;
    const double r = 1.0 / std::sqrt(var + static_cast<double>(eps));
    mean[n] = static_cast<T>(mu);
    rstd[n] = static_cast<T>(r);
    T* o = out + n * H;
    for (int64_t i = 0; i < H; ++i) {
      const T xh = static_cast<T>((static_cast<double>(xr[i]) - mu) * r);
      o[i] = xh * weight[i] + (bias != nullptr ? bias[i] : T(0));
    }
  }
}

template <typename T>
void layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight,
                         const T* mean, const T* rstd, int64_t N, int64_t H) {
  if (dx != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * H;
      const T* gr = dout + n * H;
      const double mu = mean[n], r = rstd[n];
      double c1 = 0.0, c2 = 0.0;  // Σ g and Σ g·x̂
      for (int64_t i = 0; i < H; ++i) {
        const double g = static_cast<double>(gr[i]) * weight[i];
        c1 += g;
        c2 += g * (xr[i] - mu) * r;
      }
      c1 /= static_cast<double>(H);
      c2 /= static_cast<double>(H);
      T* d = dx + n * H;
      for (int64_t i = 0; i < H; ++i) {
        const double g = static_cast<double>(gr[i]) * weight[i];
        d[i] = static_cast<T>(r * (g - c1 - (xr[i] - mu) * r * c2));
      }
    }
  }
  norm_param_grads<T>(dweight, dbias, dout, x, mean, rstd, N, H);
}

template <typename T>
void norm_param_grads(T* dweight, T* dbias, const T* dout, const T* x, const T* mean,
                      const T* rstd, int64_t N, int64_t H) {
  if (dweight == nullptr && dbias == nullptr) return;
  // Threads own blocks of 64 features, so the sums over tokens need no reduction step.
  const int64_t blocks = (H + 63) / 64;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * 64, end = begin + 64 < H ? begin + 64 : H;
    double aw[64] = {}, ab[64] = {};
    for (int64_t n = 0; n < N; ++n) {
      const double mu = mean != nullptr ? double(mean[n]) : 0.0, r = rstd[n];
      for (int64_t i = begin; i < end; ++i) {
        aw[i - begin] += static_cast<double>(dout[n * H + i]) * (x[n * H + i] - mu) * r;
        ab[i - begin] += static_cast<double>(dout[n * H + i]);
      }
    }
    for (int64_t i = begin; i < end; ++i) {
      if (dweight != nullptr) dweight[i] += static_cast<T>(aw[i - begin]);
      if (dbias != nullptr) dbias[i] += static_cast<T>(ab[i - begin]);
    }
  }
}

#define LONGTRON_INSTANTIATE(T)                                                                   \
  template void layer_norm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, \
                                      T);                                                         \
  template void layer_norm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,        \
                                       const T*, int64_t, int64_t);                          \
  template void norm_param_grads<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t,      \
                                    int64_t);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
