// The fp32 attention's register-block epilogues on AVX2 with FMA (ymm, 8 lanes; no AVX-512): the
// counterparts of attention_f32_blocks.h's AVX-512 ones, for the 6-row × 16-key blocks of
// F32x8. Same method (FlashAttention-2, Dao 2023, Algorithms 1 and 2, in base 2), two
// differences forced by the narrower registers:
// - A block holds 16 keys of a row, not the 64 of a key block, and the online-softmax step needs
//   the row's maximum over all of them, so the forward's S blocks are stored (into the P tile,
//   which stays in L1) and the step runs row by row once a row group's S is complete
//   (F32OnlineSoftmax::rows). The backward's P and dS need no row maximum (lse is known) and are
//   made on the blocks in the registers, as on AVX-512.
// - No vscalefps: 2ⁿ is built in the exponent bits (exp2_poly5).
// Compiled into the AVX2 compilation of the kernels (ops/kernel_isa.h), which the caller chooses at
// run time.
#pragma once
#include <immintrin.h>

#include "ops/kernel_isa.h"

#if !LONGTRON_KERNEL_AVX512 && defined(__AVX2__) && defined(__FMA__)

#include <algorithm>
#include <cstdint>

#include "ops/attention_blocks.h"
#include "ops/attention_plan.h"

LONGTRON_ISA_BEGIN
namespace f32x8 {

/// 2^x on 8 lanes: n = round(x), 2^(x − n) by exp2_poly<5>'s polynomial (least relative error on
/// [−½, ½], ≤ 2.1e-7 in fp32), 2ⁿ by adding n to the exponent field. x is clamped below at −127,
/// whose 2ⁿ has a zero exponent field: results below ~2^-126.5 are 0 (AVX-512's vscalefps keeps
/// denormals down to 2^-149; against a row sum ≥ 1 neither matters). −inf and NaN give 0 (the
/// max keeps its second operand when the first is NaN), so masked lanes set to −inf need no mask
/// afterwards. For x ≤ 127; the callers' arguments are ≤ 0 up to rounding (scores minus their
/// maximum, or minus lse).
inline __m256 exp2_poly5(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-127.0f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.3276471484e-3f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(9.6755413263e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.5507132750e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.4022119724e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(6.9314696706e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0000000717e+00f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/// Lanes [8w, 8w + 8) of a 64-key KeyLanes as a vector mask (all ones where the key is visible).
inline __m256 key_lanes8(const KeyLanes& k, int w) {
  const int bits = (k.v[w >> 1] >> (8 * (w & 1))) & 0xFF;
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_castsi256_ps(
      _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits), bit), bit));
}

/// Mask of the lanes 8w + [0, 8) that lie in [lo, hi).
inline __m256 range_lanes8(int64_t lo, int64_t hi, int w) {
  const __m256i lane = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                        _mm256_set1_epi32(8 * w));
  const __m256i ge_lo = _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(static_cast<int>(lo) - 1));
  const __m256i lt_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi)), lane);
  return _mm256_castsi256_ps(_mm256_and_si256(ge_lo, lt_hi));
}

/// Mask of the first n lanes (n ≤ 8), for a row's or a column range's last, partial vector.
inline __m256i first_lanes8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline float horizontal_max(__m256 x) {
  x = _mm256_max_ps(x, _mm256_permute2f128_ps(x, x, 1));  // halves
  x = _mm256_max_ps(x, _mm256_permute_ps(x, 0x4E));       // pairs
  x = _mm256_max_ps(x, _mm256_permute_ps(x, 0xB1));       // neighbours
  return _mm256_cvtss_f32(x);
}

