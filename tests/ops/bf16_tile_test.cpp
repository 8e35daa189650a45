// The bf16 tile GEMMs of the attention kernel (bf16_tile_blocks.h): bf16_gemm's stored product
// agrees with the product summed in double, and every block handed to an epilogue, directly from
// the products' registers or from a product in memory (the AMX path), covers the product exactly
// once and agrees with the stored product bit for bit. bf16_tile_emulated_test.cpp compiles this
// file once more with the bf16 instructions emulated (LONGTRON_BF16_EMULATED).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/safetensors.h"
#include "ops/bf16_tile_blocks.h"
#include "ops/ops.h"

namespace {

namespace isa = longtron::ops::detail::LONGTRON_BF16_ISA;
using longtron::ops::detail::bf16_t;
using longtron::safetensors::bf16_to_float;

// Stores each block into c [M, ldc], counting how often each element was handed over.
struct StoreBlocks {
  float* c;
  int* seen;
  int64_t ldc, N;
  template <int R, int NV>
  LONGTRON_BF16_TARGET void block(int64_t i, int64_t j, const __m512 (&acc)[R][NV]) {
    alignas(64) float lanes[16];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) {
        _mm512_store_ps(lanes, acc[r][v]);
        for (int x = 0; x < 16; ++x) {
          const int64_t col = j + 16 * v + x;
          EXPECT_EQ(i % 2, 0) << "blocks start at even rows (row pairs of the backward)";
          if (col < N) {
            c[(i + r) * ldc + col] = lanes[x];
            ++seen[(i + r) * ldc + col];
          } else {
            EXPECT_EQ(lanes[x], 0.0f) << "padding column " << col;
          }
        }
      }
  }
};

// One shape: random bf16 A [M, 2·K2] and B (words, N columns), the blocks of both paths against
// bf16_gemm's stored product.
void expect_blocks_match(int64_t M, int64_t N, int64_t K2, std::mt19937& rng) {
  std::uniform_int_distribution<int> bits(0x3e00, 0x4000);  // bf16 values in [0.125, 2]
  const int64_t lda = 2 * K2, ldb = (N + 15) / 16 * 16 + 64, ldc = ldb;
  const int64_t a_rows = (M + 15) / 16 * 16;  // readable rows of A (AMX loads whole tiles)
  std::vector<bf16_t> A(a_rows * lda);
  std::vector<uint32_t> B(K2 * ldb, 0);
  for (auto& a : A) a = static_cast<bf16_t>(bits(rng));  // rows past M too: read, unused
  for (int64_t k = 0; k < K2; ++k)
    for (int64_t j = 0; j < N; ++j)
      B[k * ldb + j] = uint32_t(bits(rng)) | (uint32_t(bits(rng)) << 16);
  std::vector<float> want(M * ldc), spill(M * ldc);
  isa::bf16_gemm(M, N, K2, A.data(), lda, B.data(), ldb, want.data(), ldc,
                                   false, a_rows);
  // The stored product against the sum in double: at most two roundings per pair of products.
  const double u = std::ldexp(1.0, -24);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < 2 * K2; ++k) {
        const uint32_t w = B[(k / 2) * ldb + j];
        const double p = double(bf16_to_float(A[i * lda + k])) *
                         bf16_to_float(static_cast<uint16_t>(k % 2 == 0 ? w & 0xFFFF : w >> 16));
        exact += p, mag += std::fabs(p);
      }
      ASSERT_LE(std::fabs(want[i * ldc + j] - exact), (2 * K2 + 2) * u * mag) << i << ", " << j;
    }
  for (int path = 0; path < 2; ++path) {
    SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K2 " << K2 << " path "
                                    << path);
    std::vector<float> got(M * ldc, -1.0f);
    std::vector<int> seen(M * ldc, 0);
    StoreBlocks epi{got.data(), seen.data(), ldc, N};
    if (path == 0) {
      isa::bf16_gemm_to(M, N, K2, A.data(), lda, B.data(), ldb, epi, a_rows,
                                          spill.data(), ldc);
    } else {
      isa::bf16_blocks_from(M, N, want.data(), ldc, epi);
    }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        ASSERT_EQ(seen[i * ldc + j], 1) << i << ", " << j;
        ASSERT_EQ(got[i * ldc + j], want[i * ldc + j]) << i << ", " << j;
      }
  }
}

#ifdef LONGTRON_BF16_EMULATED
#define BF16_TILE_SUITE Bf16TileBlocksEmulated
bool runs_here() {
  return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
}
#else
#define BF16_TILE_SUITE Bf16TileBlocks
// The instructions themselves (whatever LONGTRON_CPU_FEATURES_MASK hides from the dtype rule).
bool runs_here() { return __builtin_cpu_supports("avx512bf16"); }
#endif

TEST(BF16_TILE_SUITE, BlocksMatchTheStoredProduct) {
  if (!runs_here()) GTEST_SKIP() << "this CPU lacks this build's instructions (the other build runs)";
  std::mt19937 rng(3);
  for (int64_t M : {1, 2, 5, 6, 7, 13, 64})
    for (int64_t N : {1, 16, 17, 64, 65, 100, 128})
      for (int64_t K2 : {8, 16})  // 16: the AMX tiles' condition, where a CPU has them
        expect_blocks_match(M, N, K2, rng);
}

}  // namespace
