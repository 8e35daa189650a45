// The gradient norm's sum of squares: vectorised, in a fixed order (ops/sum_squares.h).
#include "ops/sum_squares.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "ops/cpu_features.h"
#include "ops/threads.h"

namespace longtron::ops {
namespace {

// The lanes' sum in one fixed order, (l0 + l4) + (l2 + l6) + ((l1 + l5) + (l3 + l7)), for both
// forms of a block.
double add_lanes(const double* l) {
  const double a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  return (a0 + a2) + (a1 + a3);
}

double block_scalar(const float* x, int64_t n) {
  double lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += double(x[i + j]) * double(x[i + j]);
  double s = add_lanes(lane);
  for (; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

// GCC 12 warns (-Wmaybe-uninitialized) inside its own _mm512_cvtps_pd, whose pass-through
// operand is _mm512_undefined_pd() (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// block_scalar's sums in AVX-512F: 8 double lanes. An FMA gives the same bits as the separate
// multiply and add, since the square is exact.
__attribute__((target("avx512f"))) double block_avx512(const float* x, int64_t n) {
  __m512d acc = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    acc = _mm512_fmadd_pd(v, v, acc);
  }
  alignas(64) double lane[8];
  _mm512_store_pd(lane, acc);
  double s = add_lanes(lane);
  for (; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}
#pragma GCC diagnostic pop

}  // namespace

double sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  const auto block = cpu_has("avx512f") ? block_avx512 : block_scalar;
  const int64_t blocks = (n + kSumSquaresBlock - 1) / kSumSquaresBlock;
  if (blocks == 1) return block(x, n);
  std::vector<double> sums(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (n > kParallelMinWorkLarge)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kSumSquaresBlock;
    sums[size_t(b)] = block(x + begin, std::min(kSumSquaresBlock, n - begin));
  }
  double s = 0.0;
  for (const double v : sums) s += v;
  return s;
}

}  // namespace longtron::ops
