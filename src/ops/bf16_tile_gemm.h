// bf16 micro-GEMMs for attention tiles: AMX tiles (TDPBF16PS) where the CPU and the kernel allow
// them, else register-blocked AVX512-BF16 (vdpbf16ps: each fp32 lane accumulates the dot product
// of one pair of bf16 values). Compiled with LONGTRON_BF16_EMULATED defined (before the first
// include), the same code lands in namespace `emulated` instead of `native`, with the bf16
// instructions emulated in AVX-512F (bf16_emulation.h: vdpbf16ps's bits) and no AMX: the path
// that tests the kernel on a CPU without AVX512-BF16. Measured on the development machine
// (Sapphire Rapids class, one core, dependency-free loops): vdpbf16ps ~108 GFLOP/s, i.e. one per
// cycle and no faster than fp32 FMAs (~208), AMX ~895. Compiled with target attributes, so the
// build needs no -march flag; the caller checks the CPU at run time (attention_bf16_native,
// bf16_emulated, amx_available).
//
// Layouts (all "pairs" run along the reduction dimension K, padded to even with zeros):
//  - A: bf16 rows, A(i, 2k2 + t) = A[i·lda + 2k2 + t], lda even;
//  - B: packed words, word B[k2·ldb + j] holds (B(2k2, j), B(2k2 + 1, j)), ldb >= N rounded up
//    to 16, columns beyond N zero.
// C is fp32 [M, N] with leading dimension ldc.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ops/bf16_emulation.h"
#include "ops/prefetch.h"

#ifdef LONGTRON_BF16_EMULATED
#define LONGTRON_BF16_ISA emulated
#define LONGTRON_BF16_TARGET LONGTRON_AVX512_EMU_TARGET
#else
#define LONGTRON_BF16_ISA native
#define LONGTRON_BF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define LONGTRON_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#endif

namespace longtron::ops::detail {

using bf16_t = uint16_t;

/// Rounds up to a multiple of m.
constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace longtron::ops::detail

namespace longtron::ops::detail::LONGTRON_BF16_ISA {

/// 16 fp32 lanes rounded to bf16 (VCVTNEPS2BF16, or its emulation).
LONGTRON_BF16_TARGET __attribute__((always_inline)) inline __m256i round_16(__m512 x) {
#ifdef LONGTRON_BF16_EMULATED
  return cvtneps_emulated(x);
#else
  return (__m256i)_mm512_cvtneps_pbh(x);
#endif
}

/// Two fp32 vectors rounded to 32 bf16 values, lo's first (VCVTNE2PS2BF16, or its emulation).
LONGTRON_BF16_TARGET __attribute__((always_inline)) inline __m512i round_32(__m512 hi, __m512 lo) {
#ifdef LONGTRON_BF16_EMULATED
  return cvtne2ps_emulated(hi, lo);
#else
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
#endif
}

/// An operand vector of 16 words (pairs of bf16) as the dot product reads it: the words
/// themselves for vdpbf16ps, their two halves widened to fp32 for the emulation (split once per
/// vector, reused by every row of a register block).
#ifdef LONGTRON_BF16_EMULATED
struct PairOperand {
  __m512 odd, even;
};
LONGTRON_BF16_TARGET __attribute__((always_inline)) inline PairOperand pair_operand(__m512i w) {
  return PairOperand{odd_bf16(w), even_bf16(w)};
}
/// acc + the pairwise dot products of a and b, lane by lane (vdpbf16ps's bits).
LONGTRON_BF16_TARGET __attribute__((always_inline)) inline __m512 dot_pairs(__m512 acc,
                                                                             PairOperand a,
                                                                             PairOperand b) {
  return dpbf16_split(acc, a.odd, a.even, b.odd, b.even);
}
#else
using PairOperand = __m512bh;
LONGTRON_BF16_TARGET __attribute__((always_inline)) inline PairOperand pair_operand(__m512i w) {
  return (__m512bh)w;
}
/// acc + the pairwise dot products of a and b, lane by lane (vdpbf16ps).
LONGTRON_BF16_TARGET __attribute__((always_inline)) inline __m512 dot_pairs(__m512 acc,
                                                                             PairOperand a,
                                                                             PairOperand b) {
  return _mm512_dpbf16_ps(acc, a, b);
}
#endif

/// Rounds n floats to bf16 with vcvtneps2bf16 into dst: round to nearest even as core/bf16.h's
/// float_to_bf16, except that subnormals are flushed to signed zero (the instruction's rule).
LONGTRON_BF16_TARGET inline void to_bf16(bf16_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), round_16(_mm512_loadu_ps(src + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(dst + i, m, round_16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

/// The register block of the micro-GEMM: acc[r][v] = Σ over the K2 pairs of A row r times B
/// columns [16v, 16v + 16), for R rows and NV vectors of 16 columns (R·NV ≤ 24 accumulators).
// Vector casts, not memcpy: copies through memory made GCC keep the accumulators on the stack.
template <int R, int NV>
LONGTRON_BF16_TARGET __attribute__((always_inline)) inline void bf16_block_products(
    int64_t K2, const bf16_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
    __m512 (&acc)[R][NV]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k2 = 0; k2 < K2; ++k2) {
    PairOperand b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = pair_operand(_mm512_loadu_si512(B + k2 * ldb + v * 16));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, A + r * lda + 2 * k2, 4);
      const PairOperand a = pair_operand(_mm512_set1_epi32(pair));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = dot_pairs(acc[r][v], a, b[v]);
    }
  }
}

template <int R, int NV>
LONGTRON_BF16_TARGET inline void bf16_block(int64_t K2, const bf16_t* A, int64_t lda,
                                            const uint32_t* B, int64_t ldb, float* C, int64_t ldc,
                                            bool accumulate, __mmask16 last) {
  __m512 acc[R][NV];
  bf16_block_products<R, NV>(K2, A, lda, B, ldb, acc);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xFFFF);
      float* c = C + r * ldc + v * 16;
      __m512 x = acc[r][v];
      if (accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, c));
      _mm512_mask_storeu_ps(c, m, x);
    }
  }
}

