// The unit the model trains on: one packed row of P = micro_bsz × seq_len tokens (docs/data.md).
#pragma once
#include <cstdint>
#include <vector>

#include "core/ignore_index.h"

namespace longtron::data {

/// One preference pair in a row (docs/preference.md): its two sequences (prompt + chosen,
/// prompt + rejected) are two segments of the same row. Offsets are row-local token positions:
/// a sequence spans [begin, end); positions [answer, end - 1) are those whose target is an answer
/// token (the sequence's log-prob sums their −cross-entropy); [begin, end - 1) all have targets.
struct PairInRow {
  int64_t id = 0;  ///< the pair's line in its file, 0-based
  int32_t chosen_begin = 0, chosen_answer = 0, chosen_end = 0;
  int32_t rejected_begin = 0, rejected_answer = 0, rejected_end = 0;
};

/// One micro-batch after `packed_data_normalizer` (docs/data.md): a row of P tokens.
/// - input_ids[P]: token ids as the model reads them (already abs() of negative ids; pad = 0).
/// - labels[P]: next-token targets, -100 where no loss is taken.
/// - indexes[P]: position of each token inside its attention segment (RoPE positions).
/// - cu_seqlens[k+1]: row-local segment offsets, 0 … P (the pad, if any, is one segment).
/// - max_seqlen: the longest segment (pad included).
/// After a sequence split (docs/data.md) input_ids/labels/indexes hold the rank's P/T slice while
/// cu_seqlens and max_seqlen stay global.
struct MicroBatch {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;
  std::vector<int32_t> indexes;
  std::vector<int32_t> cu_seqlens;
  int32_t max_seqlen = 0;
  /// The preference pairs of the row (empty unless the dataset holds pairs).
  std::vector<PairInRow> pairs;
};

/// Label value that takes no loss (core/ignore_index.h).
using ::longtron::kIgnoreIndex;

}  // namespace longtron::data
