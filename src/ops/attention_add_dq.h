// varlen_attention_backward with dq added to rather than written over the caller's: ring attention
// (parallel/cp_ring.cpp) sums a query's dq over the key blocks it sees, one kernel call per block,
// without a q-sized scratch per call.
#pragma once
#include "ops/ops.h"

namespace longtron::ops {

/// varlen_attention_backward's contract, except that dq (layout of q, only its head columns) is
/// ADDED to: dq += this call's dQ, for the queries of the call's segments (others are left as they
/// are). dk, dv are overwritten as there. The sum per element is the one the caller would form
/// with a scratch (dq + scratch, in float), so results are the same bit for bit, in the fp32 and
/// the bf16 kernels alike (the kernel of `cc`'s compute type).
template <typename T>
void varlen_attention_backward_add_dq(const ComputeContext& cc, T* dq, T* dk, T* dv,
                                      const T* dout, const T* q, const T* k, const T* v,
                                      const T* out, const T* lse, const AttentionShape& s);

}  // namespace longtron::ops
