// The attention kernels' register-blocked tile GEMM (ops/tile_gemm.h): tile_gemm_ranged, which
// takes per 6-row block only a k range of A (the rest of A being zero), against a product in
// double over the whole of K with A zeroed outside the ranges.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "ops/tile_gemm.h"

namespace longtron::ops::detail {
namespace {

// A block's k range as the attention uses it: a causal staircase (rows i.. see k < i + shift),
// with the blocks past `empty_from` seeing nothing.
struct Staircase {
  int64_t K, shift, empty_from;
  std::pair<int64_t, int64_t> operator()(int64_t i, int64_t R) const {
    if (i >= empty_from) return {0, 0};
    return {std::clamp<int64_t>(i - 3, 0, K), std::clamp<int64_t>(i + R + shift, 0, K)};
  }
};

template <typename T>
void check_ranged(int64_t M, int64_t N, int64_t K, bool transposed_a, bool accumulate) {
  std::mt19937 rng(static_cast<uint32_t>(M * 131 + N * 7 + K));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const Staircase range{K, 5, M - 7};
  // A(i, k) at A[i·ars + k·acs]: rows (acs = 1) or the transpose of a [K, M] matrix.
  const int64_t ars = transposed_a ? 1 : K, acs = transposed_a ? M : 1;
  std::vector<T> A(M * K), B(K * N), C(M * N);
  for (auto& x : A) x = T(u(rng));
  for (auto& x : B) x = T(u(rng));
  for (auto& x : C) x = T(u(rng));
  // Zero A outside each block's range: the product then must not depend on what it skips.
  for (int64_t i = 0; i < M; i += 6) {
    const int64_t R = std::min<int64_t>(6, M - i);
    const auto [k0, k1] = range(i, R);
    for (int64_t r = i; r < i + R; ++r)
      for (int64_t k = 0; k < K; ++k)
        if (k < k0 || k >= k1) A[r * ars + k * acs] = T(0);
  }
  std::vector<double> want(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = accumulate ? double(C[i * N + j]) : 0.0;
      for (int64_t k = 0; k < K; ++k) s += double(A[i * ars + k * acs]) * double(B[k * N + j]);
      want[i * N + j] = s;
    }
  tile_gemm_ranged<T>(M, N, A.data(), ars, acs, B.data(), N, C.data(), N, accumulate, range);
  for (int64_t i = 0; i < M * N; ++i)
    ASSERT_NEAR(double(C[i]), want[i], 1e-4 * std::sqrt(double(K)))
        << "M " << M << " N " << N << " K " << K << " element " << i;
}

TEST(TileGemm, RangedMatchesTheFullProductOnZeroedRows) {
  constexpr int64_t W = kVecBytes / sizeof(float);
  // N of 7 vectors: the 4-, 2- and 1-vector panels; M not a multiple of 6; K ≤ kPanelSplit.
  for (bool transposed : {false, true})
    for (bool accumulate : {false, true}) {
      check_ranged<float>(47, 7 * W, 64, transposed, accumulate);
      check_ranged<float>(128, 8 * W, 128, transposed, accumulate);
      check_ranged<double>(23, 3 * (kVecBytes / int64_t(sizeof(double))), 40, transposed,
                           accumulate);
    }
}

}  // namespace
}  // namespace longtron::ops::detail
