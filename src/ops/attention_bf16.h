// The bf16 varlen attention kernel (AVX512-BF16), behind the float entry points of ops.h: used
// when the calling thread's compute type is kBFloat16 and attention_bf16_runs() holds. One source
// (attention_bf16.cpp) compiled twice: `native` (vdpbf16ps, AMX tiles where available) and
// `emulated` (the bf16 instructions emulated in AVX-512F with vdpbf16ps's bits; for tests on a CPU
// without AVX512-BF16, see set_bf16_emulation_for_tests).
#pragma once
#include "ops/ops.h"

namespace longtron::ops::detail {

/// varlen_attention_forward<float>'s contract with q, k, v rounded to bf16 and the QKᵀ and PV
/// products in bf16 × bf16 → fp32 (P rounded to bf16 as FlashAttention-2's bf16 kernels do);
/// softmax, lse and the output accumulator in fp32. Runs `native`'s kernel where
/// attention_bf16_native(), else `emulated`'s (the caller checks attention_bf16_runs()).
void varlen_attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                                   const float* v, const AttentionShape& s);
/// varlen_attention_backward<float>'s contract with q, k, v and dout rounded to bf16 and the five
/// tile products in bf16 × bf16 → fp32 (P and dS rounded to bf16); D, lse, dS and every
/// accumulation (dq, dk, dv) in fp32. With `add_dq`, dq is added to (dq += this call's dQ, in
/// fp32) as varlen_attention_backward_add_dq does; dk, dv are always overwritten. Picks the
/// kernel as the forward does.
void varlen_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                                    const float* q, const float* k, const float* v,
                                    const float* out, const float* lse, const AttentionShape& s,
                                    bool add_dq = false);
/// varlen_attention_forward_bf16 with the output stored as bf16 bits: out16 [N, Hq·d] holds
/// round_to_bf16 of the out that call writes (each row rounded as the tile stores it, so no
/// fp32 output exists anywhere).
void varlen_attention_forward_bf16_out16(uint16_t* out16, float* lse, const float* q,
                                         const float* k, const float* v, const AttentionShape& s);
/// varlen_attention_backward_bf16 (without add_dq) reading the output from its bf16 bits: the
/// gradients of that call with out = the widened out16.
void varlen_attention_backward_bf16_out16(float* dq, float* dk, float* dv, const float* dout,
                                          const float* q, const float* k, const float* v,
                                          const uint16_t* out16, const float* lse,
                                          const AttentionShape& s);

// The two compilations, each with the contracts above. native needs AVX512-BF16; emulated needs
// AVX-512F/BW/VL/DQ and gives native's bits wherever native runs vdpbf16ps (not where it runs
// AMX tiles: TDPBF16PS sums each pair's products in another order).
// The entry points each compilation defines (the same declarations as above).
#define LONGTRON_ATTENTION_BF16_ENTRY_POINTS                                                    \
  void varlen_attention_forward_bf16(float* out, float* lse, const float* q, const float* k,    \
                                     const float* v, const AttentionShape& s);                  \
  void varlen_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,       \
                                      const float* q, const float* k, const float* v,           \
                                      const float* out, const float* lse,                       \
                                      const AttentionShape& s, bool add_dq = false);            \
  void varlen_attention_forward_bf16_out16(uint16_t* out16, float* lse, const float* q,         \
                                           const float* k, const float* v,                      \
                                           const AttentionShape& s);                            \
  void varlen_attention_backward_bf16_out16(float* dq, float* dk, float* dv, const float* dout, \
                                            const float* q, const float* k, const float* v,     \
                                            const uint16_t* out16, const float* lse,            \
                                            const AttentionShape& s);
namespace native {
LONGTRON_ATTENTION_BF16_ENTRY_POINTS
}  // namespace native
namespace emulated {
LONGTRON_ATTENTION_BF16_ENTRY_POINTS
}  // namespace emulated
#undef LONGTRON_ATTENTION_BF16_ENTRY_POINTS

}  // namespace longtron::ops::detail
