// The fp32 attention on register blocks (attention.cpp, attention_backward.cpp; float with
// head_dim a multiple of 16), in the vectors the build targets: AVX-512 (zmm, 6-row × 64-key
// blocks) or AVX2 with FMA (ymm, 6-row × 16-key blocks, attention_f32_avx2.h), chosen by the
// compilation (ops/kernel_isa.h); LONGTRON_F32_BLOCKS is defined where one of them is.
//
// AVX-512: the structure of the bf16 kernel's forward (bf16_tile_blocks.h, attention_rows_bf16.h)
// with fp32 FMAs. Each 6-row × 64-key block of S = QKᵀ goes from the registers straight into the
// online softmax (FlashAttention-2, Algorithm 1; the scores never reach memory, as FlashAttention
// keeps S in registers), in base 2 (scale · log2 e folded into one FMA, 2ⁿ by vscalefps), writing
// P; the output accumulator's rescale is folded into the store of the PV product's blocks, and the
// first key block writes O. The generic path stored S, ran the softmax over it row by row, scaled
// O in a separate pass and added PV into it: ~1/3 of its forward at head_dim 64 went to those
// passes.
#pragma once
#include <immintrin.h>

#include "ops/kernel_isa.h"

#if LONGTRON_KERNEL_AVX512 || (defined(__AVX2__) && defined(__FMA__))
#define LONGTRON_F32_BLOCKS 1

#include <algorithm>
#include <cstdint>

#include "ops/attention_blocks.h"
#include "ops/attention_plan.h"
#include "ops/prefetch.h"
#if !LONGTRON_KERNEL_AVX512
#include "ops/attention_f32_avx2.h"
#endif

// GCC 12 reports the unmasked AVX-512 intrinsics' _mm512_undefined_ps() pass-through operand as
// maybe uninitialised where they are inlined (GCC bug 105593); it is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

LONGTRON_ISA_BEGIN

#if LONGTRON_KERNEL_AVX512
/// The register blocks' fp32 vectors: 16 lanes (zmm); a block is ≤ 6 rows × 4 vectors (24 of the
/// 32 registers hold C).
struct F32x16 {
  using type = __m512;
  static constexpr int kLanes = 16, kMaxNV = 4;
  static type load(const float* p) { return _mm512_loadu_ps(p); }
  static type set1(float x) { return _mm512_set1_ps(x); }
  static type zero() { return _mm512_setzero_ps(); }
  static type fma(type a, type b, type c) { return _mm512_fmadd_ps(a, b, c); }
};
using F32Blocks = F32x16;
#else
/// The register blocks' fp32 vectors on AVX2: 8 lanes (ymm); a block is ≤ 6 rows × 2 vectors
/// (12 of the 16 registers hold C, 2 the B row, 1 the broadcast A: the BLIS Haswell layout).
struct F32x8 {
  using type = __m256;
  static constexpr int kLanes = 8, kMaxNV = 2;
  static type load(const float* p) { return _mm256_loadu_ps(p); }
  static type set1(float x) { return _mm256_set1_ps(x); }
  static type zero() { return _mm256_setzero_ps(); }
  static type fma(type a, type b, type c) { return _mm256_fmadd_ps(a, b, c); }
};
using F32Blocks = F32x8;
#endif

