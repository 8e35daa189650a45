// Register-block pieces that the fp32 forward (attention_f32_blocks.h) and the bf16 kernel
// (attention_rows_bf16.h, attention_bf16.cpp) share: the lane masks of a 64-key tile row and the
// output accumulator's rescale folded into the store of the PV product (FlashAttention-2,
// Algorithm 1 line 10). AVX-512F by target attribute, so that the bf16 kernel (built without
// -march) and the fp32 one (built with it) inline the same code.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

// GCC 12 reports the unmasked AVX-512 intrinsics' _mm512_undefined_ps() pass-through operand as
// maybe uninitialised where they are inlined (GCC bug 105593); it is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace longtron::ops::detail {

/// Lane masks of the keys [lo, hi) of a 64-key tile, 16 keys per vector.
struct KeyLanes {
  __mmask16 v[4];
  KeyLanes(int64_t lo, int64_t hi) {
    const uint64_t below_hi = hi >= 64 ? ~uint64_t(0) : (uint64_t(1) << hi) - 1;
    const uint64_t below_lo = lo >= 64 ? ~uint64_t(0) : (uint64_t(1) << lo) - 1;
    const uint64_t bits = lo < hi ? below_hi & ~below_lo : 0;
    for (int i = 0; i < 4; ++i) v[i] = static_cast<__mmask16>(bits >> (16 * i));
  }
};

/// O = diag(alpha) · O + P V folded into the store of the PV product's register blocks (o [rows,
/// n] fp32, alpha per row); on the item's first key block (`first`) O = P V is written, so O needs
/// no zero fill.
struct RescaleAdd {
  float* o;
  int64_t n;
  const float* alpha;
  bool first;
  template <int R, int NV>
  __attribute__((target("avx512f"))) void block(int64_t i, int64_t j,
                                                const __m512 (&acc)[R][NV]) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(alpha[i + r]);
      for (int v = 0; v < NV; ++v) {
        const int64_t cols = std::clamp<int64_t>(n - j - 16 * v, 0, 16);
        const __mmask16 k = static_cast<__mmask16>((1u << cols) - 1);
        float* c = o + (i + r) * n + j + 16 * v;
        _mm512_mask_storeu_ps(
            c, k, first ? acc[r][v] : _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, c), a, acc[r][v]));
      }
    }
  }
};

}  // namespace longtron::ops::detail

#pragma GCC diagnostic pop
