// Final logit soft-capping (Gemma 2 and Gemma 3; Transformers' Gemma3ForCausalLM):
// logits = cap · tanh(logits / cap), bounding every logit to (−cap, cap).
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::ops {

template <typename T>
void logit_softcap_forward(T* x, int64_t count, T cap) {
  check(cap > T(0), "logit_softcap_forward: the cap must be positive, got {}", cap);
  const T inv = T(1) / cap;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

template <typename T>
void logit_softcap_backward(T* dx, const T* capped, int64_t count, T cap) {
  check(cap > T(0), "logit_softcap_backward: the cap must be positive, got {}", cap);
  const T inv = T(1) / cap;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const T t = capped[i] * inv;
    dx[i] *= T(1) - t * t;
  }
}

#define LONGTRON_INSTANTIATE(T)                                     \
  template void logit_softcap_forward<T>(T*, int64_t, T);           \
  template void logit_softcap_backward<T>(T*, const T*, int64_t, T);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
