// Register-block pieces that the fp32 forward and backward (attention_f32_blocks.h) and the bf16
// kernel (attention_rows_bf16.h, attention_bf16.cpp) share: base-2 exp, the lane masks of a
// 64-key tile row, the online-softmax row step (FlashAttention-2, Algorithm 1) on a row of
// scores in registers, the backward's P and dS of 16 keys (Algorithm 2), and the output
// accumulator's rescale folded into the store of the PV product (Algorithm 1 line 10). AVX-512F
// by target attribute, so that the bf16 kernel (built without -march) and the fp32 one (built
// with it) inline the same code; what only one of them may run (the bf16 instructions) stays in
// its own files.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "ops/attention_plan.h"
#include "ops/kernel_isa.h"

// GCC 12 reports the unmasked AVX-512 intrinsics' _mm512_undefined_ps() pass-through operand as
// maybe uninitialised where they are inlined (GCC bug 105593); it is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#define LONGTRON_AVX512F_TARGET __attribute__((target("avx512f")))

LONGTRON_ISA_BEGIN

/// log2(e) and ln(2): the register-block kernels keep scores, running maxima and lse in base 2
/// inside their row steps (exp(x) = 2^(x·log2 e)), which saves the Cody–Waite split of every exp.
constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;

/// 2^x on 16 lanes: n = round(x), 2^(x − n) by a polynomial fitted for least relative error on
/// [−½, ½], 2ⁿ applied by vscalefps (results below 2^-149 flush to 0). Degree 5 (≤ 2.1e-7
/// evaluated in fp32, as Cephes exp2f's degree 6) for the fp32 kernels; degree 4 (≤ 2.7e-6) for
/// the bf16 kernel, whose P and dS are rounded to bf16 (2^-9 apart) right after. For finite x,
/// or −inf with the lane masked afterwards (−inf gives NaN): the callers mask invisible keys.
template <int Degree>
LONGTRON_AVX512F_TARGET inline __m512 exp2_poly(__m512 x) {
  static_assert(Degree == 4 || Degree == 5, "fitted polynomials of degree 4 and 5 only");
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 p;
  if constexpr (Degree == 5) {
    p = _mm512_set1_ps(1.3276471484e-3f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6755413263e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5507132750e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022119724e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314696706e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0000000717e+00f));
  } else {
    p = _mm512_set1_ps(9.5701014342e-3f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5917860282e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4024744840e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9312181474e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.9999926144e-1f));
  }
  return _mm512_scalef_ps(p, n);
}

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

/// Which of the keys [c0, c0 + n) (n ≤ 64) the queries [r0, r0 + bi) of a segment see, as lanes.
/// Where every query sees all of them (most tiles off the diagonal), one set of lanes serves all
/// rows and the per-row bounds are skipped.
struct TileVisibility {
  const AttnPlan* plan;
  const AttnSegment* g;
  int64_t c0, n;
  bool full;  // key_lo is non-decreasing and key_hi increasing in the query position
  KeyLanes all;
  TileVisibility(const AttnPlan& p, const AttnSegment& seg, int64_t r0, int64_t bi, int64_t c0_,
                 int64_t n_)
      : plan(&p), g(&seg), c0(c0_), n(n_),
        full(p.key_lo(seg, r0 + bi - 1) <= c0_ && p.key_hi(seg, r0) >= c0_ + n_), all(0, n_) {}
  /// Lanes of query r (segment position).
  KeyLanes row(int64_t r) const {
    if (full) return all;
    return KeyLanes(std::clamp<int64_t>(plan->key_lo(*g, r) - c0, 0, n),
                    std::clamp<int64_t>(plan->key_hi(*g, r) - c0, 0, n));
  }
};

