// numpy_permutation against NumPy RandomState(1024).shuffle vectors (docs/data.md).
#include "packing/shuffle.h"

#include <gtest/gtest.h>

#include <algorithm>

using longtron::data::numpy_permutation;

TEST(NumpyPermutation, MatchesSpecVectors) {
  EXPECT_EQ(numpy_permutation(4, 1024), (std::vector<int64_t>{0, 2, 1, 3}));
  EXPECT_EQ(numpy_permutation(10, 1024), (std::vector<int64_t>{2, 3, 7, 0, 6, 8, 5, 4, 9, 1}));
}

TEST(NumpyPermutation, IsAPermutationAndDependsOnSeed) {
  auto a = numpy_permutation(1000, 7);
  auto b = numpy_permutation(1000, 8);
  EXPECT_NE(a, b);
  std::sort(a.begin(), a.end());
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(a[i], i);
  EXPECT_TRUE(numpy_permutation(0, 1).empty());
  EXPECT_EQ(numpy_permutation(1, 1), (std::vector<int64_t>{0}));
}
