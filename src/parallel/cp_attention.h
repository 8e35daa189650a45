// Context-parallel attention over a packed row, all-gather form (Llama 3's context parallelism,
// arXiv 2407.21783 §3.3.2; ring-flash-attn's llama3_flash_attn_varlen_func), with the token
// assignment of packing/context_split.h (contiguous, zigzag or document). Each of the C ranks of the
// CONTEXT group holds the queries, keys and values of its P/C positions (for its heads); forward
// all-gathers K and V of the whole row (kv heads are few), copies for each run of its queries the
// keys [segment start, run end) into one key buffer and runs the varlen kernel with separate key
// segments (bottom-right aligned causal: a query sees exactly the keys it sees in the whole row).
// Backward re-gathers K/V (nothing row-sized is kept between passes), computes dQ and the key
// buffer's dK/dV, adds those into the row and reduce-scatters them home (SUM over the group).
// The ring form (cp_ring.h) is the default: it keeps O(P/C) K/V per rank where this form holds
// the whole row's; the all-gather form stays as an option (one kernel call, no merge) and as the
// reference the ring is tested against.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "ops/ops.h"
#include "packing/context_split.h"
#include "parallel/cp_ring.h"

namespace longtron::parallel {

/// The row-sized plan of one cu_seqlens (the same on every rank of the group): the assignment,
/// this rank's query runs and key ranges, and for every key-buffer row its row in the all-gathered
/// K/V (which holds rank 0's positions, then rank 1's, …).
struct ContextPlan {
  std::vector<int32_t> cu_seqlens;
  data::ContextSegments segments;
  std::vector<int32_t> key_rows;
};

/// Buffers between calls, shared by the attention ops of one model (one plan, one set of
/// row-sized buffers, not one per layer).
struct ContextScratch {
  ContextPlan plan;
  std::vector<float> kv_local, kv_row, keys, dkeys;
  std::shared_ptr<RingScratch> ring = std::make_shared<RingScratch>();
};

/// How the context ranks exchange K/V: ring attention (default) or an all-gather of the row.
enum class ContextForm { kRing, kAllGather };

/// The form, and the ring's layout: inner rings of window_size context ranks (InternEvo's
/// sequence_2D.window_size; 1 = one ring), interleaved placement (cp_ring_plan.h).
struct ContextOptions {
  ContextForm form = ContextForm::kRing;
  int window_size = 1;
  bool interleaved = false;
  /// The precision of the attention kernels (the engine's context; it must outlive the op).
  const ops::ComputeContext* compute = &ops::ComputeContext::fp32();
  /// The kernels run over groups of whole query runs (whole documents without context
  /// parallelism) of at most this many queries (ops/attention_groups.h;
  /// model::attention_group_tokens), so their packed copies hold a group, not the rank's share
  /// or the row; 0 = one call. The all-gather form runs one call.
  int64_t group_tokens = 0;
};

/// Attention of this rank's M = P/C queries [M, hq, d] against the causal keys of the whole row.
/// q rows have stride q_stride, k and v rows (this rank's M positions) kv_stride, as in
/// ops::AttentionShape; `cu_seqlens[num_segments + 1]` is the GLOBAL row's (0 … C·M).
/// Collective over `context`. Throws Error if cu_seqlens does not end at C·M.
class ContextAttention {
 public:
  ContextAttention(comm::CommPtr context, data::ContextBalance balance,
                   std::shared_ptr<ContextScratch> scratch = nullptr, ContextOptions options = {});
  int size() const { return comm_->size(); }
  /// Point-to-point bytes of the ring (nullptr under the all-gather form).
  const RingBytes* ring_bytes() const { return ring_ ? &ring_->bytes() : nullptr; }
  /// out [M, hq, d] dense, lse [hq, M].
  void forward(float* out, float* lse, const float* q, const float* k, const float* v,
               const ops::AttentionShape& local) const;
  /// dq (layout of q), dk, dv (layout of k, v) overwritten; dout, out [M, hq, d] dense.
  void backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                const float* v, const float* out, const float* lse,
                const ops::AttentionShape& local) const;

 private:
  /// The plan for `local.cu_seqlens` (cached while it does not change).
  const ContextPlan& plan(const ops::AttentionShape& local) const;
  /// All-gathers K/V and fills the key buffer [Nk, 2·hkv·d] (k heads then v heads per row).
  void gather_keys(const float* k, const float* v, const ops::AttentionShape& local) const;
  /// The kernel's shape: this rank's query runs against the key buffer.
  ops::AttentionShape kernel_shape(const ops::AttentionShape& local) const;

  comm::CommPtr comm_;
  data::ContextBalance balance_;
  std::shared_ptr<ContextScratch> scratch_;
  const ops::ComputeContext* compute_;
  std::unique_ptr<RingAttention> ring_;  // nullptr under the all-gather form
};

}  // namespace longtron::parallel
