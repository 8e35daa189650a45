// Packed rows of preference pairs (docs/preference.md): many pairs share a row, the two sequences
// of a pair (prompt + chosen, prompt + rejected) are two attention segments of the same row, and a
// pair is never cut across rows, so a pair is always in one micro-batch. The rest of a row that
// the next pair does not fit is one pad segment.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "data/preference_pairs.h"
#include "packing/pack.h"

namespace longtron::data {

/// The config spellings of PackConfig::pair_keep_end (TRL's truncation_mode).
inline constexpr std::array<EnumName<bool>, 2> kTruncationModeNames{
    {{false, "keep_start"}, {true, "keep_end"}}};

/// Rows of pairs, filled greedily in `order` (pair ids): a pair goes into the current row when
/// both its sequences fit the rest of it, else it starts the next row. Per sequence, labels are the
/// next token of the sequence (-100 at its end); indexes run 0..len-1; cu_seqlens gets one entry
/// per sequence, then the pad. A sequence longer than config.pair_max_length (when > 0) is cut to
/// it per TRL's truncation_mode (keep_start: its first tokens; keep_end: its last, the prompt
/// losing its head). MicroBatch::pairs records where each pair's sequences and answers lie.
/// Throws Error naming the file and line for a sequence longer than data.seq_len (an attention
/// segment; set preference.max_length to truncate), a pair longer than packed_length, or a
/// sequence with no answer token left after truncation. `source` must outlive the object.
class PairRows : public RowSource {
 public:
  PairRows(const PairSource& source, std::vector<int64_t> order, const PackConfig& config);
  int64_t num_rows() const override { return static_cast<int64_t>(row_starts_.size()) - 1; }
  void row_into(int64_t k, MicroBatch& out) const override;
  int64_t packed_length() const override { return config_.packed_length(); }
  void segments_into(int64_t k, std::vector<int32_t>& cu_seqlens) const override;
  /// Number of pairs in row k.
  int64_t pairs_in_row(int64_t k) const { return row_starts_.at(k + 1) - row_starts_.at(k); }

 private:
  /// The kept part of document d: [skip, skip + length) of its tokens, with `prompt` of them prompt.
  struct Kept {
    int64_t skip, length, prompt;
  };
  Kept kept(int64_t document) const;

  const PairSource& source_;
  std::vector<int64_t> order_;      // pair ids in row order
  std::vector<int64_t> row_starts_;  // [rows+1] index into order_ of each row's first pair
  PackConfig config_;
};

/// Pair ids of a pairs file in training order: 0..n-1, permuted by numpy_shuffle(seed) when
/// `shuffle` (pairs move as units; documents are never shuffled apart).
std::vector<int64_t> pair_order(const PairSource& source, bool shuffle, uint32_t seed);

}  // namespace longtron::data
