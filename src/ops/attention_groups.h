// Varlen attention over groups of whole segments, so that the kernels' packed copies (forward:
// K and V tiles; backward: q, dO, dq, lse, D) are sized by a group instead of the whole row.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "ops/ops.h"

namespace longtron::ops {

/// One group of whole segments of an AttentionShape: its queries are rows [t0, t0 + n) of the
/// shape's, its keys rows [k0, k0 + shape.num_kv_tokens) of k and v under key segments
/// (cu_seqlens_k), else the same rows as its queries (k0 = t0). `shape` is the group's own (its
/// cu_seqlens, cu_seqlens_k rebased to 0, key_offsets the slice of its segments).
struct AttentionGroup {
  int64_t t0 = 0, n = 0, k0 = 0;
  AttentionShape shape;
};

/// Calls f(group) for consecutive groups of whole segments of `s` of at most `group_tokens`
/// queries (a longer segment is a group of its own); the whole shape as one group when
/// group_tokens <= 0 or it holds no more. Under key segments (context parallelism: each segment's
/// keys are rows of their own) every segment, even one without queries, belongs to one group, so
/// the groups' dk and dv cover every key row once.
void for_each_attention_group(const AttentionShape& s, int64_t group_tokens,
                              const std::function<void(const AttentionGroup&)>& f);

/// The lse of one group of a shape whose lse is head-major [Hq, N]: a [Hq, n] buffer filled from
/// the shape's (in) or copied into it (store); the shape's own when the group is all of it.
template <typename T>
class GroupLse {
 public:
  explicit GroupLse(const AttentionShape& s) : Hq_(s.num_heads), N_(s.num_tokens) {}
  /// Where a forward writes the group's lse; store() then puts it in the row.
  T* out(T* row, int64_t n) { return n == N_ ? row : sized(n); }
  void store(T* row, int64_t t0, int64_t n) const {
    if (n == N_) return;
    for (int64_t h = 0; h < Hq_; ++h)
      std::copy(buf_.data() + h * n, buf_.data() + (h + 1) * n, row + h * N_ + t0);
  }
  /// The group's lse as a backward reads it.
  const T* in(const T* row, int64_t t0, int64_t n) {
    if (n == N_) return row;
    T* const g = sized(n);
    for (int64_t h = 0; h < Hq_; ++h)
      std::copy(row + h * N_ + t0, row + h * N_ + t0 + n, g + h * n);
    return g;
  }

 private:
  T* sized(int64_t n) {
    buf_.resize(static_cast<size_t>(Hq_ * n));
    return buf_.data();
  }
  int64_t Hq_, N_;
  std::vector<T> buf_;
};

/// varlen_attention_forward over consecutive groups of whole segments of at most `group_tokens`
/// queries (a segment longer than that is a group of its own), one kernel call per group (in
/// the precision of `cc`): each
/// query's out and lse are the values one call over the whole shape gives (segments never see
/// each other, and a query block's computation does not depend on the other blocks of the call),
/// while the kernel's packed arenas hold one group. Shapes with cu_seqlens_k or key_offsets
/// (context parallelism) and group_tokens <= 0 run as one call. Same layouts as
/// varlen_attention_forward (lse [Hq, N], head-major over the whole shape).
template <typename T>
void varlen_attention_forward_groups(const ComputeContext& cc, T* out, T* lse, const T* q,
                                     const T* k, const T* v,
                                     const AttentionShape& s, int64_t group_tokens);

/// varlen_attention_backward over the groups of varlen_attention_forward_groups; each gradient
/// equals the one call's (dq, dk, dv of a group are written only by its call). dq, dk, dv may
/// ALIAS q, k, v (the same buffer, e.g. one packed qkv buffer that becomes dqkv): both kernels
/// read a query row only while packing, before any dq is written, and a key row only in the one
/// work item that writes its dk, dv.
template <typename T>
void varlen_attention_backward_groups(const ComputeContext& cc, T* dq, T* dk, T* dv,
                                      const T* dout, const T* q, const T* k,
                                      const T* v, const T* out, const T* lse,
                                      const AttentionShape& s, int64_t group_tokens);

/// varlen_attention_forward_groups in float with the output stored in bf16: out16 [N, Hq·d]
/// holds round_to_bf16 of the fp32 out (for a model under bf16, whose consumers read the output
/// rounded anyway). The bf16 kernel (where attention_bf16_runs(cc)) rounds each row as it
/// stores it, so no fp32 output exists; otherwise each group's out is computed into a
/// group-sized fp32 buffer and rounded from there. lse as varlen_attention_forward_groups.
void varlen_attention_forward_groups_bf16_out(const ComputeContext& cc, uint16_t* out16,
                                              float* lse, const float* q,
                                              const float* k, const float* v,
                                              const AttentionShape& s, int64_t group_tokens);

/// varlen_attention_backward_groups reading the output from out16 (as the function above stores
/// it): the same gradients as varlen_attention_backward_groups with out = the widened out16 (the
/// bf16 kernel widens each row as it reads it; otherwise a group at a time into a buffer). dq,
/// dk, dv may alias q, k, v as there.
void varlen_attention_backward_groups_bf16_out(const ComputeContext& cc, float* dq, float* dk,
                                               float* dv, const float* dout,
                                               const float* q, const float* k, const float* v,
                                               const uint16_t* out16, const float* lse,
                                               const AttentionShape& s, int64_t group_tokens);

}  // namespace longtron::ops
