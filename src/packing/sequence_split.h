// Sequence split for ISP / Ulysses (docs/data.md; InternEvo's split_data_sequence_parallel) and the
// XTuner-named helpers (xtuner/parallel/sequence/data_collate.py, reduce_loss.py).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "packing/batch.h"
#include "packing/unpack.h"

namespace longtron::data {

/// Throws Error unless sp_size >= 1 and 0 <= sp_rank < sp_size.
void check_sequence_parallel(int64_t sp_size, int64_t sp_rank);

/// The contiguous slice [rank·n/T, (rank+1)·n/T) of `values` (XTuner legacy
/// `split_for_sequence_parallel`: equal chunks). Throws Error if T does not divide n, pointing to
/// pad_for_sequence_parallel.
std::vector<int32_t> split_for_sequence_parallel(const std::vector<int32_t>& values,
                                                 int64_t sp_size, int64_t sp_rank);

/// ISP / Ulysses split of a packed row (docs/data.md): rank r keeps [rP/T, (r+1)P/T) of input_ids,
/// labels and indexes (labels were computed on the whole row, so no target is lost); cu_seqlens and
/// max_seqlen stay global. Seed: T=2, rank 1 of row 0 holds 2514 … 314, indexes 4 5 6 0 1 2 3 4.
MicroBatch split_for_sequence_parallel(const MicroBatch& row, int64_t sp_size, int64_t sp_rank);

/// Unpacked split (docs/data.md): each [micro_bsz, L] row is cut on its L dimension; the result is
/// [micro_bsz, L/T]. Throws Error if T does not divide L.
UnpackedBatch split_for_sequence_parallel(const UnpackedBatch& batch, int64_t sp_size,
                                          int64_t sp_rank);

/// XTuner `pad_for_sequence_parallel(tensor, padding_value)`: right-pads `values` with
/// `padding_value` to the next multiple of sp_size (no-op if divisible).
void pad_for_sequence_parallel(std::vector<int32_t>& values, int32_t padding_value,
                               int64_t sp_size);

/// Pads a whole row to a multiple of sp_size: input_ids 0, labels -100, indexes 0, and the pad
/// becomes its own segment (cu_seqlens gets the new length appended; max_seqlen updated) — XTuner
/// `pad_cumulative_len_for_sequence_parallel`. No-op if already divisible.
void pad_for_sequence_parallel(MicroBatch& row, int64_t sp_size);

/// The exact token-weighted loss of a sequence-parallel group, from every rank's (mean_loss,
/// num_tokens) — XTuner's `reduce_sequence_parallel_loss(mean_loss, num_tokens)` without its
/// mean-of-means gradient: Σ(meanᵣ·nᵣ) / Σnᵣ. A rank with nᵣ = 0 contributes 0 (its mean, maybe
/// NaN, is not read); a group with no token at all gives 0, never NaN. Throws Error if the spans
/// differ in length or a count is negative.
/// This is the pure part; the communication layer all-gathers (or all-reduces Σmean·n and Σn) over
/// the sp group and calls it, so every rank of the group gets the same value.
double reduce_sequence_parallel_loss(std::span<const double> mean_loss,
                                     std::span<const int64_t> num_tokens);

}  // namespace longtron::data
