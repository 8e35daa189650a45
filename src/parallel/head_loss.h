// Chunked vocab-parallel output head + cross-entropy, shared by the Megatron (MTP/MSP/FSP) and the
// 2D tensor-parallel heads (docs/parallel.md; Megatron's
// vocab_parallel_cross_entropy fused with the output GEMMs so logits never exist for all rows).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "model/layers.h"
#include "parallel/scratch.h"

namespace longtron::parallel {

/// The head over one tensor group: model::chunked_head_loss (the one row loop of every head) with
/// the vocab-parallel cross-entropy of this rank's vocabulary shard: for each chunk of rows,
/// logits = X·Wᵀ on the shard, cross-entropy forward and (when dX is given) backward, then
/// dX = dlogits·W and dW += dlogitsᵀ·X. Holds the per-chunk scratch (logits, dlogits, lse), so one
/// object per head. The chunk size (model::head_chunk_rows of the largest shard and N) depends only
/// on V, the group size and N: the same on every rank (each chunk issues collectives that must
/// match).
class VocabParallelHeadLoss {
 public:
  /// V: whole vocabulary; this rank holds output rows [vocab_start, vocab_start + V_local) of the
  /// [V, H] weight (shard_range(V, group_size, rank), uneven allowed).
  /// `cc`: the precision of the GEMMs (it must outlive the head).
  VocabParallelHeadLoss(int64_t V, int64_t V_local, int64_t H, int64_t vocab_start, int group_size,
                        const ops::ComputeContext& cc = ops::ComputeContext::fp32());

  /// X[N, H] full rows (replicated over the group), W[V_local, H], labels[N] global ids (-100 =
  /// ignored). Returns the loss sum and valid count (identical on every rank of `comm`). When dX
  /// is not nullptr: dX[N, H] = this rank's PARTIAL d(loss_scale · loss_sum)/dX over its
  /// vocabulary shard (overwritten; the caller reduces it over the group), and dW[V_local, H] is
  /// accumulated when not nullptr. When token_losses is not nullptr, writes each row's loss (0
  /// where ignored; one extra SUM all-reduce per chunk). token_scale[N] (nullptr: none) scales
  /// each row's gradient (model::HeadLossOp::set_token_scale). Throws Error (on every rank) for a
  /// label outside [0, V) other than -100.
  model::LossSum forward_backward(float* dX, float* dW, const float* X, const float* W,
                                  const int32_t* labels, int64_t N, double loss_scale,
                                  double* token_losses, comm::Communicator& comm,
                                  const double* token_scale = nullptr);

 private:
  int64_t V_local_, H_, vocab_start_, V_shard_;
  const ops::ComputeContext* cc_;
  model::HeadChunks<float> chunks_;
};

}  // namespace longtron::parallel
