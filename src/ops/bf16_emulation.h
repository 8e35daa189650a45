// The three AVX512-BF16 instructions the bf16 attention kernel uses, emulated in AVX-512F/BW
// arithmetic with the instructions' exact results (Intel SDM, vol. 2: VDPBF16PS, VCVTNEPS2BF16,
// VCVTNE2PS2BF16). The kernel compiled with LONGTRON_BF16_EMULATED (bf16_tile_gemm.h) calls these
// instead of the instructions, so that it runs, and is tested, on a CPU without AVX512-BF16.
//
// VDPBF16PS computes, per fp32 lane, acc += a_odd·b_odd, then acc += a_even·b_even, each step a
// fused multiply-add rounded to nearest even, with denormal inputs (the bf16 operands and the
// accumulator) read as zero and denormal results flushed to zero, MXCSR ignored. A product of two
// bf16 values is exact in fp32 (8-bit significands), so two FMAs in that order, with the flushes
// done by hand, give the same bits, except for the payload of a NaN result (which operand's NaN
// an FMA passes on depends on the form the compiler picks); checked against the instruction on
// random operands, denormals, infinities and NaNs included (tests/ops/bf16_emulation_test.cpp).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "ops/kernel_isa.h"

// GCC 12 reports the pass-through operand (_mm512_undefined_*) of the unmasked AVX-512 intrinsics
// as maybe uninitialised where they are inlined (GCC bug 105593); it is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#define LONGTRON_AVX512_EMU_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

LONGTRON_ISA_BEGIN

/// x with every denormal lane replaced by zero of the same sign (the instructions' DAZ and FTZ).
LONGTRON_AVX512_EMU_TARGET __attribute__((always_inline)) inline __m512 flush_denormals(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __mmask16 denormal = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x7FFFFFFF)) &
                             ~_mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x7F800000));
  return _mm512_castsi512_ps(
      _mm512_mask_and_epi32(bits, denormal, bits, _mm512_set1_epi32(int(0x80000000u))));
}

/// The odd (upper) bf16 of each 32-bit word of w as fp32 lanes, denormals read as zero.
LONGTRON_AVX512_EMU_TARGET __attribute__((always_inline)) inline __m512 odd_bf16(__m512i w) {
  const __m512i upper = _mm512_and_si512(w, _mm512_set1_epi32(int(0xFFFF0000u)));
  return flush_denormals(_mm512_castsi512_ps(upper));
}

/// The even (lower) bf16 of each 32-bit word of w as fp32 lanes, denormals read as zero.
LONGTRON_AVX512_EMU_TARGET __attribute__((always_inline)) inline __m512 even_bf16(__m512i w) {
  return flush_denormals(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
}

/// _mm512_dpbf16_ps(acc, a, b) on operands already split into fp32 halves (odd_bf16, even_bf16):
/// the kernel's inner loop splits each operand once and reuses it across a register block.
LONGTRON_AVX512_EMU_TARGET __attribute__((always_inline)) inline __m512 dpbf16_split(
    __m512 acc, __m512 a_odd, __m512 a_even, __m512 b_odd, __m512 b_even) {
  acc = flush_denormals(_mm512_fmadd_ps(a_odd, b_odd, flush_denormals(acc)));
  return flush_denormals(_mm512_fmadd_ps(a_even, b_even, acc));
}

/// _mm512_dpbf16_ps(acc, a, b) (VDPBF16PS) with a, b as 16 words of two bf16 each.
LONGTRON_AVX512_EMU_TARGET __attribute__((always_inline)) inline __m512 dpbf16_emulated(
    __m512 acc, __m512i a, __m512i b) {
  return dpbf16_split(acc, odd_bf16(a), even_bf16(a), odd_bf16(b), even_bf16(b));
}

/// The bf16 bits of 16 fp32 lanes, in the low halves of 32-bit lanes, as VCVTNEPS2BF16 rounds:
/// NaN → its upper half made quiet, denormal → zero of the same sign, else round to nearest even.
LONGTRON_AVX512_EMU_TARGET __attribute__((always_inline)) inline __m512i cvtneps_bf16_lanes(
    __m512 x) {
  const __m512i u = _mm512_castps_si512(flush_denormals(x));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_mov_epi32(rounded, nan, quiet);
}

/// _mm512_cvtneps_pbh(x) (VCVTNEPS2BF16): 16 bf16 values.
LONGTRON_AVX512_EMU_TARGET __attribute__((always_inline)) inline __m256i cvtneps_emulated(
    __m512 x) {
  return _mm512_cvtepi32_epi16(cvtneps_bf16_lanes(x));
}

/// _mm512_cvtne2ps_pbh(hi, lo) (VCVTNE2PS2BF16): 32 bf16 values, lo's 16 first.
LONGTRON_AVX512_EMU_TARGET __attribute__((always_inline)) inline __m512i cvtne2ps_emulated(
    __m512 hi, __m512 lo) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(cvtneps_emulated(lo)), cvtneps_emulated(hi), 1);
}

LONGTRON_ISA_END

#pragma GCC diagnostic pop
