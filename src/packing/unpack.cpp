#include "packing/unpack.h"

#include <algorithm>

#include "core/error.h"

namespace longtron::data {

void packed_data_normalizer(MicroBatch& batch) {
  const auto P = static_cast<int64_t>(batch.input_ids.size());
  check(static_cast<int64_t>(batch.labels.size()) == P &&
            static_cast<int64_t>(batch.indexes.size()) == P,
        "micro-batch: input_ids [{}], labels [{}] and indexes [{}] must have one length",
        batch.input_ids.size(), batch.labels.size(), batch.indexes.size());
  const auto& cu = batch.cu_seqlens;
  check(cu.size() >= 2 && cu.front() == 0 && cu.back() == P,
        "micro-batch: cu_seqlens must run from 0 to the row length {} (got {} entries)", P,
        cu.size());
  int32_t longest = 0;
  for (size_t i = 1; i < cu.size(); ++i) {
    check(cu[i] > cu[i - 1], "micro-batch: cu_seqlens not increasing at entry {} ({} after {})", i,
          cu[i], cu[i - 1]);
    longest = std::max(longest, cu[i] - cu[i - 1]);
  }
  batch.max_seqlen = longest;
}

UnpackedBatch unpack_data(const MicroBatch& batch, int64_t micro_bsz, int64_t seq_len) {
  check(micro_bsz > 0 && seq_len > 0, "unpack_data: micro_bsz {} and seq_len {} must be > 0",
        micro_bsz, seq_len);
  check(static_cast<int64_t>(batch.input_ids.size()) == micro_bsz * seq_len &&
            batch.labels.size() == batch.input_ids.size(),
        "unpack_data: row has {} tokens, expected micro_bsz x seq_len = {} x {}",
        batch.input_ids.size(), micro_bsz, seq_len);
  UnpackedBatch out{micro_bsz, seq_len, std::vector<int32_t>(micro_bsz * seq_len, 0),
                    std::vector<int32_t>(micro_bsz * seq_len, kIgnoreIndex)};
  const auto& cu = batch.cu_seqlens;
  for (int64_t j = 0; j < micro_bsz && j + 1 < static_cast<int64_t>(cu.size()); ++j) {
    const int64_t len = std::min<int64_t>(cu[j + 1] - cu[j], seq_len);
    std::copy_n(batch.input_ids.begin() + cu[j], len, out.input_ids.begin() + j * seq_len);
    std::copy_n(batch.labels.begin() + cu[j], len, out.labels.begin() + j * seq_len);
  }
  return out;
}

}  // namespace longtron::data