inline float horizontal_sum(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// The online-softmax step (FlashAttention-2, Algorithm 1) of one row of scores y[0, 8·NV8) in
/// memory, in base 2 (scale2 = scale · log2 e): m becomes the new running max of scale2 · s
/// (m_old keeps the previous one), y becomes P = 2^(scale2 · s − m) (0 outside the visible lanes
/// `vis`), sum P's row sum. As online_softmax_row (attention_blocks.h) on AVX-512.
template <int NV8>
inline void online_softmax_row(float* y, const KeyLanes& vis, float scale2, float& m,
                               float& m_old, float& sum) {
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
  __m256 s[NV8];
#pragma GCC unroll 8
  for (int v = 0; v < NV8; ++v)
    s[v] = _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(y + 8 * v), key_lanes8(vis, v));
  __m256 mx = s[0];
#pragma GCC unroll 8
  for (int v = 1; v < NV8; ++v) mx = _mm256_max_ps(mx, s[v]);
  const __m256 vscale = _mm256_set1_ps(scale2);
  // m_new = max(m, scale2·max); −inf when nothing was visible yet (then every P below is 0)
  const float m_new = std::max(m, horizontal_max(mx) * scale2);
  const __m256 vm = _mm256_set1_ps(m_new);
  __m256 total = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int v = 0; v < NV8; ++v) {
    const __m256 p = exp2_poly5(_mm256_fmsub_ps(s[v], vscale, vm));
    _mm256_storeu_ps(y + 8 * v, p);
    total = _mm256_add_ps(total, p);
  }
  m_old = m;
  m = m_new;
  sum = horizontal_sum(total);
}

/// The forward's online-softmax step on the AVX2 blocks: block() stores S into p (stride 64);
/// rows(i0, i1, nv), called once rows [i0, i1) have their S up to key 16·nv, runs the step of
/// each (as F32OnlineSoftmax on AVX-512 does inside block(): the same fields and results), P into
/// p up to key 16·nv; finish() then makes the factors and updates l.
struct F32OnlineSoftmax {
  TileVisibility vis;
  int64_t r0, bi;
  float scale2;
  float *m, *m_old, *sum, *p;
  template <int R, int NV>
  void block(int64_t i, int64_t j, const __m256 (&acc)[R][NV]) {
#pragma GCC unroll 6
    for (int k = 0; k < R; ++k)
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(p + (i + k) * 64 + j + 8 * v, acc[k][v]);
  }
  void rows(int64_t i0, int64_t i1, int64_t nv) {
    switch (nv) {
      case 1: return rows_of<2>(i0, i1);
      case 2: return rows_of<4>(i0, i1);
      case 3: return rows_of<6>(i0, i1);
      default: return rows_of<8>(i0, i1);
    }
  }
  void finish(int64_t M, float* l);

 private:
  template <int NV8>
  void rows_of(int64_t i0, int64_t i1) {
    int64_t r = i0 % bi;
    for (int64_t row = i0; row < i1; ++row) {
      online_softmax_row<NV8>(p + row * 64, vis.row(r0 + r), scale2, m[row], m_old[row], sum[row]);
      if (++r == bi) r = 0;
    }
  }
};

/// finish_online_softmax (attention_blocks.h) on 8 rows at a time: alpha = 2^(m_old − m) into
/// m_old (0 on a row's first visible block, 1 while a row has seen nothing), l = l · alpha + sum.
inline void F32OnlineSoftmax::finish(int64_t M, float* l) {
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff()), one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < M; i += 8) {
    const bool full = M - i >= 8;
    const __m256i k = first_lanes8(M - i);
    const auto load = [&](const float* x) {
      return full ? _mm256_loadu_ps(x + i) : _mm256_maskload_ps(x + i, k);
    };
    const __m256 vm = load(m), seen = load(m_old);
    const __m256 any = _mm256_cmp_ps(vm, neg_inf, _CMP_NEQ_OQ);
    const __m256 before = _mm256_cmp_ps(seen, neg_inf, _CMP_NEQ_OQ);
    const __m256 alpha =
        _mm256_blendv_ps(one, _mm256_and_ps(before, exp2_poly5(_mm256_sub_ps(seen, vm))), any);
    const __m256 vl = _mm256_fmadd_ps(load(l), alpha, load(sum));
    if (full) {
      _mm256_storeu_ps(m_old + i, alpha);
      _mm256_storeu_ps(l + i, vl);
    } else {
      _mm256_maskstore_ps(m_old + i, k, alpha);
      _mm256_maskstore_ps(l + i, k, vl);
    }
  }
}

