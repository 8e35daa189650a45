// The fp32/double attention kernels of each instruction set (ops/kernel_isa.h): attention.cpp
// and attention_backward.cpp compiled for AVX2 (the baseline) and for AVX-512. The public
// varlen_attention_* (ops/ops.h) choose one at run time (attention_dispatch.cpp).
#pragma once
#include "ops/ops.h"

namespace longtron::ops::detail {

// One declaration per instruction set; the definitions are the same source's compilations.
#define LONGTRON_ATTENTION_KERNELS                                                              \
  /** FlashAttention-2 forward (Dao 2023, Algorithm 1): out [N, Hq·d] (row stride               \
      s.q_stride) and lse [Hq, N] from q, k, v as varlen_attention_forward describes. */       \
  template <typename T>                                                                        \
  void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,                   \
                         const AttentionShape& s);                                             \
  /** FlashAttention-2 backward (Algorithm 2): dq (overwritten, or added to with add_dq), dk,   \
      dv from dout and the forward's out and lse. */                                           \
  template <typename T>                                                                        \
  void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,          \
                          const T* v, const T* out, const T* lse, const AttentionShape& s,     \
                          bool add_dq);
inline namespace avx2 {
LONGTRON_ATTENTION_KERNELS
}  // namespace avx2
inline namespace avx512 {
LONGTRON_ATTENTION_KERNELS
}  // namespace avx512
#undef LONGTRON_ATTENTION_KERNELS

}  // namespace longtron::ops::detail
