// bf16_gemm (bf16_tile_gemm.h) with the result handed over in register blocks instead of stored:
// the attention kernels apply the softmax (forward) or form P and dS (backward) while a block of
// scores is still in registers, and fold the output rescale into the PV product's store, as
// FlashAttention keeps S in registers (Dao et al. 2022). Saves a store and a reload of every
// score tile and gives the out-of-order core six independent rows to overlap.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "ops/bf16_tile_gemm.h"

namespace longtron::ops::detail::LONGTRON_BF16_ISA {

template <int R, int NV, typename Epilogue>
LONGTRON_BF16_TARGET __attribute__((always_inline)) inline void bf16_block_to(
    int64_t K2, const bf16_t* A, int64_t lda, const uint32_t* B, int64_t ldb, int64_t i,
    int64_t j, Epilogue& epi) {
  __m512 acc[R][NV];
  bf16_block_products<R, NV>(K2, A + i * lda, lda, B, ldb, acc);
  epi.template block<R, NV>(i, j, acc);
}

// Not inlined: inside the attention kernels' large functions GCC ran out of registers and kept
// accumulators on the stack.
// Rows [i0, M) of A (i0 = 0: all of them).
template <int NV, typename Epilogue>
LONGTRON_BF16_TARGET __attribute__((noinline)) void bf16_rows_to(int64_t M, int64_t K2, const bf16_t* A,
                                              int64_t lda, const uint32_t* B, int64_t ldb,
                                              int64_t j, Epilogue& epi, int64_t i0 = 0) {
  int64_t i = i0;
  for (; i + 6 <= M; i += 6) {
    prefetch_rows(A, lda, i + 6, std::min<int64_t>(6, M - i - 6), 4 * K2);
    bf16_block_to<6, NV>(K2, A, lda, B, ldb, i, j, epi);
  }
  switch (M - i) {
    case 5: bf16_block_to<5, NV>(K2, A, lda, B, ldb, i, j, epi); break;
    case 4: bf16_block_to<4, NV>(K2, A, lda, B, ldb, i, j, epi); break;
    case 3: bf16_block_to<3, NV>(K2, A, lda, B, ldb, i, j, epi); break;
    case 2: bf16_block_to<2, NV>(K2, A, lda, B, ldb, i, j, epi); break;
    case 1: bf16_block_to<1, NV>(K2, A, lda, B, ldb, i, j, epi); break;
    default: break;
  }
}

/// The register blocks of a product already in memory: product [M, ldc] fp32 (ldc ≥ N rounded up
/// to 16) handed to `epi` in blocks of up to two rows (i even) and 64 columns, as bf16_gemm_to
/// would hand over its own blocks (lanes of columns at or beyond N zero). The path of AMX tiles, whose products land
/// in tile registers that only a store can read.
template <typename Epilogue>
LONGTRON_BF16_TARGET inline void bf16_blocks_from(int64_t M, int64_t N, const float* product,
                                                  int64_t ldc, Epilogue& epi) {
  for (int64_t j = 0; j < N; j += 64)
    for (int64_t i = 0; i < M; i += 2) {
      __m512 acc[2][4];
      for (int r = 0; r < 2; ++r)
        for (int v = 0; v < 4; ++v) {
          const int64_t cols = i + r < M ? std::clamp<int64_t>(N - j - 16 * v, 0, 16) : 0;
          const __mmask16 k = static_cast<__mmask16>((1u << cols) - 1);
          acc[r][v] = _mm512_maskz_loadu_ps(k, product + (i + r) * ldc + j + 16 * v);
        }
      if (i + 1 < M) {
        epi.template block<2, 4>(i, j, acc);
      } else {
        const __m512 one[1][4] = {{acc[0][0], acc[0][1], acc[0][2], acc[0][3]}};
        epi.template block<1, 4>(i, j, one);
      }
    }
}

/// Rows [i0, i1) of A · B on register blocks (bf16_gemm_to without its AMX path): the attention
/// forward runs the rows of a diagonal tile in groups that stop at the causal edge, each with as
/// few 16-key vectors as its last row sees. Blocks start at i0 (the epilogue sees rows i0, i0 + 6,
/// ...).
template <typename Epilogue>
LONGTRON_BF16_TARGET inline void bf16_row_range_to(int64_t i0, int64_t i1, int64_t N, int64_t K2,
                                                   const bf16_t* A, int64_t lda,
                                                   const uint32_t* B, int64_t ldb, Epilogue& epi) {
  for (int64_t j = 0; j < N; j += 64) {
    switch (std::min<int64_t>(4, (N - j + 15) / 16)) {
      case 4: bf16_rows_to<4>(i1, K2, A, lda, B + j, ldb, j, epi, i0); break;
      case 3: bf16_rows_to<3>(i1, K2, A, lda, B + j, ldb, j, epi, i0); break;
      case 2: bf16_rows_to<2>(i1, K2, A, lda, B + j, ldb, j, epi, i0); break;
      case 1: bf16_rows_to<1>(i1, K2, A, lda, B + j, ldb, j, epi, i0); break;
      default: break;
    }
  }
}

/// A · B as bf16_gemm computes it (same layouts, K = 2·K2), each register block handed to
/// `epi.template block<R, NV>(i, j, acc)`: rows [i, i + R) (R ≤ 6, i even), columns
/// [j, j + 16·NV) (j a multiple of 64); lanes of columns at or beyond N are unspecified (B's
/// columns there: zero where B is zero-padded, real keys where a caller stops N short of them),
/// so the epilogue must mask them. Where AMX tiles run (amx_available, K2 % 16 == 0, A readable to a_rows), the product goes
/// through `spill` ([M, ldc] fp32, ldc ≥ N rounded up to 16) and bf16_blocks_from.
template <typename Epilogue>
LONGTRON_BF16_TARGET inline void bf16_gemm_to(int64_t M, int64_t N, int64_t K2, const bf16_t* A,
                                              int64_t lda, const uint32_t* B, int64_t ldb,
                                              Epilogue& epi, [[maybe_unused]] int64_t a_rows,
                                              [[maybe_unused]] float* spill,
                                              [[maybe_unused]] int64_t ldc) {
#ifndef LONGTRON_BF16_EMULATED
  if (K2 % 16 == 0 && (M + 15) / 16 * 16 <= a_rows && amx_available()) {
    amx_gemm(M, N, K2, A, lda, B, ldb, spill, ldc, false);
    bf16_blocks_from(M, N, spill, ldc, epi);
    return;
  }
#endif
  bf16_row_range_to(0, M, N, K2, A, lda, B, ldb, epi);
}

}  // namespace longtron::ops::detail::LONGTRON_BF16_ISA
