// Register-blocked micro-GEMM for attention tiles (at most a few hundred rows × 64–128 columns),
// where a BLAS call's set-up costs more than the work. GCC vector extensions: with AVX-512, 6 rows
// × 4 zmm vectors (64 floats) of C stay in 24 of the 32 registers while K runs; with AVX2, 6 rows
// × 2 ymm (the BLIS/OpenBLAS Haswell layout). Always called from inside an OpenMP worker,
// single-threaded.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "ops/kernel_isa.h"
#include "ops/prefetch.h"

LONGTRON_ISA_BEGIN

#if LONGTRON_KERNEL_AVX512
constexpr int kVecBytes = 64;
constexpr int kWideNV = 4;  // vectors per row in the widest block

// AVX-512 intrinsics rather than GCC vector extensions: with the latter, GCC 12 at
// -march=sapphirerapids kept the 24 accumulators on the stack and copied each B vector through
// it in 32-byte halves (the kernel ran at ~45 GFLOP/s per core against ~200 for the FMA units).
template <typename T>
struct Vec;
template <>
struct Vec<float> {
  typedef __m512 type;
  static type load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, type x) { _mm512_storeu_ps(p, x); }
  static type set1(float x) { return _mm512_set1_ps(x); }
  static type zero() { return _mm512_setzero_ps(); }
  static type fma(type a, type b, type c) { return _mm512_fmadd_ps(a, b, c); }
  static type add(type a, type b) { return _mm512_add_ps(a, b); }
};
template <>
struct Vec<double> {
  typedef __m512d type;
  static type load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, type x) { _mm512_storeu_pd(p, x); }
  static type set1(double x) { return _mm512_set1_pd(x); }
  static type zero() { return _mm512_setzero_pd(); }
  static type fma(type a, type b, type c) { return _mm512_fmadd_pd(a, b, c); }
  static type add(type a, type b) { return _mm512_add_pd(a, b); }
};
#else
// AVX2 builds: ymm vectors; builds without AVX (plain x86-64): xmm, since returning a 32-byte
// vector by value without AVX would change the ABI.
#if defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif
constexpr int kWideNV = 2;

template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(kVecBytes)));
  static type load(const T* p) {
    type x;
    std::memcpy(&x, p, sizeof(type));
    return x;
  }
  static void store(T* p, type x) { std::memcpy(p, &x, sizeof(type)); }
  // x − 0 rather than 0 + x: both broadcast x, but only x − (+0) is x for every x (0 + (−0) is
  // +0), so only it folds away; 0 + x cost a scalar add and a register broadcast per A element
  // in tile_block's inner loop (~40% slower blocks on AVX2) instead of one broadcast load.
  static type set1(T x) { return x - type{}; }
  static type zero() { return type{}; }
  static type fma(type a, type b, type c) { return a * b + c; }
  static type add(type a, type b) { return a + b; }
};
#endif

