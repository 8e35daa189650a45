// 16 × 16 transposes of 32-bit words for the attention kernels' packing (Kᵀ and Vᵀ tiles, the
// bf16 kernel's transposed query tiles and dKᵀ/dVᵀ write-back): a 16-word column of a block held
// in L1 is gathered in one instruction instead of 16 scalar copies with a strided store each.
#pragma once
#include <algorithm>
#include <cstdint>

#include <immintrin.h>

#include "ops/kernel_isa.h"

#define LONGTRON_AVX512_TARGET __attribute__((target("avx512f")))

LONGTRON_ISA_BEGIN

/// Writes the 16×16 block of 32-bit words (rows r < n_rows, columns c < n_cols; 1 ≤ n ≤ 16)
/// transposed: dst[c·ldd + r] = block[r][c]. Needs AVX-512F at run time.
LONGTRON_AVX512_TARGET inline void store_block_transposed(uint32_t* dst, int64_t ldd,
                                                          const uint32_t (&block)[16][16],
                                                          int64_t n_rows, int64_t n_cols) {
  const __mmask16 rows = static_cast<__mmask16>((1u << n_rows) - 1);
  const __m512i down = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
  for (int64_t c = 0; c < n_cols; ++c) {
    const __m512i col = _mm512_mask_i32gather_epi32(
        _mm512_setzero_si512(), rows, _mm512_add_epi32(down, _mm512_set1_epi32(int(c))),
        &block[0][0], 4);
    _mm512_mask_storeu_epi32(dst + c * ldd, rows, col);
  }
}

/// dst[c·ldd + x] = src[x·lds + c] for x < rows, c < cols (32-bit words), 16 × 16 at a time.
/// Needs AVX-512F at run time.
LONGTRON_AVX512_TARGET inline void transpose_words_avx512(uint32_t* dst, int64_t ldd,
                                                          const uint32_t* src, int64_t lds,
                                                          int64_t rows, int64_t cols) {
  alignas(64) uint32_t block[16][16];
  for (int64_t x0 = 0; x0 < rows; x0 += 16) {
    const int64_t nx = std::min<int64_t>(16, rows - x0);
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int64_t nc = std::min<int64_t>(16, cols - c0);
      const __mmask16 mc = static_cast<__mmask16>((1u << nc) - 1);
      for (int64_t r = 0; r < nx; ++r)
        _mm512_store_si512(block[r], _mm512_maskz_loadu_epi32(mc, src + (x0 + r) * lds + c0));
      store_block_transposed(dst + c0 * ldd + x0, ldd, block, nx, nc);
    }
  }
}

/// transpose_words_avx512 on fp32 values.
LONGTRON_AVX512_TARGET inline void transpose_floats_avx512(float* dst, int64_t ldd,
                                                           const float* src, int64_t lds,
                                                           int64_t rows, int64_t cols) {
  transpose_words_avx512(reinterpret_cast<uint32_t*>(dst), ldd,
                         reinterpret_cast<const uint32_t*>(src), lds, rows, cols);
}

/// dst[c·ldd + x] = src[x·lds + c] for x < rows, c < cols: 16 × 16 blocks for float in builds
/// with AVX-512, element by element otherwise (and for double).
template <typename T>
inline void transpose(T* dst, int64_t ldd, const T* src, int64_t lds, int64_t rows, int64_t cols) {
#if LONGTRON_KERNEL_AVX512
  if constexpr (sizeof(T) == 4) {
    transpose_floats_avx512(dst, ldd, src, lds, rows, cols);
    return;
  }
#endif
  for (int64_t x = 0; x < rows; ++x)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + x] = src[x * lds + c];
}

LONGTRON_ISA_END
