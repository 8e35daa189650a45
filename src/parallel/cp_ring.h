// Ring attention over a packed row (Liu et al., arXiv 2310.01889; ring-flash-attn's varlen
// forms; LoongTrain's double ring, arXiv 2406.18485), the default form of context parallelism
// (cp_attention.h). Each of the C context ranks keeps only its own P/C positions' K/V; the K/V
// blocks circulate (MPI_Isend/Irecv posted before the tiles of the block in hand are computed, so
// the next block travels while this one is used), each rank attends its queries to the keys of the
// block that it can see (causal inside each cu_seqlens segment, never across one, inside the
// sliding window if any), and the partial outputs merge by their log-sum-exp in fp32. Backward
// circulates K/V again and sends each block's dK/dV sum home along the same rings. Rows of a block
// that no rank downstream can see are not sent (cp_ring_plan.h), blocks a rank cannot see are not
// computed; the communicator counts both (Kind::kSend bytes and skipped bytes).
//
// Memory per rank: its own K/V, at most two blocks in flight per peer, the key buffer of one
// kernel call and (backward) the dK/dV sums of the blocks in transit, each freed one step after it
// is sent (two in flight on one ring): O(P/C), where the all-gather form holds the whole row's
// K/V, O(P).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "ops/compute_context.h"
#include "ops/ops.h"
#include "parallel/cp_ring_plan.h"

namespace longtron::parallel {

/// Bytes of the K/V (forward and backward) and dK/dV (backward) point-to-point messages this
/// rank sent, and those it skipped because no rank downstream could see them, summed over calls.
struct RingBytes {
  uint64_t kv_sent = 0, kv_skipped = 0, dkv_sent = 0, dkv_skipped = 0, calls = 0;
};

/// The ring's plan (kept while cu_seqlens and the window do not change) and its buffers, shared
/// by the attention ops of one model. The buffers are released at the end of every call: between
/// calls (while the other layers' activations are alive) the ring holds nothing row- or
/// share-sized.
struct RingScratch {
  RingPlan plan;
  std::vector<float> kv_local, keys, dkeys, out, lse;
  void release();
};

/// Ring attention of this rank's M queries (see the header comment); shapes as ContextAttention.
class RingAttention {
 public:
  /// `cc`: the precision of the kernels (it must outlive the op); `group_tokens`: the kernels
  /// run over groups of whole query runs of at most that many queries (0 = one call a pass).
  RingAttention(comm::CommPtr context, data::ContextBalance balance, RingSchedule schedule,
                std::shared_ptr<RingScratch> scratch = nullptr,
                const ops::ComputeContext& cc = ops::ComputeContext::fp32(),
                int64_t group_tokens = 0);
  /// out [M, hq, d] dense, lse [hq, M].
  void forward(float* out, float* lse, const float* q, const float* k, const float* v,
               const ops::AttentionShape& local);
  /// dq (layout of q), dk, dv (layout of k, v) overwritten; dout, out [M, hq, d] dense.
  void backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                const float* k, const float* v, const float* out, const float* lse,
                const ops::AttentionShape& local);
  const RingBytes& bytes() const { return bytes_; }

 private:
  const RingPlan& plan(const ops::AttentionShape& local);
  void pack_local(const float* k, const float* v, const ops::AttentionShape& local);
  /// Step k of the K/V circulation: waits for its block, forwards it, posts the next receives.
  /// Returns the block's rows (received layout, see RingPlan::slot).
  const float* kv_step(int k, int64_t row);
  void finish_kv_step(int k);
  /// The kernel shape and key buffer of `pass` against `block` (received layout).
  ops::AttentionShape pass_shape(const RingPass& pass, const float* block, int source,
                                 const ops::AttentionShape& local);
  /// The kernels of one pass (`ks` of pass_shape, keys in the key buffer), group by group: out
  /// [M, hq, d] and lse [hq, M] written.
  void forward_pass(float* out, float* lse, const float* q, const ops::AttentionShape& ks);
  /// The backward kernels of one pass, group by group: dq written (or added to, `add_dq`), the
  /// key buffer's gradient written into scratch dkeys.
  void backward_pass(bool add_dq, float* dq, const float* dout, const float* q, const float* out,
                     const float* lse, const ops::AttentionShape& ks);

  comm::CommPtr comm_;
  data::ContextBalance balance_;
  RingSchedule schedule_;
  const ops::ComputeContext& cc_;
  int64_t group_tokens_;
  std::shared_ptr<RingScratch> scratch_;
  RingBytes bytes_;
  std::map<int, std::vector<float>> blocks_;  // received K/V blocks by owner
  std::map<int, comm::Work> block_recv_;
  std::vector<std::vector<float>> send_buffers_;
  std::vector<comm::Work> sends_;
};

}  // namespace longtron::parallel
