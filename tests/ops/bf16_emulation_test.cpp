// The AVX-512F emulation of the bf16 instructions (ops/bf16_emulation.h) against the instructions
// themselves where the CPU has them (bit for bit, on random operands with denormals, infinities
// and NaNs among them), and everywhere against scalar models of the Intel SDM's definitions:
// VDPBF16PS as two fused multiply-adds (odd pair first) with denormals read as and flushed to zero,
// VCVTNEPS2BF16 as core/bf16.h's round to nearest even except that denormals become zero.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "core/bf16.h"
#include "ops/bf16_emulation.h"

namespace {

namespace detail = longtron::ops::detail;

bool avx512_here() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

float flushed(float x) {  // a denormal becomes zero of its sign
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// The SDM's VDPBF16PS on one lane: words a, b of two bf16 each, accumulator acc.
float dp_model(float acc, uint32_t a, uint32_t b) {
  auto lo = [](uint32_t w) { return flushed(std::bit_cast<float>(w << 16)); };
  auto hi = [](uint32_t w) { return flushed(std::bit_cast<float>(w & 0xFFFF0000u)); };
  acc = flushed(std::fma(hi(a), hi(b), flushed(acc)));
  return flushed(std::fma(lo(a), lo(b), acc));
}

// The SDM's VCVTNEPS2BF16 on one value.
uint16_t cvt_model(float x) {
  const uint32_t u = bits(x);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
  return longtron::float_to_bf16(flushed(x));
}

// Random 32-bit patterns: half uniform over all bits (NaNs, infinities, denormals included),
// half with exponents near the middle (the sums the kernels form) and some denormal halves.
uint32_t random_word(std::mt19937& rng, bool wild) {
  uint32_t w = rng();
  if (wild) return w;
  for (int half = 0; half < 2; ++half) {
    const uint32_t exponent = rng() % 16 == 0 ? 0 : 100 + rng() % 56;
    const int shift = 16 * half;
    w = (w & ~(0x7F80u << shift)) | (exponent << (7 + shift));
  }
  return w;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) void native_ops(
    const float* acc, const uint32_t* a, const uint32_t* b, float* dp, uint16_t* cvt,
    uint16_t* cvt2) {
  const __m512i va = _mm512_loadu_si512(a), vb = _mm512_loadu_si512(b);
  const __m512 vacc = _mm512_loadu_ps(acc), vx = _mm512_castsi512_ps(va);
  _mm512_storeu_ps(dp, _mm512_dpbf16_ps(vacc, (__m512bh)va, (__m512bh)vb));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(cvt), (__m256i)_mm512_cvtneps_pbh(vacc));
  _mm512_storeu_si512(cvt2, (__m512i)_mm512_cvtne2ps_pbh(vx, vacc));
}

LONGTRON_AVX512_EMU_TARGET void emulated_ops(const float* acc, const uint32_t* a,
                                             const uint32_t* b, float* dp, uint16_t* cvt,
                                             uint16_t* cvt2) {
  const __m512i va = _mm512_loadu_si512(a), vb = _mm512_loadu_si512(b);
  const __m512 vacc = _mm512_loadu_ps(acc), vx = _mm512_castsi512_ps(va);
  _mm512_storeu_ps(dp, detail::dpbf16_emulated(vacc, va, vb));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(cvt), detail::cvtneps_emulated(vacc));
  _mm512_storeu_si512(cvt2, detail::cvtne2ps_emulated(vx, vacc));
}

struct Results {
  float dp[16];
  uint16_t cvt[16], cvt2[32];
};

}  // namespace

