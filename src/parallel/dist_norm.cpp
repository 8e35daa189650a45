// Distributed RMSNorm / LayerNorm (see dist_norm.h).
#include "parallel/dist_norm.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/layer_norm.h"
#include "ops/ops.h"

namespace longtron::parallel {
namespace {

void check_split(int64_t H_local, int64_t H, const comm::Communicator& group) {
  check(H_local > 0 && H_local * group.size() == H,
        "distributed norm: local hidden {} × group size {} != hidden_size {}", H_local,
        group.size(), H);
}

// Σ over the rank's features of f(i) per token, in double.
template <typename F>
void row_sums(double* acc, int64_t N, int stride, F&& f) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) f(n, acc + n * stride);
}

}  // namespace

template <typename T>
void dist_rms_norm_forward(T* out, T* rstd, const T* x, const T* weight, int64_t N,
                           int64_t H_local, int64_t H, T eps, comm::Communicator& group) {
  check_split(H_local, H, group);
  if (group.size() == 1) return ops::rms_norm_forward(out, rstd, x, weight, N, H, eps);
  std::vector<double> ss(static_cast<size_t>(N));
  row_sums(ss.data(), N, 1, [&](int64_t n, double* a) {
    const T* xr = x + n * H_local;
    double s = 0.0;
    for (int64_t i = 0; i < H_local; ++i) s += static_cast<double>(xr[i]) * xr[i];
    *a = s;
  });
  group.all_reduce(ss.data(), N);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T r = static_cast<T>(1.0 / std::sqrt(ss[size_t(n)] / double(H) + double(eps)));
    rstd[n] = r;
    const T* xr = x + n * H_local;
    T* o = out + n * H_local;
    for (int64_t i = 0; i < H_local; ++i) o[i] = xr[i] * r * weight[i];
  }
}

template <typename T>
void dist_rms_norm_backward(T* dx, T* dweight, const T* dout, const T* x, const T* weight,
                            const T* rstd, int64_t N, int64_t H_local, int64_t H,
                            comm::Communicator& group) {
  check_split(H_local, H, group);
  if (group.size() == 1)
    return ops::rms_norm_backward(dx, dweight, dout, x, weight, rstd, N, H);
  if (dx != nullptr) {
    std::vector<double> dot(static_cast<size_t>(N));
    row_sums(dot.data(), N, 1, [&](int64_t n, double* a) {
      double s = 0.0;
      for (int64_t i = 0; i < H_local; ++i)
        s += static_cast<double>(dout[n * H_local + i]) * weight[i] * x[n * H_local + i];
      *a = s;
    });
    group.all_reduce(dot.data(), N);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T r = rstd[n];
      const T c = static_cast<T>(dot[size_t(n)] / double(H)) * r * r;
      for (int64_t i = 0; i < H_local; ++i)
        dx[n * H_local + i] = r * (dout[n * H_local + i] * weight[i] - x[n * H_local + i] * c);
    }
  }
  if (dweight != nullptr)
    ops::norm_param_grads<T>(dweight, nullptr, dout, x, nullptr, rstd, N, H_local);
}

template <typename T>
void dist_layer_norm_forward(T* out, T* mean, T* rstd, const T* x, const T* weight, const T* bias,
                             int64_t N, int64_t H_local, int64_t H, T eps,
                             comm::Communicator& group) {
  check_split(H_local, H, group);
  if (group.size() == 1)
    return ops::layer_norm_forward(out, mean, rstd, x, weight, bias, N, H, eps);
  std::vector<double> es(static_cast<size_t>(2 * N));  // per token: Σx, Σx²
  row_sums(es.data(), N, 2, [&](int64_t n, double* a) {
    double e = 0.0, s = 0.0;
    for (int64_t i = 0; i < H_local; ++i) {
      const double v = x[n * H_local + i];
      e += v, s += v * v;
    }
    a[0] = e, a[1] = s;
  });
  group.all_reduce(es.data(), 2 * N);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const double mu = es[size_t(2 * n)] / double(H);
    const double var = es[size_t(2 * n + 1)] / double(H) - mu * mu;  // s/H − μ² in double (docs/tp2d.md)
    const double r = 1.0 / std::sqrt(var + double(eps));
    mean[n] = static_cast<T>(mu);
    rstd[n] = static_cast<T>(r);
    for (int64_t i = 0; i < H_local; ++i) {
      const T xh = static_cast<T>((static_cast<double>(x[n * H_local + i]) - mu) * r);
      out[n * H_local + i] = xh * weight[i] + (bias != nullptr ? bias[i] : T(0));
    }
  }
}

template <typename T>
void dist_layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x,
                              const T* weight, const T* mean, const T* rstd, int64_t N,
                              int64_t H_local, int64_t H, comm::Communicator& group) {
  check_split(H_local, H, group);
  if (group.size() == 1)
    return ops::layer_norm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd, N, H);
  if (dx != nullptr) {
    std::vector<double> c(static_cast<size_t>(2 * N));  // per token: Σ g, Σ g·x̂
    row_sums(c.data(), N, 2, [&](int64_t n, double* a) {
      const double mu = mean[n], r = rstd[n];
      double c1 = 0.0, c2 = 0.0;
      for (int64_t i = 0; i < H_local; ++i) {
        const double g = static_cast<double>(dout[n * H_local + i]) * weight[i];
        c1 += g, c2 += g * (x[n * H_local + i] - mu) * r;
      }
      a[0] = c1, a[1] = c2;
    });
    group.all_reduce(c.data(), 2 * N);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const double mu = mean[n], r = rstd[n];
      const double c1 = c[size_t(2 * n)] / double(H), c2 = c[size_t(2 * n + 1)] / double(H);
      for (int64_t i = 0; i < H_local; ++i) {
        const double g = static_cast<double>(dout[n * H_local + i]) * weight[i];
        dx[n * H_local + i] = static_cast<T>(r * (g - c1 - (x[n * H_local + i] - mu) * r * c2));
      }
    }
  }
  ops::norm_param_grads<T>(dweight, dbias, dout, x, mean, rstd, N, H_local);
}

#define LONGTRON_INSTANTIATE(T)                                                                  \
  template void dist_rms_norm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, int64_t,  \
                                         T, comm::Communicator&);                                \
  template void dist_rms_norm_backward<T>(T*, T*, const T*, const T*, const T*, const T*,        \
                                          int64_t, int64_t, int64_t, comm::Communicator&);       \
  template void dist_layer_norm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t,    \
                                           int64_t, int64_t, T, comm::Communicator&);            \
  template void dist_layer_norm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,  \
                                            const T*, int64_t, int64_t, int64_t,                 \
                                            comm::Communicator&);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::parallel
