// Sequence-parallel activation blocks (see activation_blocks.h).
#include "parallel/activation_blocks.h"

#include <cstring>
#include <utility>

#include "core/error.h"

namespace longtron::parallel {

void blocks_to_full(float* full, const float* blocks, int64_t N, int64_t H, int x, int y) {
  const int64_t nx = N / x, hy = H / y;
  for (int r = 0; r < x * y; ++r) {
    const int a = r % x, b = r / x;
    for (int64_t n = 0; n < nx; ++n)
      std::memcpy(full + (a * nx + n) * H + b * hy, blocks + (r * nx + n) * hy,
                  size_t(hy) * sizeof(float));
  }
}

void full_to_blocks(float* blocks, const float* full, int64_t N, int64_t H, int x, int y) {
  const int64_t nx = N / x, hy = H / y;
  for (int r = 0; r < x * y; ++r) {
    const int a = r % x, b = r / x;
    for (int64_t n = 0; n < nx; ++n)
      std::memcpy(blocks + (r * nx + n) * hy, full + (a * nx + n) * H + b * hy,
                  size_t(hy) * sizeof(float));
  }
}

ActivationBlocks ActivationBlocks::rows(comm::CommPtr group) {
  const int size = group->size();
  return {std::move(group), size, 1};
}

ActivationBlocks ActivationBlocks::grid(comm::CommPtr group, int x, int y) {
  check(x * y == group->size(), "activation blocks: {} x {} blocks over a group of {}", x, y,
        group->size());
  return {std::move(group), x, y};
}

int64_t ActivationBlocks::block_rows(int64_t N) const {
  check(N % x == 0 && N % y == 0,
        "sequence parallel: the row's {} tokens are not divisible by the {} x {} blocks of the "
        "tensor group", N, x, y);
  return N / x;
}

void ActivationBlocks::gather(float* full, Scratch& scratch, const float* mine, int64_t N,
                              int64_t H) const {
  const int64_t count = block_rows(N) * (H / y);
  if (y == 1) return group->all_gather(full, mine, count);  // row blocks are contiguous
  float* blocks = scratch.get(count * x * y);
  group->all_gather(blocks, mine, count);
  blocks_to_full(full, blocks, N, H, x, y);
}

void ActivationBlocks::reduce_scatter(float* mine, Scratch& scratch, const float* full, int64_t N,
                                      int64_t H) const {
  const int64_t count = block_rows(N) * (H / y);
  if (y == 1) return group->reduce_scatter(mine, full, count);
  float* blocks = scratch.get(N * H);
  full_to_blocks(blocks, full, N, H, x, y);
  group->reduce_scatter(mine, blocks, count);
}

void ActivationBlocks::take(float* mine, const float* full, int64_t N, int64_t H) const {
  const int64_t nx = block_rows(N), hy = H / y;
  const int r = group->rank(), a = r % x, b = r / x;
  for (int64_t n = 0; n < nx; ++n)
    std::memcpy(mine + n * hy, full + (a * nx + n) * H + b * hy, size_t(hy) * sizeof(float));
}

}  // namespace longtron::parallel