/// The backward's P and dS (FlashAttention-2, Algorithm 2) on the AVX2 blocks of S = QKᵀ: the
/// fields and results of the AVX-512 F32Dscores (attention_f32_blocks.h), 16 keys per block.
struct F32Dscores {
  const AttnPlan* plan;
  const AttnSegment* g;
  int64_t r0, bi, c0, k0, nb, ld;
  float scale;
  const float *lse, *delta;
  float *p, *ds;  // ds holds dP on entry
  bool all_visible;  // every query of the tile sees keys [k0, k0 + nb): no per-row bounds
  template <int R, int NV>
  void block(int64_t i, int64_t j, const __m256 (&acc)[R][NV]) {
    const __m256 vscale = _mm256_set1_ps(scale), vscale2 = _mm256_set1_ps(scale * kLog2e);
    const int64_t first = c0 + k0 + j;  // key of lane 0 (segment position)
    int64_t r = i % bi;
#pragma GCC unroll 6
    for (int k = 0; k < R; ++k) {
      const int64_t row = i + k;
      const __m256 lse2 = _mm256_set1_ps(lse[row] * kLog2e);
      const __m256 d = _mm256_set1_ps(delta[row] * scale);
      const int64_t lo = all_visible ? 0 : plan->key_lo(*g, r0 + r) - first;
      const int64_t hi = all_visible ? 16 : plan->key_hi(*g, r0 + r) - first;
      float* prow = p + row * ld + j;
      float* dsrow = ds + row * ld + j;
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) {
        // Columns from nb on belong to other keys (or the next row): masked loads and stores
        // on the last, partial vector only (vmaskmovps stores are slow on AMD).
        const int64_t cols = nb - j - 8 * v;
        const __m256i k_cols = first_lanes8(cols);
        const __m256 dp = cols >= 8 ? _mm256_loadu_ps(dsrow + 8 * v)
                                    : _mm256_maskload_ps(dsrow + 8 * v, k_cols);
        __m256 pv = exp2_poly5(_mm256_fmsub_ps(acc[k][v], vscale2, lse2));
        if (lo > 8 * v || hi < 8 * v + 8)
          pv = _mm256_and_ps(pv, range_lanes8(std::clamp<int64_t>(lo, -1, 17),
                                              std::clamp<int64_t>(hi, -1, 17), v));
        const __m256 dsv = _mm256_mul_ps(pv, _mm256_fmsub_ps(dp, vscale, d));
        if (cols >= 8) {
          _mm256_storeu_ps(prow + 8 * v, pv);
          _mm256_storeu_ps(dsrow + 8 * v, dsv);
        } else {
          _mm256_maskstore_ps(prow + 8 * v, k_cols, pv);
          _mm256_maskstore_ps(dsrow + 8 * v, k_cols, dsv);
        }
      }
      if (++r == bi) r = 0;
    }
  }
};

/// O = diag(alpha) · O + P V folded into the store of the PV product's AVX2 blocks (o [rows, n]
/// fp32, n a multiple of 8, alpha per row); on the item's first key block (`first`) O = P V. As
/// RescaleAdd (attention_blocks.h) on AVX-512.
struct RescaleAdd {
  float* o;
  int64_t n;
  const float* alpha;
  bool first;
  template <int R, int NV>
  void block(int64_t i, int64_t j, const __m256 (&acc)[R][NV]) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_set1_ps(alpha[i + r]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) {
        float* c = o + (i + r) * n + j + 8 * v;
        _mm256_storeu_ps(c, first ? acc[r][v] : _mm256_fmadd_ps(_mm256_loadu_ps(c), a, acc[r][v]));
      }
    }
  }
};

}  // namespace f32x8
LONGTRON_ISA_END

#endif  // !LONGTRON_KERNEL_AVX512 && __AVX2__ && __FMA__