/// The online-softmax step (FlashAttention-2, Algorithm 1) of one row of at most 64 scores, the
/// first NV vectors of y (straight from a register block of S = QKᵀ), in base 2 (scale2 = scale ·
/// log2 e): m becomes the new running max of scale2 · s (m_old keeps the previous one), y becomes
/// P = 2^(scale2 · s − m) in fp32 (0 outside the visible lanes `vis` and in the vectors from NV
/// on), and sum P's row sum. The factor 2^(m_old − m) and l are left to finish_online_softmax,
/// 16 rows at a time. The max stays in all lanes (no round trip through a scalar register).
template <int Degree, int NV>
LONGTRON_AVX512F_TARGET inline void online_softmax_row(__m512 (&y)[4], const KeyLanes& vis,
                                                       float scale2, float& m, float& m_old,
                                                       float& sum) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  for (int v = 0; v < 4; ++v) y[v] = v < NV ? _mm512_mask_mov_ps(neg_inf, vis.v[v], y[v]) : neg_inf;
  __m512 mx = _mm512_max_ps(_mm512_max_ps(y[0], y[1]), _mm512_max_ps(y[2], y[3]));
  mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, 0x4E));  // halves
  mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, 0xB1));  // quarters
  mx = _mm512_max_ps(mx, _mm512_permute_ps(mx, 0x4E));         // pairs within 128 bits
  mx = _mm512_max_ps(mx, _mm512_permute_ps(mx, 0xB1));         // neighbours
  const __m512 vscale = _mm512_set1_ps(scale2);
  // m_new = max(m, scale2·max); −inf when nothing was visible yet (the lanes below are all masked)
  const __m512 vm = _mm512_max_ps(_mm512_set1_ps(m), _mm512_mul_ps(mx, vscale));
  __m512 total = _mm512_setzero_ps();
  for (int v = 0; v < 4; ++v) {
    if (v < NV) {
      y[v] = _mm512_maskz_mov_ps(vis.v[v], exp2_poly<Degree>(_mm512_fmsub_ps(y[v], vscale, vm)));
      total = _mm512_add_ps(total, y[v]);
    } else {
      y[v] = _mm512_setzero_ps();
    }
  }
  m_old = m;
  m = _mm_cvtss_f32(_mm512_castps512_ps128(vm));
  sum = _mm512_reduce_add_ps(total);
}

/// Finishes the online-softmax step of rows [0, n) (FlashAttention-2, Algorithm 1): alpha =
/// 2^(m_old − m) (base-2 maxima), the factor of each row's output accumulator (0 on a row's first
/// visible block, 1 while a row has seen nothing, m = −inf), and l = l · alpha + sum. m_old is
/// overwritten by alpha.
template <int Degree>
LONGTRON_AVX512F_TARGET inline void finish_online_softmax(int64_t n, const float* m,
                                                          float* m_old_alpha, const float* sum,
                                                          float* l) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k =
        n - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 vm = _mm512_maskz_loadu_ps(k, m + i);
    const __m512 seen = _mm512_maskz_loadu_ps(k, m_old_alpha + i);
    const __mmask16 any = _mm512_cmp_ps_mask(vm, neg_inf, _CMP_NEQ_OQ);
    const __mmask16 before = _mm512_cmp_ps_mask(seen, neg_inf, _CMP_NEQ_OQ);
    const __m512 alpha =
        _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), any,
                           _mm512_maskz_mov_ps(before, exp2_poly<Degree>(_mm512_sub_ps(seen, vm))));
    const __m512 vl = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, l + i), alpha,
                                      _mm512_maskz_loadu_ps(k, sum + i));
    _mm512_mask_storeu_ps(m_old_alpha + i, k, alpha);
    _mm512_mask_storeu_ps(l + i, k, vl);
  }
}

/// The backward's P and dS (FlashAttention-2, Algorithm 2) for 16 keys of one row: P =
/// exp(scale·S − lse) = 2^(scale2·S − lse2) (lse2 = lse · log2 e; 0 outside the lanes `vis`) and
/// dS = P ∘ (dP·scale − D·scale) (dscaled = D · scale), from the scores s and dP dp.
template <int Degree>
LONGTRON_AVX512F_TARGET inline void dscores_vector(__m512 s, __m512 dp, __mmask16 vis,
                                                   __m512 scale2, __m512 scale, __m512 lse2,
                                                   __m512 dscaled, __m512& p, __m512& ds) {
  p = _mm512_maskz_mov_ps(vis, exp2_poly<Degree>(_mm512_fmsub_ps(s, scale2, lse2)));
  ds = _mm512_mul_ps(p, _mm512_fmsub_ps(dp, scale, dscaled));
}

/// O = diag(alpha) · O + P V folded into the store of the PV product's register blocks (o [rows,
/// n] fp32, alpha per row); on the item's first key block (`first`) O = P V is written, so O needs
/// no zero fill.
struct RescaleAdd {
  float* o;
  int64_t n;
  const float* alpha;
  bool first;
  template <int R, int NV>
  LONGTRON_AVX512F_TARGET void block(int64_t i, int64_t j, const __m512 (&acc)[R][NV]) {
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

LONGTRON_ISA_END

#pragma GCC diagnostic pop
