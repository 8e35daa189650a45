// Register-blocked micro-GEMM for attention tiles (at most a few hundred rows × 64–128 columns),
// where a BLAS call's set-up costs more than the work. GCC vector extensions: with AVX-512, 6 rows
// × 4 zmm vectors (64 floats) of C stay in 24 of the 32 registers while K runs; with AVX2, 6 rows
// × 2 ymm (the BLIS/OpenBLAS Haswell layout). Measured on the development machine (Zen 4, one
// core, 256×64×64 tiles): zmm 6×4 ≈ 110 GFLOP/s, zmm 6×2 ≈ 100, ymm 6×2 ≈ 78, against OpenBLAS
// sgemm 2048³ ≈ 95. Always called from inside an OpenMP worker, single-threaded.
#pragma once
#include <cstdint>
#include <algorithm>
#include <cstring>

namespace longtron::ops::detail {

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
constexpr int kWideNV = 4;  // vectors per row in the widest block
#else
constexpr int kVecBytes = 32;
constexpr int kWideNV = 2;
#endif

template <typename T>
struct Vec;
template <>
struct Vec<float> {
  typedef float type __attribute__((vector_size(kVecBytes)));
};
template <>
struct Vec<double> {
  typedef double type __attribute__((vector_size(kVecBytes)));
};

// C[R, NV·W] += A(R×K) · B(K × NV·W); A(i, k) = A[i·ars + k·acs] (any strides, so Aᵀ is free);
// B rows are contiguous with leading dimension ldb.
template <typename T, int R, int NV>
inline void tile_block(int64_t K, const T* A, int64_t ars, int64_t acs, const T* B, int64_t ldb,
                       T* C, int64_t ldc, bool accumulate) {
  using V = typename Vec<T>::type;
  constexpr int W = kVecBytes / sizeof(T);
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int64_t k = 0; k < K; ++k) {
    V b[NV];
    for (int v = 0; v < NV; ++v) std::memcpy(&b[v], B + k * ldb + v * W, sizeof(V));
    for (int r = 0; r < R; ++r) {
      const V a = V{} + A[r * ars + k * acs];
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) {
      V c = acc[r][v];
      if (accumulate) {
        V old;
        std::memcpy(&old, C + r * ldc + v * W, sizeof(V));
        c += old;
      }
      std::memcpy(C + r * ldc + v * W, &c, sizeof(V));
    }
  }
}

template <typename T, int NV>
inline void tile_rows(int64_t M, int64_t K, const T* A, int64_t ars, int64_t acs, const T* B,
                      int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  int64_t i = 0;
  for (; i + 6 <= M; i += 6) tile_block<T, 6, NV>(K, A + i * ars, ars, acs, B, ldb, C + i * ldc, ldc,
                                                           accumulate);
  const T* a = A + i * ars;
  T* c = C + i * ldc;
  switch (M - i) {
    case 5: tile_block<T, 5, NV>(K, a, ars, acs, B, ldb, c, ldc, accumulate); break;
    case 4: tile_block<T, 4, NV>(K, a, ars, acs, B, ldb, c, ldc, accumulate); break;
    case 3: tile_block<T, 3, NV>(K, a, ars, acs, B, ldb, c, ldc, accumulate); break;
    case 2: tile_block<T, 2, NV>(K, a, ars, acs, B, ldb, c, ldc, accumulate); break;
    case 1: tile_block<T, 1, NV>(K, a, ars, acs, B, ldb, c, ldc, accumulate); break;
    default: break;
  }
}

template <typename T>
inline void tile_gemm_panel(int64_t M, int64_t N, int64_t K, const T* A, int64_t ars, int64_t acs,
                            const T* B, int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  constexpr int64_t W = kVecBytes / sizeof(T);
  int64_t j = 0;
  for (; j + kWideNV * W <= N; j += kWideNV * W)
    tile_rows<T, kWideNV>(M, K, A, ars, acs, B + j, ldb, C + j, ldc, accumulate);
  if (kWideNV > 2 && j + 2 * W <= N) {
    tile_rows<T, 2>(M, K, A, ars, acs, B + j, ldb, C + j, ldc, accumulate);
    j += 2 * W;
  }
  for (; j + W <= N; j += W) tile_rows<T, 1>(M, K, A, ars, acs, B + j, ldb, C + j, ldc, accumulate);
  if (j == N) return;
  for (int64_t i = 0; i < M; ++i) {  // columns left over (odd head_dim in tests)
    if (!accumulate)
      for (int64_t jj = j; jj < N; ++jj) C[i * ldc + jj] = T(0);
    for (int64_t k = 0; k < K; ++k) {
      const T a = A[i * ars + k * acs];
      for (int64_t jj = j; jj < N; ++jj) C[i * ldc + jj] += a * B[k * ldb + jj];
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
    tile_gemm_panel(M, N, K, A, ars, acs, B, ldb, C, ldc, accumulate);
    return;
  }
  for (int64_t k = 0; k < K; k += kPanelRows) {
    tile_gemm_panel(M, N, std::min(kPanelRows, K - k), A + k * acs, ars, acs, B + k * ldb, ldb, C,
                    ldc, accumulate || k > 0);
  }
}

}  // namespace longtron::ops::detail
