// XTuner's sequence-parallel API under its own names (xtuner/parallel/sequence;
// docs/isp.md), over longtron's communicator, so code written against XTuner's five calls maps one to
// one: init_sequence_parallel → SequenceParallelGroups; SequenceParallelSampler (packing/sampler.h)
// built from the groups; pad_for_sequence_parallel / split_for_sequence_parallel
// (packing/sequence_split.h) applied to a row for this rank; the attention is the ISP
// UlyssesAttention (isp_attention.h); reduce_sequence_parallel_loss over the SP group — exact.
#pragma once
#include <cstdint>

#include "comm/communicator.h"
#include "packing/batch.h"
#include "packing/context_split.h"
#include "packing/sampler.h"

namespace longtron::parallel {

/// The groups of XTuner's init_sequence_parallel: SP groups are contiguous blocks
/// [i·sp, (i+1)·sp) of the world, DP groups stride sp ({j, j+sp, …}) — the TENSOR and DATA groups
/// of an isp layout with T = sp.
struct SequenceParallelGroups {
  comm::CommPtr sp;  ///< get_sequence_parallel_group()
  comm::CommPtr dp;  ///< get_data_parallel_group()
  /// 2D-Attention inside each SP group (docs/isp.md): HEAD groups of sp / context_size consecutive
  /// SP ranks (Ulysses), CONTEXT groups of the ranks with the same head rank; head = sp and
  /// context = one rank when context_size is 1.
  comm::CommPtr head, context;
  data::ContextBalance balance = data::ContextBalance::kZigzag;
  int sp_size() const { return sp->size(); }
  int sp_rank() const { return sp->rank(); }
  int dp_size() const { return dp->size(); }
  int dp_rank() const { return dp->rank(); }
};

/// XTuner `init_sequence_parallel(sequence_parallel_size)`. Collective over `world`. Throws Error
/// if sequence_parallel_size < 1 or does not divide the world size (XTuner raises RuntimeError).
/// With context_size > 1 (which must divide it) the SP group is split head-first into
/// sp / context_size × context_size for 2D-Attention, the shares assigned by `balance`.
SequenceParallelGroups init_sequence_parallel(
    const comm::CommPtr& world, int sequence_parallel_size, int context_size = 1,
    data::ContextBalance balance = data::ContextBalance::kZigzag);

/// XTuner `SequenceParallelSampler(dataset, shuffle, seed, round_up)`: rank and size from the DP
/// group, so every rank of an SP group draws the same sample ids.
data::SequenceParallelSampler make_sequence_parallel_sampler(const SequenceParallelGroups& groups,
                                                             int64_t num_samples, bool shuffle,
                                                             uint32_t seed, bool round_up = true);

/// pad_for_sequence_parallel then split_for_sequence_parallel of a packed row for this rank (pad:
/// input 0, label -100, index 0, its own segment; cu_seqlens stays global; docs/data.md). Under
/// 2D-Attention: split_for_context_parallel (this rank's slice of its context share).
data::MicroBatch pad_and_split_for_sequence_parallel(data::MicroBatch row,
                                                     const SequenceParallelGroups& groups);

/// XTuner `reduce_sequence_parallel_loss(mean_loss, loss_scale=num_tokens, sp_group)`, exact:
/// Σ(meanᵣ·nᵣ) / Σnᵣ over the group, summed in double; a rank with nᵣ = 0 contributes 0 whatever
/// its mean (even NaN); a group with no token gives 0. Same value on every rank. Collective.
double reduce_sequence_parallel_loss(double mean_loss, int64_t num_tokens,
                                     comm::Communicator& sp_group);

}  // namespace longtron::parallel
