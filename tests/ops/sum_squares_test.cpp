// ops::sum_squares: exact to double rounding, and the same bits at any thread count.
#include "ops/sum_squares.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

namespace {

std::vector<float> random_values(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng) * std::exp2(float(int(rng() % 40) - 20));
  return v;
}

TEST(SumSquares, MatchesLongDoubleSum) {
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9},
                          longtron::ops::kSumSquaresBlock - 1, longtron::ops::kSumSquaresBlock + 3,
                          int64_t{1000003}}) {
    const std::vector<float> v = random_values(n, unsigned(n) + 1);
    long double want = 0;
    for (const float x : v) want += (long double)x * (long double)x;
    const double got = longtron::ops::sum_squares(v.data(), n);
    // Non-negative terms: any order is within n·2⁻⁵³ of the sum relative to it.
    EXPECT_NEAR(got, double(want), double(want) * double(n + 1) * 1.2e-16) << "n = " << n;
  }
}

TEST(SumSquares, SameBitsForAnyThreadCount) {
  const int64_t n = 5 * longtron::ops::kSumSquaresBlock + 12345;
  const std::vector<float> v = random_values(n, 7);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = longtron::ops::sum_squares(v.data(), n);
  for (const int threads : {2, 3, 4}) {
    omp_set_num_threads(threads);
    EXPECT_EQ(longtron::ops::sum_squares(v.data(), n), one) << threads << " threads";
  }
  omp_set_num_threads(saved);
}

}  // namespace
