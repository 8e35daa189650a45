// Cross-entropy over the vocabulary with ignore_index −100 (PyTorch semantics), carried as
// (loss sum, valid-token count) until the step ends (Marian). Rows are independent, so threads
// split the rows; the loss sum is reduced in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/ignore_index.h"
#include "ops/fast_math.h"
#include "ops/ops.h"

namespace longtron::ops {

namespace {

// log Σ_v exp(row[v]), stable: max first, then the sum of exp(row − max) in double.
template <typename T>
T row_logsumexp(const T* row, int64_t V) {
  T max = row[0];
#pragma omp simd reduction(max : max)
  for (int64_t v = 0; v < V; ++v) max = row[v] > max ? row[v] : max;
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t v = 0; v < V; ++v) sum += static_cast<double>(detail::fast_exp(row[v] - max));
  return static_cast<T>(static_cast<double>(max) + std::log(sum));
}
// Every label is a vocabulary index or the ignore index; errors name the first bad token.
void check_labels(const int32_t* labels, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    check(labels[n] == kIgnoreIndex || (labels[n] >= 0 && labels[n] < V),
          "cross_entropy: label {} at token {} is outside [0, {}) and is not -100", labels[n], n,
          V);
  }
}
}  // namespace

template <typename T>
double cross_entropy_forward(T* lse, int64_t* count, const T* logits, const int32_t* labels,
                             int64_t N, int64_t V) {
  check_labels(labels, N, V);
  double loss = 0.0;
  int64_t valid = 0;
#pragma omp parallel for schedule(static) reduction(+ : loss, valid)
  for (int64_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    lse[n] = row_logsumexp(row, V);
    if (labels[n] == kIgnoreIndex) continue;
    loss += static_cast<double>(lse[n]) - static_cast<double>(row[labels[n]]);
    ++valid;
  }
  if (count != nullptr) *count = valid;
  return loss;
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* labels,
                            int64_t N, int64_t V, T scale) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* d = dlogits + n * V;
    if (labels[n] == kIgnoreIndex) {
      for (int64_t v = 0; v < V; ++v) d[v] = T(0);
      continue;
    }
    const T* row = logits + n * V;
    const T l = lse[n];
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d[v] = scale * detail::fast_exp(row[v] - l);
    d[labels[n]] -= scale;
  }
}

double cross_entropy_forward_backward_bf16(uint16_t* dlogits16, float* lse, int64_t* count,
                                           const float* logits, const int32_t* labels, int64_t N,
                                           int64_t V, float scale) {
  check_labels(labels, N, V);
  double loss = 0.0;
  int64_t valid = 0;
  // The rows split as in cross_entropy_forward (so the same partial sums of the loss); each
  // row's gradient is made in an fp32 row of this thread's (cache-resident) and rounded from it.
#pragma omp parallel reduction(+ : loss, valid)
  {
    thread_local std::vector<float> grad;
    grad.resize(static_cast<size_t>(V));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* row = logits + n * V;
      uint16_t* d16 = dlogits16 + n * V;
      lse[n] = row_logsumexp(row, V);
      if (labels[n] == kIgnoreIndex) {
        std::fill(d16, d16 + V, uint16_t{0});
        continue;
      }
      loss += static_cast<double>(lse[n]) - static_cast<double>(row[labels[n]]);
      ++valid;
      float* d = grad.data();
      const float l = lse[n];
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) d[v] = scale * detail::fast_exp(row[v] - l);
      d[labels[n]] -= scale;
      round_to_bf16_serial(d, V, d16);
    }
  }
  if (count != nullptr) *count = valid;
  return loss;
}

#define LONGTRON_INSTANTIATE(T)                                                                \
  template double cross_entropy_forward<T>(T*, int64_t*, const T*, const int32_t*, int64_t,    \
                                           int64_t);                                           \
  template void cross_entropy_backward<T>(T*, const T*, const T*, const int32_t*, int64_t,     \
                                          int64_t, T);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
