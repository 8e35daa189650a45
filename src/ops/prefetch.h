// Software prefetch of the rows a register-blocked tile product reads next (tile_gemm.h,
// bf16_tile_gemm.h): the attention kernels' A rows and accumulated C rows come from L2 or beyond,
// and the next register block's loads otherwise wait on them.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "ops/kernel_isa.h"

LONGTRON_ISA_BEGIN

/// Asks for rows [i, i + n) of X (row stride ld elements, `bytes` bytes from each row start) in
/// L1 ahead of use. A hint only: never faults, whatever the addresses.
template <typename T>
inline void prefetch_rows(const T* X, int64_t ld, int64_t i, int64_t n, int64_t bytes) {
  for (int64_t r = i; r < i + n; ++r)
    for (int64_t b = 0; b < bytes; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(X + r * ld) + b, _MM_HINT_T0);
}

LONGTRON_ISA_END
