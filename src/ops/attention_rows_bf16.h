// The row steps of attention_rows.h for the bf16 kernel (attention_bf16.cpp), on one score tile
// row of at most 64 keys held in four AVX-512 vectors (straight from the S = QKᵀ product's
// registers, bf16_tile_blocks.h): the online-softmax update writes P straight to bf16, and the
// backward turns two score rows at once into bf16 dS rows and the pairs of rows its transposed
// products read. Fusing the exp with the rounding and packing removes the fp32 P/dS round trips
// through memory, which at head_dim 64 cost as much as the tile products.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "ops/attention_blocks.h"
#include "ops/bf16_tile_gemm.h"

// GCC 12 reports the unmasked AVX-512 intrinsics' _mm512_undefined_ps() pass-through operand as
// maybe uninitialised where they are inlined (GCC bug 105593); it is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace longtron::ops::detail::LONGTRON_BF16_ISA {

/// log2(e) and ln(2): the bf16 kernel keeps scores, running maxima and lse in base 2 inside its
/// row steps (exp(x) = 2^(x·log2 e)), which saves the Cody–Waite split of every exp.
constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;

/// 2^x on 16 lanes: n = round(x), 2^(x − n) by a degree-4 polynomial fitted for least relative
/// error on [−½, ½] (≤ 2.7e-6 evaluated in fp32; P and dS are rounded to bf16, 2^-9 apart, so the
/// degree-6 Cephes polynomial's 2e-7 bought nothing here, for two more FMAs per vector), 2ⁿ
/// applied by vscalefps (results below 2^-149 flush to 0). For finite x or −inf with the lane
/// masked afterwards (−inf gives NaN): the callers mask invisible keys.
LONGTRON_BF16_TARGET inline __m512 exp2_ps(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(9.5701014342e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5917860282e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4024744840e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9312181474e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.9999926144e-1f));
  return _mm512_scalef_ps(p, n);
}

/// Two fp32 vectors (a: keys 0–15 of the pair, b: 16–31) as 32 bf16 values in key order.
LONGTRON_BF16_TARGET inline __m512i round_two(__m512 a, __m512 b) {
  return round_32(b, a);
}

/// Words (row a key j, row b key j) for 16 keys: row a in the low halves (pairs along K).
LONGTRON_BF16_TARGET inline __m512i pair_words(__m512 a, __m512 b) {
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                       6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, round_32(b, a));
}

/// The row step of softmax_row_update on a row of at most 64 scores x (visible lanes vis), in
/// base 2 (scale2 = scale · log2 e): m becomes the new running max of scale2·x (m_old keeps the
/// previous one), P = 2^(scale2·x − m) rounded to bf16 goes into prow[0, 64) (zeros outside the
/// visible keys), and sum gets the row sum of the fp32 P (as FlashAttention-2's bf16 kernels sum
/// it). The factor 2^(m_old − m) and l are left to finish_online_softmax, 16 rows at a time. The
/// max stays in all lanes (no round trip through a scalar register).
LONGTRON_BF16_TARGET inline void softmax_row_bf16(const __m512 (&x)[4], const KeyLanes& vis,
                                                  float scale2, float& m, float& m_old,
                                                  float& sum, bf16_t* prow) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 y[4];
  for (int i = 0; i < 4; ++i) y[i] = _mm512_mask_mov_ps(neg_inf, vis.v[i], x[i]);
  __m512 mx = _mm512_max_ps(_mm512_max_ps(y[0], y[1]), _mm512_max_ps(y[2], y[3]));
  mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, 0x4E));  // halves
  mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, 0xB1));  // quarters
  mx = _mm512_max_ps(mx, _mm512_permute_ps(mx, 0x4E));         // pairs within 128 bits
  mx = _mm512_max_ps(mx, _mm512_permute_ps(mx, 0xB1));         // neighbours
  const __m512 vscale = _mm512_set1_ps(scale2);
  // m_new = max(m, scale2·max); −inf when nothing was visible yet (the lanes below are all masked)
  const __m512 vm = _mm512_max_ps(_mm512_set1_ps(m), _mm512_mul_ps(mx, vscale));
  __m512 total = _mm512_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    y[i] = _mm512_maskz_mov_ps(vis.v[i], exp2_ps(_mm512_fmsub_ps(y[i], vscale, vm)));
    total = _mm512_add_ps(total, y[i]);
  }
  _mm512_storeu_si512(prow, round_two(y[0], y[1]));
  _mm512_storeu_si512(prow + 32, round_two(y[2], y[3]));
  m_old = m;
  m = _mm_cvtss_f32(_mm512_castps512_ps128(vm));
  sum = _mm512_reduce_add_ps(total);
}