TEST(Bf16Emulation, MatchesTheInstructionsAndTheirDefinitions) {
  if (!avx512_here()) GTEST_SKIP() << "no AVX-512 on this CPU";
  const bool native = __builtin_cpu_supports("avx512bf16");
  std::mt19937 rng(5);
  int64_t lanes = 0, denormal_operands = 0, nan_results = 0;
  for (int trial = 0; trial < 40000; ++trial) {
    const bool wild = trial % 4 == 0;
    alignas(64) float acc[16];
    alignas(64) uint32_t a[16], b[16];
    for (int i = 0; i < 16; ++i) {
      a[i] = random_word(rng, wild);
      b[i] = random_word(rng, wild);
      acc[i] = std::bit_cast<float>(random_word(rng, wild));
      denormal_operands += (a[i] & 0x7F80u) == 0;
    }
    Results emu{}, nat{};
    emulated_ops(acc, a, b, emu.dp, emu.cvt, emu.cvt2);
    if (native) native_ops(acc, a, b, nat.dp, nat.cvt, nat.cvt2);
    for (int i = 0; i < 16; ++i, ++lanes) {
      SCOPED_TRACE(testing::Message() << std::hex << "acc " << bits(acc[i]) << " a " << a[i]
                                      << " b " << b[i]);
      nan_results += std::isnan(emu.dp[i]);
      const float model = dp_model(acc[i], a[i], b[i]);
      // A NaN's payload depends on which operand the compiler's FMA form reads first (and the
      // instruction's own is no operand's): only NaN-ness is compared.
      if (!std::isnan(model)) {
        ASSERT_EQ(bits(emu.dp[i]), bits(model));
      }
      ASSERT_EQ(std::isnan(emu.dp[i]), std::isnan(model));
      ASSERT_EQ(emu.cvt[i], cvt_model(acc[i]));
      ASSERT_EQ(emu.cvt2[i], cvt_model(acc[i]));
      ASSERT_EQ(emu.cvt2[16 + i], cvt_model(std::bit_cast<float>(a[i])));
      if (!native) continue;
      if (std::isnan(nat.dp[i])) {
        ASSERT_TRUE(std::isnan(emu.dp[i]));
      } else {
        ASSERT_EQ(bits(emu.dp[i]), bits(nat.dp[i]));
      }
      ASSERT_EQ(emu.cvt[i], nat.cvt[i]);
      for (int h = 0; h < 2; ++h) ASSERT_EQ(emu.cvt2[16 * h + i], nat.cvt2[16 * h + i]);
    }
  }
  std::printf("%lld lanes (%s), %lld denormal operands, %lld NaN results\n",
              static_cast<long long>(lanes), native ? "against the instructions" : "models only",
              static_cast<long long>(denormal_operands), static_cast<long long>(nan_results));
  EXPECT_GT(denormal_operands, 1000);
  EXPECT_GT(nan_results, 1000);
}

// The order matters: acc = 1 + 2^-23 (odd significand), odd pair −2^-24 · 1, even pair 2^-24 · 1.
// Odd first (the instruction): 1 + 2^-24 is a tie, to even: 1; then 1 + 2^-24 again: 1. Even
// first: 1 + 3·2^-24 ties to 1 + 2^-22, then 1 + 3·2^-24 ties to 1 + 2^-22 again.
TEST(Bf16Emulation, OddPairIsAddedFirst) {
  if (!avx512_here()) GTEST_SKIP() << "no AVX-512 on this CPU";
  alignas(64) float acc[16], dp[16];
  alignas(64) uint32_t a[16], b[16];
  uint16_t cvt[16], cvt2[32];
  for (int i = 0; i < 16; ++i) {
    acc[i] = std::nextafter(1.0f, 2.0f);
    a[i] = 0xB3803380u;  // bf16 −2^-24 (odd, upper half), 2^-24 (even, lower half)
    b[i] = 0x3F803F80u;  // bf16 1 in both halves
  }
  emulated_ops(acc, a, b, dp, cvt, cvt2);
  EXPECT_EQ(dp[0], 1.0f);
  EXPECT_EQ(std::fma(-0x1p-24f, 1.0f, std::fma(0x1p-24f, 1.0f, acc[0])), 1.0f + 0x1p-22f);
  if (__builtin_cpu_supports("avx512bf16")) {
    native_ops(acc, a, b, dp, cvt, cvt2);
    EXPECT_EQ(dp[0], 1.0f);
  }
}
