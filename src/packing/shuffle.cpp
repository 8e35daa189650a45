// NumPy RandomState.shuffle over mt19937 (legacy "random_interval" bounded draw).
#include "packing/shuffle.h"

#include <numeric>
#include <random>
#include <utility>

namespace longtron::data {

namespace {

// NumPy's legacy random_interval(max): mask rejection on 32-bit draws when max fits, else 64-bit
// draws built from two 32-bit outputs (high word first).
uint64_t random_interval(std::mt19937& gen, uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffULL) {
    while ((value = (static_cast<uint64_t>(gen()) & mask)) > max) {
    }
  } else {
    do {
      const uint64_t hi = gen();
      const uint64_t lo = gen();
      value = ((hi << 32) | lo) & mask;
    } while (value > max);
  }
  return value;
}

}  // namespace

void numpy_shuffle(std::vector<int64_t>& values, uint32_t seed) {
  // RandomState(seed) seeds mt19937 with init_genrand(seed), which is std::mt19937's seeding.
  std::mt19937 gen(seed);
  const int64_t n = static_cast<int64_t>(values.size());
  for (int64_t i = n - 1; i >= 1; --i) {
    const auto j = static_cast<int64_t>(random_interval(gen, static_cast<uint64_t>(i)));
    std::swap(values[i], values[j]);
  }
}

std::vector<int64_t> numpy_permutation(int64_t n, uint32_t seed) {
  if (n <= 0) return {};
  std::vector<int64_t> values(static_cast<size_t>(n));
  std::iota(values.begin(), values.end(), int64_t{0});
  numpy_shuffle(values, seed);
  return values;
}

}  // namespace longtron::data