template <int NV>
LONGTRON_BF16_TARGET inline void bf16_rows(int64_t M, int64_t K2, const bf16_t* A, int64_t lda,
                                           const uint32_t* B, int64_t ldb, float* C, int64_t ldc,
                                           bool accumulate, __mmask16 last) {
  int64_t i = 0;
  for (; i + 6 <= M; i += 6) {
    prefetch_rows(A, lda, i + 6, std::min<int64_t>(6, M - i - 6), 4 * K2);
    if (accumulate) prefetch_rows(C, ldc, i, 6, 64 * NV);
    bf16_block<6, NV>(K2, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate, last);
  }
  const bf16_t* a = A + i * lda;
  float* c = C + i * ldc;
  switch (M - i) {
    case 5: bf16_block<5, NV>(K2, a, lda, B, ldb, c, ldc, accumulate, last); break;
    case 4: bf16_block<4, NV>(K2, a, lda, B, ldb, c, ldc, accumulate, last); break;
    case 3: bf16_block<3, NV>(K2, a, lda, B, ldb, c, ldc, accumulate, last); break;
    case 2: bf16_block<2, NV>(K2, a, lda, B, ldb, c, ldc, accumulate, last); break;
    case 1: bf16_block<1, NV>(K2, a, lda, B, ldb, c, ldc, accumulate, last); break;
    default: break;
  }
}

#ifdef LONGTRON_BF16_EMULATED
/// The emulation has no AMX path.
constexpr bool amx_available() { return false; }
#else
/// Whether this process may use AMX tiles: the CPU has AMX-BF16 and the kernel granted the tile
/// data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once). Defined in attention_bf16.cpp.
bool amx_available();

// The palette-1 tile configuration of amx_gemm: tiles 0–3 are a 2×2 block of C (16 × 16 fp32
// each), 4–5 two A tiles (16 rows × 16 pairs), 6–7 two B tiles (16 pairs × 16 words).
struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

