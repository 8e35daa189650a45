// The row steps of attention_rows.h for the bf16 kernel (attention_bf16.cpp), on one score tile
// row of at most 64 keys held in four AVX-512 vectors (straight from the S = QKᵀ product's
// registers, bf16_tile_blocks.h): the online-softmax update writes P straight to bf16, and the
// backward turns two score rows at once into bf16 dS rows and the pairs of rows its transposed
// products read. Fusing the exp with the rounding and packing removes the fp32 P/dS round trips
// through memory, which at head_dim 64 cost as much as the tile products.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "ops/bf16_tile_gemm.h"
#include "ops/fast_math.h"

// GCC 12 reports the unmasked AVX-512 intrinsics' _mm512_undefined_ps() pass-through operand as
// maybe uninitialised where they are inlined (GCC bug 105593); it is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace longtron::ops::detail {

/// fast_exp on 16 lanes: the same Cody–Waite split and degree-6 polynomial, 2ⁿ applied by
/// vscalefps; lanes below −87 give 0 (masked scores rely on it).
LONGTRON_BF16_TARGET inline __m512 exp_ps(__m512 x) {
  const __m512 c = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), c);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __mmask16 above = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  return _mm512_maskz_mov_ps(above, _mm512_scalef_ps(p, n));
}

/// Lane masks of the visible keys [lo, hi) of a 64-key tile, 16 keys per vector.
struct VisibleLanes {
  __mmask16 v[4];
  VisibleLanes(int64_t lo, int64_t hi) {
    const uint64_t below_hi = hi >= 64 ? ~uint64_t(0) : (uint64_t(1) << hi) - 1;
    const uint64_t below_lo = lo >= 64 ? ~uint64_t(0) : (uint64_t(1) << lo) - 1;
    const uint64_t bits = lo < hi ? below_hi & ~below_lo : 0;
    for (int i = 0; i < 4; ++i) v[i] = static_cast<__mmask16>(bits >> (16 * i));
  }
};

/// Two fp32 vectors (a: keys 0–15 of the pair, b: 16–31) as 32 bf16 values in key order.
LONGTRON_BF16_TARGET inline __m512i round_two(__m512 a, __m512 b) {
  return (__m512i)_mm512_cvtne2ps_pbh(b, a);
}

/// Words (row a key j, row b key j) for 16 keys: row a in the low halves (pairs along K).
LONGTRON_BF16_TARGET inline __m512i pair_words(__m512 a, __m512 b) {
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                       6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/// softmax_row_update on a row of at most 64 scores x (visible lanes vis), writing P rounded to
/// bf16 into prow[0, 64) (zeros outside the visible keys) instead of back into the scores; the sum
/// l takes the fp32 P, as FlashAttention-2's bf16 kernels do. Returns the output accumulator's
/// factor exp(m_old − m_new) (1 when the row sees nothing here).
LONGTRON_BF16_TARGET inline float softmax_row_bf16(const __m512 (&x)[4], const VisibleLanes& vis,
                                                   float scale, float& m, float& l,
                                                   bf16_t* prow) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 y[4];
  for (int i = 0; i < 4; ++i) y[i] = _mm512_mask_mov_ps(neg_inf, vis.v[i], x[i]);
  const float row_max =
      _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(y[0], y[1]), _mm512_max_ps(y[2], y[3])));
  if (row_max == -__builtin_inff()) {  // nothing visible
    _mm512_storeu_si512(prow, _mm512_setzero_si512());
    _mm512_storeu_si512(prow + 32, _mm512_setzero_si512());
    return 1.0f;
  }
  const float m_new = m > row_max * scale ? m : row_max * scale;
  const float alpha = fast_exp(m - m_new);  // m = −inf on the first visible block → 0
  const __m512 vscale = _mm512_set1_ps(scale), vm = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    y[i] = _mm512_maskz_mov_ps(vis.v[i], exp_ps(_mm512_fmsub_ps(y[i], vscale, vm)));
    sum = _mm512_add_ps(sum, y[i]);
  }
  _mm512_storeu_si512(prow, round_two(y[0], y[1]));
  _mm512_storeu_si512(prow + 32, round_two(y[2], y[3]));
  l = l * alpha + _mm512_reduce_add_ps(sum);
  m = m_new;
  return alpha;
}

/// What dscores_row needs of one query row besides its scores: dP (fp32, the row's 64 keys), the
/// visible lanes, lse and D.
struct ScoreRow {
  const float* dp;
  VisibleLanes vis;
  float lse, delta;
};

/// P = exp(scale·s − lse) and dS = P ∘ (dP − D) · scale for 16 keys of row r (0 where masked).
LONGTRON_BF16_TARGET inline void dscores_vector(__m512 s, const ScoreRow& r, int i, __m512 scale,
                                                __m512& p, __m512& ds) {
  const __mmask16 k = r.vis.v[i];
  const __m512 dp = _mm512_maskz_loadu_ps(k, r.dp + 16 * i);
  p = _mm512_maskz_mov_ps(k, exp_ps(_mm512_fmsub_ps(s, scale, _mm512_set1_ps(r.lse))));
  ds = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(dp, _mm512_set1_ps(r.delta))), scale);
}

/// dscores_row on rows a and b of a tile (scores sa, sb; 64 keys each), rounded to bf16 on the way
/// out: dS rows into ds_a, ds_b ([64] each, zeros past the visible keys; ds_b untouched when b is
/// null) and words (row a, row b) of P and dS into p_words, ds_words ([64] each; row b = 0 when
/// null), the B operands of dVᵀ = dOᵀP and dKᵀ = QᵀdS.
LONGTRON_BF16_TARGET inline void dscores_rows_bf16(const __m512 (&sa)[4], const ScoreRow& a,
                                                   const __m512* sb, const ScoreRow* b,
                                                   float scale, bf16_t* ds_a, bf16_t* ds_b,
                                                   uint32_t* p_words, uint32_t* ds_words) {
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 ds_a_v[4], ds_b_v[4];
  for (int i = 0; i < 4; ++i) {
    __m512 pa, pb = _mm512_setzero_ps();
    dscores_vector(sa[i], a, i, vscale, pa, ds_a_v[i]);
    ds_b_v[i] = _mm512_setzero_ps();
    if (b != nullptr) dscores_vector(sb[i], *b, i, vscale, pb, ds_b_v[i]);
    _mm512_storeu_si512(p_words + 16 * i, pair_words(pa, pb));
    _mm512_storeu_si512(ds_words + 16 * i, pair_words(ds_a_v[i], ds_b_v[i]));
  }
  _mm512_storeu_si512(ds_a, round_two(ds_a_v[0], ds_a_v[1]));
  _mm512_storeu_si512(ds_a + 32, round_two(ds_a_v[2], ds_a_v[3]));
  if (b == nullptr) return;
  _mm512_storeu_si512(ds_b, round_two(ds_b_v[0], ds_b_v[1]));
  _mm512_storeu_si512(ds_b + 32, round_two(ds_b_v[2], ds_b_v[3]));
}

}  // namespace longtron::ops::detail

#pragma GCC diagnostic pop
