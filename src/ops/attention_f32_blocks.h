// The fp32 attention forward on AVX-512 register blocks (attention.cpp, float with head_dim a
// multiple of 16): the structure of the bf16 kernel's forward (bf16_tile_blocks.h,
// attention_rows_bf16.h) with fp32 FMAs. Each 6-row × 64-key block of S = QKᵀ goes from the
// registers straight into the online softmax (FlashAttention-2, Algorithm 1; the scores never
// reach memory, as FlashAttention keeps S in registers), in base 2 (scale · log2 e folded into
// one FMA, 2ⁿ by vscalefps), writing P; the output accumulator's rescale is folded into the store
// of the PV product's blocks, and the first key block writes O. The generic path stored S, ran
// the softmax over it row by row, scaled O in a separate pass and added PV into it: ~1/3 of its
// forward at head_dim 64 went to those passes.
#pragma once
#include <immintrin.h>

#include "ops/kernel_isa.h"

#if LONGTRON_KERNEL_AVX512
#include <algorithm>
#include <cstdint>

#include "ops/attention_blocks.h"
#include "ops/attention_plan.h"
#include "ops/prefetch.h"

// GCC 12 reports the unmasked AVX-512 intrinsics' _mm512_undefined_ps() pass-through operand as
// maybe uninitialised where they are inlined (GCC bug 105593); it is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

LONGTRON_ISA_BEGIN