// C[R, NV·W] += A(R×K) · B(K × NV·W); A(i, k) = A[i·ars + k·acs] (any strides, so Aᵀ is free);
// B rows are contiguous with leading dimension ldb.
template <typename T, int R, int NV>
inline void tile_block(int64_t K, const T* A, int64_t ars, int64_t acs, const T* B, int64_t ldb,
                       T* C, int64_t ldc, bool accumulate) {
  using V = Vec<T>;
  using VT = typename V::type;
  constexpr int W = kVecBytes / sizeof(T);
  VT acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V::zero();
  for (int64_t k = 0; k < K; ++k) {
    VT b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = V::load(B + k * ldb + v * W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const VT a = V::set1(A[r * ars + k * acs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = V::fma(a, b[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      VT c = acc[r][v];
      if (accumulate) c = V::add(c, V::load(C + r * ldc + v * W));
      V::store(C + r * ldc + v * W, c);
    }
  }
}

/// The k range every row block of a dense product needs: all of [0, K).
struct FullRange {
  int64_t K;
  std::pair<int64_t, int64_t> operator()(int64_t, int64_t) const { return {0, K}; }
};

/// One panel of NV vectors of C in register blocks of 6 rows (then the rest), the rows [i, i + R)
/// of a block summing k over range(i, R) = [k0, k1) only (A is zero outside it on those rows).
template <typename T, int NV, typename Range>
inline void tile_rows(int64_t M, const T* A, int64_t ars, int64_t acs, const T* B, int64_t ldb,
                      T* C, int64_t ldc, bool accumulate, const Range& range) {
  constexpr int W = kVecBytes / sizeof(T);
  for (int64_t i = 0; i < M; i += 6) {
    const int64_t R = std::min<int64_t>(6, M - i);
    const auto [k0, k1] = range(i, R);
    T* c = C + i * ldc;
    if (k1 <= k0) {  // A is zero on these rows: C keeps its values, or gets zeros
      if (!accumulate)
        for (int64_t r = 0; r < R; ++r) std::fill_n(c + r * ldc, NV * W, T(0));
      continue;
    }
    // A's next rows where they are rows (acs = 1), and the C rows this block adds into.
    if (acs == 1 && i + 6 < M)
      prefetch_rows(A + k0 * acs, ars, i + 6, std::min<int64_t>(6, M - i - 6),
                    (k1 - k0) * int64_t(sizeof(T)));
    if (accumulate) prefetch_rows(C, ldc, i, R, NV * kVecBytes);
    const T* a = A + i * ars + k0 * acs;
    const T* b = B + k0 * ldb;
    switch (R) {
      case 6: tile_block<T, 6, NV>(k1 - k0, a, ars, acs, b, ldb, c, ldc, accumulate); break;
      case 5: tile_block<T, 5, NV>(k1 - k0, a, ars, acs, b, ldb, c, ldc, accumulate); break;
      case 4: tile_block<T, 4, NV>(k1 - k0, a, ars, acs, b, ldb, c, ldc, accumulate); break;
      case 3: tile_block<T, 3, NV>(k1 - k0, a, ars, acs, b, ldb, c, ldc, accumulate); break;
      case 2: tile_block<T, 2, NV>(k1 - k0, a, ars, acs, b, ldb, c, ldc, accumulate); break;
      default: tile_block<T, 1, NV>(k1 - k0, a, ars, acs, b, ldb, c, ldc, accumulate); break;
    }
  }
}

/// C[M, N] = A · B (+ C if accumulate) with A(i, k) = A[i·ars + k·acs] and B[k·ldb + j], where
/// the rows [i, i + R) of a register block (R ≤ 6) need only k in range(i, R) = [k0, k1): A is
/// zero outside it on those rows (the causal mask's zeros in P and dS), so the products skipped
/// there add nothing and the nonzero terms are summed in the same order (FullRange{K}: a dense
/// product). Panels of the widest vector count, then narrower ones, then columns left over one at
/// a time (odd head_dim in tests). K is not split into panels (tile_gemm splits a long K).
template <typename T, typename Range>
inline void tile_gemm_ranged(int64_t M, int64_t N, const T* A, int64_t ars, int64_t acs,
                            const T* B, int64_t ldb, T* C, int64_t ldc, bool accumulate,
                            const Range& range) {
  constexpr int64_t W = kVecBytes / sizeof(T);
  // The columns in whole vectors, [0, n_vec), and the scalar tail [n_vec, N) of fewer than W.
  // The tail's start is N − N mod W rather than where the panel loops stopped: GCC could not
  // bound the latter, so with the test's constant shapes it kept the (never run) tail loops and
  // warned of iterations thousands of elements past C and B (-Waggressive-loop-optimizations).
  const int64_t n_vec = N - N % W;
  int64_t j = 0;
  for (; j + kWideNV * W <= n_vec; j += kWideNV * W)
    tile_rows<T, kWideNV>(M, A, ars, acs, B + j, ldb, C + j, ldc, accumulate, range);
  if (kWideNV > 2 && j + 2 * W <= n_vec) {
    tile_rows<T, 2>(M, A, ars, acs, B + j, ldb, C + j, ldc, accumulate, range);
    j += 2 * W;
  }
  for (; j < n_vec; j += W)
    tile_rows<T, 1>(M, A, ars, acs, B + j, ldb, C + j, ldc, accumulate, range);
  if (n_vec == N) return;
  for (int64_t i0 = 0; i0 < M; i0 += 6) {
    const int64_t R = std::min<int64_t>(6, M - i0);
    const auto [k0, k1] = range(i0, R);
    for (int64_t i = i0; i < i0 + R; ++i) {
      if (!accumulate)
        for (int64_t jj = n_vec; jj < N; ++jj) C[i * ldc + jj] = T(0);
      for (int64_t k = k0; k < k1; ++k) {
        const T a = A[i * ars + k * acs];
        for (int64_t jj = n_vec; jj < N; ++jj) C[i * ldc + jj] += a * B[k * ldb + jj];
      }
    }
  }
}

#ifndef LONGTRON_PANEL_ROWS
#define LONGTRON_PANEL_ROWS 64
#define LONGTRON_PANEL_SPLIT 128
#endif
/// K is split into passes of kPanelRows when it exceeds kPanelSplit: a pass streams a [kPanelRows,
/// 64-column] panel of B once per 6-row block of C, so the panel should stay in L1 (64 rows:
/// 16 KiB of floats). Without the split, the backward's dV += Pᵀ·dO and dK += dSᵀ·Q (K = G·64
/// rows, 256 for 4 query heads per kv head) stream a 64 KiB panel from L2 for every 6 rows of C;
/// with it C is re-read once per pass instead.
constexpr int64_t kPanelRows = LONGTRON_PANEL_ROWS;
constexpr int64_t kPanelSplit = LONGTRON_PANEL_SPLIT;

/// C[M, N] (leading dimension ldc) = A · B (+ C if accumulate) with A(i, k) = A[i·ars + k·acs]
/// and B[k·ldb + j]. K is split into passes of at most kPanelRows rows when it is longer.
template <typename T>
inline void tile_gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t ars, int64_t acs,
                      const T* B, int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  if (K <= kPanelSplit) {
    tile_gemm_ranged(M, N, A, ars, acs, B, ldb, C, ldc, accumulate, FullRange{K});
    return;
  }
  for (int64_t k = 0; k < K; k += kPanelRows) {
    tile_gemm_ranged(M, N, A + k * acs, ars, acs, B + k * ldb, ldb, C, ldc, accumulate || k > 0,
                     FullRange{std::min(kPanelRows, K - k)});
  }
}

LONGTRON_ISA_END