/// Finishes the online-softmax step of rows [0, n) (FlashAttention-2, Algorithm 1): alpha =
/// 2^(m_old − m) (base-2 maxima), the factor of each row's output accumulator (1 while a row has seen nothing,
/// m = −inf), and l = l · alpha + sum. m_old is overwritten by alpha.
LONGTRON_BF16_TARGET inline void finish_online_softmax(int64_t n, const float* m,
                                                       float* m_old_alpha, const float* sum,
                                                       float* l) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 vm = _mm512_maskz_loadu_ps(k, m + i);
    const __m512 seen = _mm512_maskz_loadu_ps(k, m_old_alpha + i);
    // 0 on a row's first visible block (m_old = −inf); rows still at −inf keep the factor 1
    const __mmask16 any = _mm512_cmp_ps_mask(vm, neg_inf, _CMP_NEQ_OQ);
    const __mmask16 before = _mm512_cmp_ps_mask(seen, neg_inf, _CMP_NEQ_OQ);
    const __m512 alpha = _mm512_mask_mov_ps(
        _mm512_set1_ps(1.0f), any, _mm512_maskz_mov_ps(before, exp2_ps(_mm512_sub_ps(seen, vm))));
    const __m512 vl = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, l + i), alpha,
                                      _mm512_maskz_loadu_ps(k, sum + i));
    _mm512_mask_storeu_ps(m_old_alpha + i, k, alpha);
    _mm512_mask_storeu_ps(l + i, k, vl);
  }
}

/// What dscores_row needs of one query row besides its scores: dP (fp32, the row's 64 keys), the
/// visible lanes, lse in base 2 (lse · log2 e) and D.
struct ScoreRow {
  const float* dp;
  KeyLanes vis;
  float lse2, delta;
  float scale;  // the softmax scale (dS = P ∘ (dP·scale − D·scale))
};

/// P = exp(scale·s − lse) = 2^(scale2·s − lse2) and dS = P ∘ (dP·scale − D·scale) for 16 keys of row
/// r (0 where masked).
LONGTRON_BF16_TARGET inline void dscores_vector(__m512 s, const ScoreRow& r, int i, __m512 scale2,
                                                __m512 scale, __m512& p, __m512& ds) {
  const __mmask16 k = r.vis.v[i];
  const __m512 dp = _mm512_maskz_loadu_ps(k, r.dp + 16 * i);
  p = _mm512_maskz_mov_ps(k, exp2_ps(_mm512_fmsub_ps(s, scale2, _mm512_set1_ps(r.lse2))));
  ds = _mm512_mul_ps(p, _mm512_fmsub_ps(dp, scale, _mm512_set1_ps(r.delta * r.scale)));
}

/// dscores_row on rows a and b of a tile (scores sa, sb; 64 keys each), rounded to bf16 on the way
/// out: dS rows into ds_a, ds_b ([64] each, zeros past the visible keys; ds_b untouched when b is
/// null) and words (row a, row b) of P and dS into p_words, ds_words ([64] each; row b = 0 when
/// null), the B operands of dVᵀ = dOᵀP and dKᵀ = QᵀdS.
LONGTRON_BF16_TARGET inline void dscores_rows_bf16(const __m512 (&sa)[4], const ScoreRow& a,
                                                   const __m512* sb, const ScoreRow* b,
                                                   float scale, bf16_t* ds_a, bf16_t* ds_b,
                                                   uint32_t* p_words, uint32_t* ds_words) {
  const __m512 vscale = _mm512_set1_ps(scale), vscale2 = _mm512_set1_ps(scale * kLog2e);
  __m512 ds_a_v[4], ds_b_v[4];
  for (int i = 0; i < 4; ++i) {
    __m512 pa, pb = _mm512_setzero_ps();
    dscores_vector(sa[i], a, i, vscale2, vscale, pa, ds_a_v[i]);
    ds_b_v[i] = _mm512_setzero_ps();
    if (b != nullptr) dscores_vector(sb[i], *b, i, vscale2, vscale, pb, ds_b_v[i]);
    _mm512_storeu_si512(p_words + 16 * i, pair_words(pa, pb));
    _mm512_storeu_si512(ds_words + 16 * i, pair_words(ds_a_v[i], ds_b_v[i]));
  }
  _mm512_storeu_si512(ds_a, round_two(ds_a_v[0], ds_a_v[1]));
  _mm512_storeu_si512(ds_a + 32, round_two(ds_a_v[2], ds_a_v[3]));
  if (b == nullptr) return;
  _mm512_storeu_si512(ds_b, round_two(ds_b_v[0], ds_b_v[1]));
  _mm512_storeu_si512(ds_b + 32, round_two(ds_b_v[2], ds_b_v[3]));
}

}  // namespace longtron::ops::detail::LONGTRON_BF16_ISA

#pragma GCC diagnostic pop