/// bf16_gemm on AMX tiles (TDPBF16PS, 16×16×32 per instruction): needs K2 % 16 == 0, A rows
/// readable up to M rounded up to 16, and ldb >= N rounded up to 16 (the layouts above give
/// that). C blocks of 32×32 go through a local buffer, so M and N need not be multiples of 16.
/// The configuration is loaded on every call: other code on the thread (oneDNN's AMX kernels)
/// may load its own between calls.
LONGTRON_AMX_TARGET inline void amx_gemm(int64_t M, int64_t N, int64_t K2, const bf16_t* A,
                                         int64_t lda, const uint32_t* B, int64_t ldb, float* C,
                                         int64_t ldc, bool accumulate) {
  static const AmxConfig config;
  _tile_loadconfig(&config);
  alignas(64) float out[32 * 32];
  const int64_t a_stride = lda * 2, b_stride = ldb * 4;
  for (int64_t i0 = 0; i0 < M; i0 += 32) {
    const bool two_i = i0 + 16 < M;
    for (int64_t j0 = 0; j0 < N; j0 += 32) {
      const bool two_j = j0 + 16 < N;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k2 = 0; k2 < K2; k2 += 16) {
        _tile_loadd(4, A + i0 * lda + 2 * k2, a_stride);
        _tile_loadd(6, B + k2 * ldb + j0, b_stride);
        _tile_dpbf16ps(0, 4, 6);
        if (two_j) {
          _tile_loadd(7, B + k2 * ldb + j0 + 16, b_stride);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_i) {
          _tile_loadd(5, A + (i0 + 16) * lda + 2 * k2, a_stride);
          _tile_dpbf16ps(2, 5, 6);
          if (two_j) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, out, 128);
      _tile_stored(1, out + 16, 128);
      _tile_stored(2, out + 16 * 32, 128);
      _tile_stored(3, out + 16 * 32 + 16, 128);
      const int64_t rows = std::min<int64_t>(32, M - i0), cols = std::min<int64_t>(32, N - j0);
      for (int64_t r = 0; r < rows; ++r) {
        float* c = C + (i0 + r) * ldc + j0;
        for (int64_t h = 0; h < cols; h += 16) {
          const int64_t n = std::min<int64_t>(16, cols - h);
          const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
          __m512 x = _mm512_load_ps(out + r * 32 + h);
          if (accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, c + h));
          _mm512_mask_storeu_ps(c + h, m, x);
        }
      }
    }
  }
}

#endif  // LONGTRON_BF16_EMULATED

/// C[M, N] = A · B (+ C if accumulate), K = 2·K2 (see the layouts above). `a_rows`: rows of A
/// that may be read (at least M); AMX tiles run when amx_gemm's conditions hold, vdpbf16ps
/// otherwise.
LONGTRON_BF16_TARGET inline void bf16_gemm(int64_t M, int64_t N, int64_t K2, const bf16_t* A,
                                           int64_t lda, const uint32_t* B, int64_t ldb, float* C,
                                           int64_t ldc, bool accumulate,
                                           [[maybe_unused]] int64_t a_rows) {
#ifndef LONGTRON_BF16_EMULATED
  if (K2 % 16 == 0 && (M + 15) / 16 * 16 <= a_rows && amx_available()) {
    amx_gemm(M, N, K2, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
#endif
  int64_t j = 0;
  for (; j + 64 <= N; j += 64)
    bf16_rows<4>(M, K2, A, lda, B + j, ldb, C + j, ldc, accumulate, 0xFFFF);
  if (j == N) return;
  const int64_t rest = N - j, nv = (rest + 15) / 16;
  const __mmask16 last = static_cast<__mmask16>((1u << (rest - 16 * (nv - 1))) - 1);
  switch (nv) {
    case 1: bf16_rows<1>(M, K2, A, lda, B + j, ldb, C + j, ldc, accumulate, last); break;
    case 2: bf16_rows<2>(M, K2, A, lda, B + j, ldb, C + j, ldc, accumulate, last); break;
    case 3: bf16_rows<3>(M, K2, A, lda, B + j, ldb, C + j, ldc, accumulate, last); break;
    case 4: bf16_rows<4>(M, K2, A, lda, B + j, ldb, C + j, ldc, accumulate, last); break;
    default: break;
  }
}

/// Packs B = Y (bf16 rows [K, N], row k at Y + k·ldy) as words along K: dst[k2·ldb + j] =
/// (Y(2k2, j), Y(2k2 + 1, j)), a zero second half when K is odd, zero columns in [N, ldb).
inline void pack_pairs_of_rows(uint32_t* dst, int64_t ldb, const bf16_t* Y, int64_t ldy,
                               int64_t K, int64_t N) {
  for (int64_t k2 = 0; 2 * k2 < K; ++k2) {
    const bf16_t* a = Y + 2 * k2 * ldy;
    uint32_t* d = dst + k2 * ldb;
    if (2 * k2 + 1 < K) {
      const bf16_t* b = a + ldy;
      for (int64_t j = 0; j < N; ++j) d[j] = uint32_t(a[j]) | (uint32_t(b[j]) << 16);
    } else {
      for (int64_t j = 0; j < N; ++j) d[j] = uint32_t(a[j]);
    }
    std::fill(d + N, d + ldb, 0u);
  }
}

}  // namespace longtron::ops::detail::LONGTRON_BF16_ISA
