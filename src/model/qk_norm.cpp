// The per-head q/k RMSNorm of Qwen3 (model/layers.h, QkNorm).
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/layers.h"
#include "ops/threads.h"

namespace longtron::model {

template <typename T>
QkNorm<T>::QkNorm(const ParamTable& layout, const BlockParamIds& b, int64_t q_heads,
                  int64_t kv_heads, int64_t row_split)
    : q_norm_(b.q_norm), k_norm_(b.k_norm), hq_(q_heads), hkv_(kv_heads),
      d_(layout.config().head_dim()), split_(row_split),
      eps_(static_cast<T>(layout.config().norm_eps)) {
  check(b.q_norm >= 0 && b.k_norm >= 0, "internal: a q/k norm without its weights");
  check(kv_heads > 0 && q_heads % kv_heads == 0,
        "internal: q/k norm over {} query heads and {} kv heads", q_heads, kv_heads);
  check(row_split > 0, "internal: q/k norm rows split {} ways", row_split);
}

// Head h of a token's grouped row (h < hq + hkv: the q heads of each kv group, then its k head)
// starts at element (g·(qpk + 2) + j)·d with g = h / (qpk + 1), j = h % (qpk + 1); the saved
// heads are the same hq + hkv heads packed in that order.
template <typename T>
void QkNorm<T>::forward(T* qkv, T* saved, T* rstd, int64_t tokens, const Params<T>& p) const {
  const int64_t N = rows(tokens);
  const int64_t qpk = hq_ / hkv_, heads = hq_ + hkv_, row = (hq_ + 2 * hkv_) * d_, d = d_;
  const T* const wq = p.ptr(q_norm_);
  const T* const wk = p.ptr(k_norm_);
#pragma omp parallel for schedule(static) if (N * row > kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (qpk + 1), j = h % (qpk + 1);
      T* const x = qkv + n * row + (g * (qpk + 2) + j) * d;
      T* const s = saved + (n * heads + h) * d;
      const T* const w = j < qpk ? wq : wk;
      double sum = 0.0;  // the mean of squares in double, as ops::rms_norm_forward
      for (int64_t i = 0; i < d; ++i) {
        s[i] = x[i];
        sum += static_cast<double>(x[i]) * x[i];
      }
      const T r = static_cast<T>(1.0 / std::sqrt(sum / static_cast<double>(d) + eps_));
      rstd[n * heads + h] = r;
      for (int64_t i = 0; i < d; ++i) x[i] = s[i] * r * w[i];
    }
  }
}

// As ops::rms_norm_backward, per head: with x̂ = x·r and g = dout ⊙ w, dx = r·(g − x̂·mean(g ⊙ x̂));
// dw += Σ over tokens and heads of dout ⊙ x̂ (q heads into w_q, k heads into w_k).
template <typename T>
void QkNorm<T>::backward(T* dqkv, const T* saved, const T* rstd, int64_t tokens,
                         const Params<T>& p, Params<T>* grads) const {
  const int64_t N = rows(tokens);
  const int64_t qpk = hq_ / hkv_, heads = hq_ + hkv_, row = (hq_ + 2 * hkv_) * d_, d = d_;
  const T* const wq = p.ptr(q_norm_);
  const T* const wk = p.ptr(k_norm_);
  T* const gq = grads != nullptr && !frozen_ ? grads->ptr(q_norm_) : nullptr;
  T* const gk = gq != nullptr ? grads->ptr(k_norm_) : nullptr;
  const auto head = [&](int64_t n, int64_t h) {
    const int64_t g = h / (qpk + 1), j = h % (qpk + 1);
    return dqkv + n * row + (g * (qpk + 2) + j) * d;
  };
  if (gq != nullptr) {
    // Before dqkv is overwritten. Partial sums over fixed blocks of tokens (whatever the thread
    // count), added in block order: deterministic, in double.
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (N + kBlock - 1) / kBlock;
    std::vector<double> part(static_cast<size_t>(blocks * 2 * d), 0.0);
#pragma omp parallel for schedule(static) if (N * row > kParallelMinWork)
    for (int64_t b = 0; b < blocks; ++b) {
      double* const acc = part.data() + b * 2 * d;
      for (int64_t n = b * kBlock; n < std::min(N, (b + 1) * kBlock); ++n)
        for (int64_t h = 0; h < heads; ++h) {
          double* const a = acc + (h % (qpk + 1) < qpk ? 0 : d);
          const T* const dy = head(n, h);
          const T* const x = saved + (n * heads + h) * d;
          const double r = rstd[n * heads + h];
          for (int64_t i = 0; i < d; ++i) a[i] += static_cast<double>(dy[i]) * x[i] * r;
        }
    }
    for (int64_t f = 0; f < 2 * d; ++f) {
      double sum = 0.0;
      for (int64_t b = 0; b < blocks; ++b) sum += part[static_cast<size_t>(b * 2 * d + f)];
      (f < d ? gq[f] : gk[f - d]) += static_cast<T>(sum);
    }
  }
#pragma omp parallel for schedule(static) if (N * row > kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < heads; ++h) {
      T* const dx = head(n, h);
      const T* const x = saved + (n * heads + h) * d;
      const T* const w = h % (qpk + 1) < qpk ? wq : wk;
      const T r = rstd[n * heads + h];
      double dot = 0.0;
      for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(dx[i]) * w[i] * x[i];
      const T c = static_cast<T>(dot / static_cast<double>(d)) * r * r;
      for (int64_t i = 0; i < d; ++i) dx[i] = r * (dx[i] * w[i] - x[i] * c);
    }
  }
}

template class QkNorm<float>;
template class QkNorm<double>;

}  // namespace longtron::model