/// acc[r][v] = Σ_k A(r, k) · B[k·ldb + W·v + lane] for R rows and NV vectors of W = V::kLanes
/// columns.
template <typename V, int R, int NV>
__attribute__((always_inline)) inline void f32_block_products(int64_t K, const float* A,
                                                              int64_t lda, const float* B,
                                                              int64_t ldb,
                                                              typename V::type (&acc)[R][NV]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V::zero();
  for (int64_t k = 0; k < K; ++k) {
    typename V::type b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = V::load(B + k * ldb + V::kLanes * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const typename V::type a = V::set1(A[r * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = V::fma(a, b[v], acc[r][v]);
    }
  }
}

template <typename V, int R, int NV, typename Epilogue>
__attribute__((always_inline)) inline void f32_block_to(int64_t K, const float* A, int64_t lda,
                                                        const float* B, int64_t ldb, int64_t i,
                                                        int64_t j, Epilogue& epi) {
  typename V::type acc[R][NV];
  f32_block_products<V, R, NV>(K, A + i * lda, lda, B, ldb, acc);
  epi.template block<R, NV>(i, j, acc);
}

// Rows [i0, M) in blocks of 6 (then one of the rest). Not inlined, as bf16_rows_to: inside a
// large function GCC kept the accumulators on the stack.
template <typename V, int NV, typename Epilogue>
__attribute__((noinline)) void f32_rows_to(int64_t i0, int64_t M, int64_t K, const float* A,
                                           int64_t lda, const float* B, int64_t ldb, int64_t j,
                                           Epilogue& epi) {
  int64_t i = i0;
  for (; i + 6 <= M; i += 6) {
    prefetch_rows(A, lda, i + 6, std::min<int64_t>(6, M - i - 6), 4 * K);
    f32_block_to<V, 6, NV>(K, A, lda, B, ldb, i, j, epi);
  }
  switch (M - i) {
    case 5: f32_block_to<V, 5, NV>(K, A, lda, B, ldb, i, j, epi); break;
    case 4: f32_block_to<V, 4, NV>(K, A, lda, B, ldb, i, j, epi); break;
    case 3: f32_block_to<V, 3, NV>(K, A, lda, B, ldb, i, j, epi); break;
    case 2: f32_block_to<V, 2, NV>(K, A, lda, B, ldb, i, j, epi); break;
    case 1: f32_block_to<V, 1, NV>(K, A, lda, B, ldb, i, j, epi); break;
    default: break;
  }
}

// AVX2: rows [i, i + R) against each 2-vector panel of the columns [0, N) in turn, so that the
// R rows of A are read from L1 by all panels. In the panel-outer order of AVX-512 (whose 64-column
// panel is a whole forward key block) the 16-column panels would stream the tile's A (up to
// 256 rows × head_dim) from L2 once per panel, 4 to 8 times. The blocks are independent, so the
// order changes no result.
template <typename V, int R, typename Epilogue>
__attribute__((noinline)) void f32_panels_to(int64_t i, int64_t N, int64_t K, const float* A,
                                             int64_t lda, const float* B, int64_t ldb,
                                             Epilogue& epi) {
  static_assert(V::kMaxNV == 2, "the row-outer order is for 2-vector panels");
  constexpr int64_t W = V::kLanes;
  int64_t j = 0;
  for (; j + 2 * W <= N; j += 2 * W) f32_block_to<V, R, 2>(K, A, lda, B + j, ldb, i, j, epi);
  if (N - j > W)
    f32_block_to<V, R, 2>(K, A, lda, B + j, ldb, i, j, epi);
  else if (j < N)
    f32_block_to<V, R, 1>(K, A, lda, B + j, ldb, i, j, epi);
}

/// Rows [i0, i1) of C = A · B (A(i, k) = A[i·lda + k], B[k·ldb + j], columns [0, N)), each
/// register block (≤ 6 rows × kMaxNV vectors: 64 columns on AVX-512, 16 on AVX2; j a multiple of
/// that width) handed to `epi.template block<R, NV>(i, j, acc)`, in no particular order. Lanes of
/// columns at or beyond N hold what B holds there (the epilogue masks them); B must be readable
/// up to the next multiple of 16 columns.
template <typename Epilogue>
inline void f32_row_range_to(int64_t i0, int64_t i1, int64_t N, int64_t K, const float* A,
                             int64_t lda, const float* B, int64_t ldb, Epilogue& epi) {
  using V = F32Blocks;
  constexpr int64_t W = V::kLanes;
  if constexpr (V::kMaxNV == 2) {
    for (int64_t i = i0; i < i1; i += 6) {
      prefetch_rows(A, lda, i + 6, std::min<int64_t>(6, i1 - i - 6), 4 * K);
      switch (std::min<int64_t>(6, i1 - i)) {
        case 6: f32_panels_to<V, 6>(i, N, K, A, lda, B, ldb, epi); break;
        case 5: f32_panels_to<V, 5>(i, N, K, A, lda, B, ldb, epi); break;
        case 4: f32_panels_to<V, 4>(i, N, K, A, lda, B, ldb, epi); break;
        case 3: f32_panels_to<V, 3>(i, N, K, A, lda, B, ldb, epi); break;
        case 2: f32_panels_to<V, 2>(i, N, K, A, lda, B, ldb, epi); break;
        default: f32_panels_to<V, 1>(i, N, K, A, lda, B, ldb, epi); break;
      }
    }
    return;
  }
  for (int64_t j = 0; j < N; j += V::kMaxNV * W) {
    switch (std::min<int64_t>(V::kMaxNV, (N - j + W - 1) / W)) {
      case 4:
        if constexpr (V::kMaxNV >= 4) f32_rows_to<V, 4>(i0, i1, K, A, lda, B + j, ldb, j, epi);
        break;
      case 3:
        if constexpr (V::kMaxNV >= 3) f32_rows_to<V, 3>(i0, i1, K, A, lda, B + j, ldb, j, epi);
        break;
      case 2: f32_rows_to<V, 2>(i0, i1, K, A, lda, B + j, ldb, j, epi); break;
      case 1: f32_rows_to<V, 1>(i0, i1, K, A, lda, B + j, ldb, j, epi); break;
      default: break;
    }
  }
}

#if LONGTRON_KERNEL_AVX512
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
  /// Rows [i0, i1) have all their S blocks (up to key 16·nv): nothing left here, as block() ran
  /// the step on whole rows (the AVX2 blocks hold 16 keys, and run it here).
  void rows(int64_t, int64_t, int64_t) {}
  /// alpha (into m_old) and l of rows [0, M) once every row has had its step.
  void finish(int64_t M, float* l) { finish_online_softmax<5>(M, m, m_old, sum, l); }
};

/// O = diag(alpha) · O + P V folded into the PV product's store (attention_blocks.h).
using F32RescaleAdd = RescaleAdd;

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

#else
using f32x8::F32Dscores;
using f32x8::F32OnlineSoftmax;
using F32RescaleAdd = f32x8::RescaleAdd;
#endif  // LONGTRON_KERNEL_AVX512

LONGTRON_ISA_END

#pragma GCC diagnostic pop
#endif  // LONGTRON_KERNEL_AVX512 || (__AVX2__ && __FMA__)
