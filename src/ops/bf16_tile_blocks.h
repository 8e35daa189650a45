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

namespace longtron::ops::detail {

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
template <int NV, typename Epilogue>
LONGTRON_BF16_TARGET __attribute__((noinline)) void bf16_rows_to(int64_t M, int64_t K2, const bf16_t* A,
                                              int64_t lda, const uint32_t* B, int64_t ldb,
                                              int64_t j, Epilogue& epi) {
  int64_t i = 0;
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

/// A · B as bf16_gemm computes it (same layouts, K = 2·K2), each register block handed to
/// `epi.template block<R, NV>(i, j, acc)`: rows [i, i + R) (R ≤ 6, i even), columns
/// [j, j + 16·NV) (j a multiple of 64); columns at or beyond N hold zero products (B's padding).
/// Where AMX tiles run (amx_available, K2 % 16 == 0, A readable to a_rows), the product goes
/// through `spill` ([M, ldc] fp32, ldc ≥ N rounded up to 16, zero columns beyond N) and the
/// blocks are loaded from there.
template <typename Epilogue>
LONGTRON_BF16_TARGET inline void bf16_gemm_to(int64_t M, int64_t N, int64_t K2, const bf16_t* A,
                                              int64_t lda, const uint32_t* B, int64_t ldb,
                                              Epilogue& epi, int64_t a_rows, float* spill,
                                              int64_t ldc) {
  const bool amx = K2 % 16 == 0 && (M + 15) / 16 * 16 <= a_rows && amx_available();
  if (amx) {
    amx_gemm(M, N, K2, A, lda, B, ldb, spill, ldc, false);
    for (int64_t i = 0; i < M; ++i) std::fill(spill + i * ldc + N, spill + (i + 1) * ldc, 0.0f);
  }
  for (int64_t j = 0; j < N; j += 64) {
    const int64_t nv = std::min<int64_t>(4, (N - j + 15) / 16);
    if (amx) {  // blocks of two rows from the spilled product
      for (int64_t i = 0; i < M; i += 2) {
        __m512 acc[2][4];
        for (int r = 0; r < 2; ++r)
          for (int v = 0; v < 4; ++v)
            acc[r][v] = i + r < M && v < nv ? _mm512_loadu_ps(spill + (i + r) * ldc + j + 16 * v)
                                            : _mm512_setzero_ps();
        if (i + 1 < M) {
          epi.template block<2, 4>(i, j, acc);
        } else {
          __m512 one[1][4] = {{acc[0][0], acc[0][1], acc[0][2], acc[0][3]}};
          epi.template block<1, 4>(i, j, one);
        }
      }
      continue;
    }
    switch (nv) {
      case 4: bf16_rows_to<4>(M, K2, A, lda, B + j, ldb, j, epi); break;
      case 3: bf16_rows_to<3>(M, K2, A, lda, B + j, ldb, j, epi); break;
      case 2: bf16_rows_to<2>(M, K2, A, lda, B + j, ldb, j, epi); break;
      case 1: bf16_rows_to<1>(M, K2, A, lda, B + j, ldb, j, epi); break;
      default: break;
    }
  }
}

}  // namespace longtron::ops::detail
