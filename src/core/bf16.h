// bfloat16 conversions: the one rounding rule of the project (the safetensors writer, the GEMM
// operands, the bf16 weight copy and the saved bf16 activations all round through it) and the
// one widening.
#pragma once
#include <bit>
#include <cstdint>

namespace longtron {

/// float → bfloat16 bits (the top 16 bits of the rounded fp32): round to nearest, ties to even;
/// NaN stays a NaN of the same sign and is made quiet; overflow rounds to ±inf; subnormal inputs
/// and outputs are kept, not flushed (PyTorch's c10::BFloat16 round_to_nearest_even). The hardware
/// instruction VCVTNEPS2BF16 differs only there: it flushes subnormals to signed zero.
constexpr uint16_t float_to_bf16(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN: quiet
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);  // + half an ulp, tie to even
}

/// bfloat16 bits → float: exact (bf16 is the top half of an fp32).
constexpr float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

}  // namespace longtron
