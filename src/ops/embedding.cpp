// Token embedding: a row gather forward, a scatter-add backward.
#include <cstring>

#include "ops/ops.h"

namespace longtron::ops {

template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    std::memcpy(out + n * H, table + static_cast<int64_t>(ids[n]) * H, sizeof(T) * H);
  }
}

template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* ids, int64_t N, int64_t H) {
  // Repeated ids add into the same row, so threads split the hidden dimension (blocks of 64
  // columns), never the tokens: no two threads touch the same element.
  const int64_t blocks = (H + 63) / 64;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * 64, end = begin + 64 < H ? begin + 64 : H;
    for (int64_t n = 0; n < N; ++n) {
      T* row = dtable + static_cast<int64_t>(ids[n]) * H;
      const T* g = dout + n * H;
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) row[i] += g[i];
    }
  }
}

#define LONGTRON_INSTANTIATE(T)                                                            \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t); \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
