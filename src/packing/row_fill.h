// Helpers shared by the packers (pack.cpp, balanced_pack.cpp): the token rule of packed rows
// (InternEvo `packed_collate_fn`) and attention-segment bookkeeping of a MicroBatch.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "data/dataset.h"
#include "packing/batch.h"

namespace longtron::data::detail {

/// Stored id -> what the model reads (negative ids are inputs without loss; data/dataset.h).
inline int32_t input_of(int32_t id) { return stored_input(id); }
/// Stored id of the target -> label (InternEvo collate: `label if label > 0 else -100`, plus
/// kStoredLossZero -> 0).
inline int32_t label_of(int32_t id) { return stored_label(id, kIgnoreIndex); }

/// Writes segments [from, from+len) cut into pieces of at most `cut` tokens (cut <= 0: one piece):
/// indexes restart at 0 in each, one cu_seqlens entry each, max_seqlen updated.
inline void append_segments(int64_t from, int64_t len, int64_t cut, MicroBatch& out) {
  int64_t done = 0;
  while (done < len) {
    const int64_t seg = cut > 0 ? std::min(cut, len - done) : len - done;
    int32_t* idx = out.indexes.data() + from + done;
    for (int64_t i = 0; i < seg; ++i) idx[i] = static_cast<int32_t>(i);
    done += seg;
    out.cu_seqlens.push_back(static_cast<int32_t>(from + done));
    out.max_seqlen = std::max(out.max_seqlen, static_cast<int32_t>(seg));
  }
}

/// Sizes a row's arrays to P and resets cu_seqlens to [0] and max_seqlen to 0.
inline void resize_row(MicroBatch& out, int64_t P) {
  out.input_ids.resize(P);
  out.labels.resize(P);
  out.indexes.resize(P);
  out.cu_seqlens.clear();
  out.cu_seqlens.push_back(0);
  out.max_seqlen = 0;
}

/// Appends to `cu` (row-local offsets) the ends of segments [from, from+len) cut at `cut` tokens
/// (cut <= 0: one segment) — the cu_seqlens part of append_segments, without the arrays.
inline void append_segment_ends(int64_t from, int64_t len, int64_t cut, std::vector<int32_t>& cu) {
  int64_t done = 0;
  while (done < len) {
    done += cut > 0 ? std::min(cut, len - done) : len - done;
    cu.push_back(static_cast<int32_t>(from + done));
  }
}

}  // namespace longtron::data::detail
