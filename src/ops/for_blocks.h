// A parallel loop over fixed blocks of an elementwise pass (for files built with OpenMP).
#pragma once
#include <algorithm>
#include <cstdint>

#include "ops/threads.h"

namespace longtron {

/// Elements of one block of for_blocks (16 KiB of float).
inline constexpr int64_t kForBlock = 4096;

/// body(begin, end) over blocks of kForBlock elements of [0, count), the blocks shared out by
/// OpenMP (a team only above kParallelMinWork): an elementwise pass that also rounds its output
/// to bf16 does it per block, while the block is in L1.
template <typename Body>
void for_blocks(int64_t count, Body&& body) {
  const int64_t blocks = (count + kForBlock - 1) / kForBlock;
#pragma omp parallel for schedule(static) if (count > kParallelMinWork)
  for (int64_t k = 0; k < blocks; ++k) body(k * kForBlock, std::min(count, (k + 1) * kForBlock));
}

}  // namespace longtron
