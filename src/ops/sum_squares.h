// Σ x² of a float buffer in double: the gradient norm's sum of squares.
#pragma once
#include <cstdint>

namespace longtron::ops {

/// Σ x[i]² over x[0..n) (n >= 0), accumulated in double. Each square is exact in double (a
/// float's 24-bit significand squared fits in 53 bits), so only the order of the additions can
/// move the result; it is fixed: blocks of kSumSquaresBlock elements, each summed in 8 lanes
/// (lane j takes the elements ≡ j mod 8, vectorised), the lanes added pairwise, the tail in
/// order, then the block sums in block order. The same bits at any thread count and on any CPU.
double sum_squares(const float* x, int64_t n);

/// Elements per block of sum_squares (its parallel grain and its order of summation).
inline constexpr int64_t kSumSquaresBlock = int64_t{1} << 14;

}  // namespace longtron::ops
