// NumPy-compatible seeded permutation (docs/data.md), so document and row order match InternEvo.
#pragma once
#include <cstdint>
#include <vector>

namespace longtron::data {

/// The permutation `numpy.random.RandomState(seed).shuffle(numpy.arange(n))` produces, exactly:
/// mt19937 seeded with `seed`; for i = n-1 down to 1, mask = smallest 2^k-1 >= i, draw
/// `v = next32() & mask` until v <= i (NumPy's legacy bounded draw; 64-bit draws when i > 2^32-1),
/// swap x[i], x[v]. Returns [n] indices. n <= 0 gives an empty vector.
/// Vectors (docs/data.md): seed 1024, n=4 -> [0,2,1,3]; n=10 -> [2,3,7,0,6,8,5,4,9,1].
std::vector<int64_t> numpy_permutation(int64_t n, uint32_t seed);

/// Shuffles `values` in place with the same draws as numpy_permutation (RandomState.shuffle).
void numpy_shuffle(std::vector<int64_t>& values, uint32_t seed);

}  // namespace longtron::data
