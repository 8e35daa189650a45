// SwiGLU gate (Shazeer 2020): out = silu(a) ⊙ b, the InternLM2 FFN w2(silu(w1 z) ⊙ w3 z); and
// the bf16-input kernels of both gates, SwiGLU's and GeGLU's (ops/glu_gates.h).
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/bf16.h"
#include "core/error.h"
#include "ops/for_blocks.h"
#include "ops/glu_gates.h"
#include "ops/ops.h"

namespace longtron::ops {

template <typename T>
void swiglu_forward(T* out, const T* a, const T* b, int64_t count) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = detail::SiluGate::out(a[i], b[i]);
}

template <typename T>
void swiglu_backward(T* da, T* db, const T* dout, const T* a, const T* b, int64_t count) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    if (da != nullptr) da[i] = detail::SiluGate::da(dout[i], a[i], b[i]);
    if (db != nullptr) db[i] = detail::SiluGate::db(dout[i], a[i]);
  }
}

namespace {
// The bf16-input forward of gate `Gate` (detail::SiluGate, detail::GeluTanhGate) over elements
// [begin, end) (at most kForBlock of them); out = nullptr: the floats only in a block of this
// thread's stack, rounded into out16 from there.
template <typename Gate>
void glu_forward_bf16_block(float* out, const uint16_t* a, const uint16_t* b, int64_t begin,
                            int64_t end, uint16_t* out16) {
  float local[kForBlock];
  float* const o = out != nullptr ? out + begin : local;
  const int64_t n = end - begin;
  a += begin, b += begin;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = Gate::out(bf16_to_float(a[i]), bf16_to_float(b[i]));
  if (out16 != nullptr) round_to_bf16_serial(o, n, out16 + begin);
}

template <typename Gate>
void glu_forward_bf16(float* out, const uint16_t* a, const uint16_t* b, int64_t count,
                      uint16_t* out16) {
  check(out != nullptr || out16 != nullptr, "the bf16 GLU forward: neither out nor out16");
  for_blocks(count, [&](int64_t begin, int64_t end) {
    glu_forward_bf16_block<Gate>(out, a, b, begin, end, out16);
  });
}

template <typename Gate>
void glu_forward_saving_bf16(float* out, const float* a, const float* b, uint16_t* a16,
                             uint16_t* b16, int64_t count, uint16_t* out16) {
  for_blocks(count, [&](int64_t begin, int64_t end) {
    round_to_bf16_serial(a + begin, end - begin, a16 + begin);
    round_to_bf16_serial(b + begin, end - begin, b16 + begin);
    glu_forward_bf16_block<Gate>(out, a16, b16, begin, end, out16);
  });
}

template <typename Gate>
void glu_backward_bf16(float* da, float* db, const float* dout, const uint16_t* a,
                       const uint16_t* b, int64_t count, uint16_t* da16, uint16_t* db16) {
  for_blocks(count, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float x = bf16_to_float(a[i]), y = bf16_to_float(b[i]), g = dout[i];
      da[i] = Gate::da(g, x, y);
      db[i] = Gate::db(g, x);
    }
    if (da16 != nullptr) round_to_bf16_serial(da + begin, end - begin, da16 + begin);
    if (db16 != nullptr) round_to_bf16_serial(db + begin, end - begin, db16 + begin);
  });
}
}  // namespace

void swiglu_forward_bf16(float* out, const uint16_t* a, const uint16_t* b, int64_t count,
                         uint16_t* out16) {
  glu_forward_bf16<detail::SiluGate>(out, a, b, count, out16);
}

void swiglu_forward_saving_bf16(float* out, const float* a, const float* b, uint16_t* a16,
                                uint16_t* b16, int64_t count, uint16_t* out16) {
  glu_forward_saving_bf16<detail::SiluGate>(out, a, b, a16, b16, count, out16);
}

void swiglu_backward_bf16(float* da, float* db, const float* dout, const uint16_t* a,
                          const uint16_t* b, int64_t count, uint16_t* da16, uint16_t* db16) {
  glu_backward_bf16<detail::SiluGate>(da, db, dout, a, b, count, da16, db16);
}

void geglu_tanh_forward_bf16(float* out, const uint16_t* a, const uint16_t* b, int64_t count,
                             uint16_t* out16) {
  glu_forward_bf16<detail::GeluTanhGate>(out, a, b, count, out16);
}

void geglu_tanh_forward_saving_bf16(float* out, const float* a, const float* b, uint16_t* a16,
                                    uint16_t* b16, int64_t count, uint16_t* out16) {
  glu_forward_saving_bf16<detail::GeluTanhGate>(out, a, b, a16, b16, count, out16);
}

void geglu_tanh_backward_bf16(float* da, float* db, const float* dout, const uint16_t* a,
                              const uint16_t* b, int64_t count, uint16_t* da16, uint16_t* db16) {
  glu_backward_bf16<detail::GeluTanhGate>(da, db, dout, a, b, count, da16, db16);
}

#define LONGTRON_INSTANTIATE(T)                                                \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t);            \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