/// acc[r][v] = Σ_k A(r, k) · B[k·ldb + 16v + lane] for R rows and NV vectors of 16 columns.
template <int R, int NV>
__attribute__((always_inline)) inline void f32_block_products(int64_t K, const float* A,
                                                              int64_t lda, const float* B,
                                                              int64_t ldb, __m512 (&acc)[R][NV]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(B + k * ldb + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(A[r * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
}

template <int R, int NV, typename Epilogue>
__attribute__((always_inline)) inline void f32_block_to(int64_t K, const float* A, int64_t lda,
                                                        const float* B, int64_t ldb, int64_t i,
                                                        int64_t j, Epilogue& epi) {
  __m512 acc[R][NV];
  f32_block_products<R, NV>(K, A + i * lda, lda, B, ldb, acc);
  epi.template block<R, NV>(i, j, acc);
}

// Rows [i0, M) in blocks of 6 (then one of the rest). Not inlined, as bf16_rows_to: inside a
// large function GCC kept the accumulators on the stack.
template <int NV, typename Epilogue>
__attribute__((noinline)) void f32_rows_to(int64_t i0, int64_t M, int64_t K, const float* A,
                                           int64_t lda, const float* B, int64_t ldb, int64_t j,
                                           Epilogue& epi) {
  int64_t i = i0;
  for (; i + 6 <= M; i += 6) {
    prefetch_rows(A, lda, i + 6, std::min<int64_t>(6, M - i - 6), 4 * K);
    f32_block_to<6, NV>(K, A, lda, B, ldb, i, j, epi);
  }
  switch (M - i) {
    case 5: f32_block_to<5, NV>(K, A, lda, B, ldb, i, j, epi); break;
    case 4: f32_block_to<4, NV>(K, A, lda, B, ldb, i, j, epi); break;
    case 3: f32_block_to<3, NV>(K, A, lda, B, ldb, i, j, epi); break;
    case 2: f32_block_to<2, NV>(K, A, lda, B, ldb, i, j, epi); break;
    case 1: f32_block_to<1, NV>(K, A, lda, B, ldb, i, j, epi); break;
    default: break;
  }
}

/// Rows [i0, i1) of C = A · B (A(i, k) = A[i·lda + k], B[k·ldb + j], columns [0, N)), each
/// register block (≤ 6 rows × 64 columns, j a multiple of 64) handed to
/// `epi.template block<R, NV>(i, j, acc)`. Lanes of columns at or beyond N hold what B holds
/// there (the epilogue masks them); B must be readable up to the next multiple of 16 columns.
template <typename Epilogue>
inline void f32_row_range_to(int64_t i0, int64_t i1, int64_t N, int64_t K, const float* A,
                             int64_t lda, const float* B, int64_t ldb, Epilogue& epi) {
  for (int64_t j = 0; j < N; j += 64) {
    switch (std::min<int64_t>(4, (N - j + 15) / 16)) {
      case 4: f32_rows_to<4>(i0, i1, K, A, lda, B + j, ldb, j, epi); break;
      case 3: f32_rows_to<3>(i0, i1, K, A, lda, B + j, ldb, j, epi); break;
      case 2: f32_rows_to<2>(i0, i1, K, A, lda, B + j, ldb, j, epi); break;
      case 1: f32_rows_to<1>(i0, i1, K, A, lda, B + j, ldb, j, epi); break;
      default: break;
    }
  }
}

/// The online-softmax step (online_softmax_row, attention_blocks.h) of the S blocks of one key
/// block (keys [c0, c0 + n), n ≤ 64) of a query tile (queries [r0, r0 + bi) of segment g, row
/// h·bi + r = query r0 + r), in base 2 (scale2 = scale · log2 e): per row, P in fp32 into p
/// (stride 64, zeros outside the visible keys), the new running max into m, the old one into
/// m_old, P's row sum into sum. finish_online_softmax<5> then makes the factors and updates l.
struct F32OnlineSoftmax {
  TileVisibility vis;
  int64_t r0, bi;
  float scale2;
  float *m, *m_old, *sum, *p;
  template <int R, int NV>
  void block(int64_t i, int64_t, const __m512 (&acc)[R][NV]) {
    int64_t r = i % bi;
#pragma GCC unroll 6
    for (int k = 0; k < R; ++k) {
      const int64_t row = i + k;
      __m512 y[4];
      for (int v = 0; v < NV; ++v) y[v] = acc[k][v];
      online_softmax_row<5, NV>(y, vis.row(r0 + r), scale2, m[row], m_old[row], sum[row]);
      for (int v = 0; v < 4; ++v) _mm512_storeu_ps(p + row * 64 + 16 * v, y[v]);
      if (++r == bi) r = 0;
    }
  }
};

/// The backward's P and dS (FlashAttention-2, Algorithm 2) on the register blocks of S = QKᵀ for
/// keys [k0, k0 + nb) of a key block (k0 relative to the block's first key c0): per row, P =
/// exp(scale·S − lse) (as 2^(scale2·S − lse2), lse2 = lse · log2 e) into p and dS = P ∘ (dP·scale −
/// D·scale) into ds (dP read from the same place), both rows of stride ld whose columns [0, nb)
/// correspond to the keys, 0 where the row does not see the key. Row h·bi + r is query r0 + r.
struct F32Dscores {
  const AttnPlan* plan;
  const AttnSegment* g;
  int64_t r0, bi, c0, k0, nb, ld;
  float scale;
  const float *lse, *delta;
  float *p, *ds;  // ds holds dP on entry
  bool all_visible;  // every query of the tile sees keys [k0, k0 + nb): no per-row bounds
  template <int R, int NV>
  void block(int64_t i, int64_t j, const __m512 (&acc)[R][NV]) {
    const __m512 vscale = _mm512_set1_ps(scale), vscale2 = _mm512_set1_ps(scale * kLog2e);
    int64_t r = i % bi;
#pragma GCC unroll 6
    for (int k = 0; k < R; ++k) {
      const int64_t row = i + k, first = c0 + k0 + j;  // key of lane 0 (segment position)
      const KeyLanes vis =
          all_visible ? KeyLanes(0, 64)
                      : KeyLanes(std::clamp<int64_t>(plan->key_lo(*g, r0 + r) - first, 0, 64),
                                 std::clamp<int64_t>(plan->key_hi(*g, r0 + r) - first, 0, 64));
      const KeyLanes cols(0, nb - j);
      const __m512 lse2 = _mm512_set1_ps(lse[row] * kLog2e);
      const __m512 d = _mm512_set1_ps(delta[row] * scale);
      float* prow = p + row * ld + j;
      float* dsrow = ds + row * ld + j;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        __m512 pv, dsv;
        dscores_vector<5>(acc[k][v], _mm512_maskz_loadu_ps(cols.v[v], dsrow + 16 * v), vis.v[v],
                          vscale2, vscale, lse2, d, pv, dsv);
        _mm512_mask_storeu_ps(prow + 16 * v, cols.v[v], pv);
        _mm512_mask_storeu_ps(dsrow + 16 * v, cols.v[v], dsv);
      }
      if (++r == bi) r = 0;
    }
  }
};

LONGTRON_ISA_END

#pragma GCC diagnostic pop
#endif  // LONGTRON_KERNEL_AVX512
