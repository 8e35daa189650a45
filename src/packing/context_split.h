// Token-to-context-rank assignment for context parallelism over a packed row (docs/isp.md,
// "2D-Attention"). A row of P tokens (cu_seqlens[0] = 0 … cu_seqlens[k] = P, the pad its own
// segment) is cut into C shares of exactly P/C positions; context rank r computes the attention of
// the queries it holds against every key of their segment up to them (gathered from the others).
// Three balances of the causal work Σ(offset + 1) per rank:
//   - contiguous: rank r holds [rP/C, (r+1)P/C) (Llama 3's all-gather CP, arXiv 2407.21783).
//   - zigzag: the row in 2C chunks, rank r holds chunks r and 2C−1−r (ring-flash-attn's zigzag,
//     InternEvo / LoongTrain arXiv 2406.18485); balances one long causal segment, not many short.
//   - document: each long segment is cut zigzag over the C ranks by itself, short ones are assigned
//     whole, largest first, to the rank with the least work that still has room (WLB-LLM,
//     arXiv 2503.17924; Llama 3's per-document split). A segment is long when its causal work
//     l(l+1)/2 exceeds kDocumentSplitShare of a rank's mean work, or l > P/C. A short segment that
//     fits no rank's room is cut to fill the rank with the most room.
// Every function is pure: every rank of a context group computes the same assignment.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "packing/batch.h"

namespace longtron::data {

enum class ContextBalance { kContiguous, kZigzag, kDocument };
/// The config spellings of ContextBalance (parallel.sequence_2D.balance).
inline constexpr std::array<EnumName<ContextBalance>, 3> kContextBalanceNames{
    {{ContextBalance::kContiguous, "contiguous"},
     {ContextBalance::kZigzag, "zigzag"},
     {ContextBalance::kDocument, "document"}}};

/// Parses "contiguous" / "zigzag" / "document"; anything else is an Error naming `key`.
ContextBalance parse_context_balance(const std::string& value,
                                     const std::string& key = "parallel.sequence_2D.balance");
/// The config spelling of a balance.
std::string context_balance_name(ContextBalance balance);

/// A segment whose causal work exceeds this share of a rank's mean work is split over all context
/// ranks under "document". Greedy whole-segment assignment overshoots the mean by at most about
/// one whole segment's work, so 1/32 keeps max/mean near 1.03 while documents far shorter than a
/// rank's share stay whole (fewer pieces: fewer key ranges per rank, and for a ring, fewer
/// visible blocks). Measured figures: docs/isp.md.
inline constexpr double kDocumentSplitShare = 1.0 / 32.0;

/// The positions (0 … P−1 of the row) each of the C context ranks holds, ascending; result[r] has
/// exactly P/C entries and together they are a permutation of 0 … P−1. P = cu_seqlens.back().
/// Throws Error unless C >= 1, cu_seqlens is 0 … P non-decreasing, and C divides P (pad the row
/// first: pad_for_sequence_parallel).
std::vector<std::vector<int32_t>> context_assignment(std::span<const int32_t> cu_seqlens,
                                                     int64_t context_size, ContextBalance balance);

/// Σ over `positions` of (offset of the position in its segment + 1): the keys each query sees
/// under causal attention inside its segment, at most `window` of them with a sliding window
/// (0 = none). Positions must lie in [0, P).
int64_t attention_work(std::span<const int32_t> cu_seqlens, std::span<const int32_t> positions,
                       int64_t window = 0);

/// max ÷ mean of the attention work of each rank's positions (1 when every rank has none).
double context_imbalance(std::span<const int32_t> cu_seqlens,
                         const std::vector<std::vector<int32_t>>& assignment, int64_t window = 0);

/// (max, mean) over the C context ranks of their attention work on one row, after padding the row
/// to a multiple of `pad_to` (a multiple of C; the pad is its own segment, as the split does).
/// Summed over a step's rows, Σ max ÷ Σ mean is the attention time lost to waiting for the slowest
/// context rank (the metrics' "cp_imbalance").
std::pair<double, double> context_work_max_mean(std::span<const int32_t> cu_seqlens,
                                                int64_t context_size, int64_t pad_to,
                                                ContextBalance balance);

/// The attention a context rank computes, as varlen segments (flash_attn_varlen_func with separate
/// key segments, bottom-right aligned): its positions (ascending) cut into maximal runs [a, b) of
/// consecutive positions inside one row segment starting at s. Run i has queries
/// cu_seqlens_q[i] … cu_seqlens_q[i+1] (indices into the rank's positions) and keys
/// cu_seqlens_k[i] … cu_seqlens_k[i+1] of a key buffer that concatenates the row ranges
/// key_ranges[i] = [s, b): query a + j sees row keys s … a + j.
struct ContextSegments {
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
  std::vector<std::pair<int32_t, int32_t>> key_ranges;
  int32_t max_seqlen_q = 0, max_seqlen_k = 0;
};
/// Throws Error unless `positions` is ascending and inside [0, P).
ContextSegments context_segments(std::span<const int32_t> cu_seqlens,
                                 std::span<const int32_t> positions);

/// The shard of one rank of a 2D sequence-parallel group (head_size × context_size ranks): the row
/// is padded to a multiple of head_size · context_size (pad_for_sequence_parallel), context rank c
/// holds context_assignment(...)[c], and head rank h of it the h-th contiguous slice of those
/// positions. input_ids, labels (computed on the whole row before, as for every split) and indexes
/// are gathered in that order; cu_seqlens and max_seqlen stay global (of the padded row).
/// With context_size 1 this is split_for_sequence_parallel. Throws Error on bad sizes or ranks.
MicroBatch split_for_context_parallel(const MicroBatch& row, int64_t head_size, int64_t head_rank,
                                      int64_t context_size, int64_t context_rank,
                                      ContextBalance balance);

}  // namespace longtron::data
