// Per-micro-batch processing of InternEvo's scheduler (docs/data.md):
// `packed_data_normalizer` (packed mode) and `unpack_data` (unpacked mode).
#pragma once
#include <cstdint>
#include <vector>

#include "packing/batch.h"

namespace longtron::data {

/// InternEvo `packed_data_normalizer`: checks a row (input_ids/labels/indexes of equal length P,
/// cu_seqlens strictly increasing from 0 to P) and sets max_seqlen = the largest segment, pad
/// segment included. Throws Error describing the first inconsistency.
void packed_data_normalizer(MicroBatch& batch);

/// A micro-batch in unpacked form: micro_bsz rows of seq_len, row-major.
struct UnpackedBatch {
  int64_t micro_bsz = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> input_ids;  ///< [micro_bsz * seq_len]
  std::vector<int32_t> labels;     ///< [micro_bsz * seq_len]
};

/// InternEvo `unpack_data`: [1, P] -> [micro_bsz, L]. Segment j of cu_seqlens (j < micro_bsz) is
/// copied to row j (at most L tokens), the rest of each row is padded with 0 / -100; rows with no
/// segment are all pad. Throws Error if input_ids.size() != micro_bsz * seq_len.
UnpackedBatch unpack_data(const MicroBatch& batch, int64_t micro_bsz, int64_t seq_len);

}  // namespace longtron::data
