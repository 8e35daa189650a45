// The row steps of the bf16 kernel (attention_bf16.cpp) on score tile rows of at most 64 keys
// held in four AVX-512 vectors (straight from the S = QKᵀ product's registers,
// bf16_tile_blocks.h): P of the online-softmax step (attention_blocks.h) rounded straight to
// bf16, and the backward's two score rows at once turned into bf16 dS rows and the pairs of rows
// its transposed products read. Fusing the exp with the rounding and packing removes the fp32
// P/dS round trips through memory, which at head_dim 64 cost as much as the tile products.
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

/// What dscores_row needs of one query row besides its scores: dP (fp32, the row's 64 keys), the
/// visible lanes, lse in base 2 (lse · log2 e) and D.
struct ScoreRow {
  const float* dp;
  KeyLanes vis;
  float lse2, delta;
  float scale;  // the softmax scale (dS = P ∘ (dP·scale − D·scale))
};

/// dscores_vector (attention_blocks.h) for 16 keys of row r, dP loaded under its visible lanes.
LONGTRON_BF16_TARGET inline void dscores_vector(__m512 s, const ScoreRow& r, int i, __m512 scale2,
                                                __m512 scale, __m512& p, __m512& ds) {
  const __mmask16 k = r.vis.v[i];
  detail::dscores_vector<4>(s, _mm512_maskz_loadu_ps(k, r.dp + 16 * i), k, scale2, scale,
                            _mm512_set1_ps(r.lse2), _mm512_set1_ps(r.delta * r.scale), p, ds);
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
