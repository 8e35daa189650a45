// GeGLU gate with the tanh approximation of GELU (Shazeer 2020; Hendrycks & Gimpel 2016):
// out = gelu_tanh(a) ⊙ b, Gemma's FFN down(gelu_tanh(gate z) ⊙ up z). The bf16-input kernels are
// swiglu.cpp's, over the same gate (ops/glu_gates.h).
#include <cstdint>

#include "ops/glu_gates.h"
#include "ops/ops.h"

namespace longtron::ops {

template <typename T>
void geglu_tanh_forward(T* out, const T* a, const T* b, int64_t count) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = detail::GeluTanhGate::out(a[i], b[i]);
}

template <typename T>
void geglu_tanh_backward(T* da, T* db, const T* dout, const T* a, const T* b, int64_t count) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    if (da != nullptr) da[i] = detail::GeluTanhGate::da(dout[i], a[i], b[i]);
    if (db != nullptr) db[i] = detail::GeluTanhGate::db(dout[i], a[i]);
  }
}

#define LONGTRON_INSTANTIATE(T)                                             \
  template void geglu_tanh_forward<T>(T*, const T*, const T*, int64_t);     \
  template void geglu_tanh_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
