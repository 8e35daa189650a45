#include "packing/sequence_split.h"

#include <algorithm>

#include "core/error.h"

namespace longtron::data {

void check_sequence_parallel(int64_t sp_size, int64_t sp_rank) {
  check(sp_size >= 1, "sequence parallel size must be >= 1, got {}", sp_size);
  check(sp_rank >= 0 && sp_rank < sp_size,
        "sequence parallel rank {} out of range: it must be in [0, {}) for size {}", sp_rank,
        sp_size, sp_size);
}

namespace {
void check_divides(int64_t n, int64_t sp_size, const char* what) {
  check(n % sp_size == 0,
        "sequence parallel size {} does not divide the {} length {}: pad the row first with "
        "pad_for_sequence_parallel (or choose micro_bsz x seq_len divisible by it)",
        sp_size, what, n);
}
}  // namespace

std::vector<int32_t> split_for_sequence_parallel(const std::vector<int32_t>& values,
                                                 int64_t sp_size, int64_t sp_rank) {
  check_sequence_parallel(sp_size, sp_rank);
  const auto n = static_cast<int64_t>(values.size());
  check_divides(n, sp_size, "sequence");
  const int64_t chunk = n / sp_size;
  return {values.begin() + sp_rank * chunk, values.begin() + (sp_rank + 1) * chunk};
}

MicroBatch split_for_sequence_parallel(const MicroBatch& row, int64_t sp_size, int64_t sp_rank) {
  check_sequence_parallel(sp_size, sp_rank);
  check_divides(static_cast<int64_t>(row.input_ids.size()), sp_size, "packed row");
  MicroBatch out;
  out.input_ids = split_for_sequence_parallel(row.input_ids, sp_size, sp_rank);
  out.labels = split_for_sequence_parallel(row.labels, sp_size, sp_rank);
  out.indexes = split_for_sequence_parallel(row.indexes, sp_size, sp_rank);
  out.cu_seqlens = row.cu_seqlens;
  out.max_seqlen = row.max_seqlen;
  return out;
}

UnpackedBatch split_for_sequence_parallel(const UnpackedBatch& batch, int64_t sp_size,
                                          int64_t sp_rank) {
  check_sequence_parallel(sp_size, sp_rank);
  check_divides(batch.seq_len, sp_size, "seq_len");
  const int64_t chunk = batch.seq_len / sp_size;
  UnpackedBatch out{batch.micro_bsz, chunk, {}, {}};
  for (int64_t j = 0; j < batch.micro_bsz; ++j) {
    const int64_t from = j * batch.seq_len + sp_rank * chunk;
    out.input_ids.insert(out.input_ids.end(), batch.input_ids.begin() + from,
                         batch.input_ids.begin() + from + chunk);
    out.labels.insert(out.labels.end(), batch.labels.begin() + from,
                      batch.labels.begin() + from + chunk);
  }
  return out;
}

void pad_for_sequence_parallel(std::vector<int32_t>& values, int32_t padding_value,
                               int64_t sp_size) {
  check_sequence_parallel(sp_size, 0);
  const auto n = static_cast<int64_t>(values.size());
  values.resize((n + sp_size - 1) / sp_size * sp_size, padding_value);
}

void pad_for_sequence_parallel(MicroBatch& row, int64_t sp_size) {
  check_sequence_parallel(sp_size, 0);
  const auto n = static_cast<int64_t>(row.input_ids.size());
  const int64_t padded = (n + sp_size - 1) / sp_size * sp_size;
  if (padded == n) return;
  pad_for_sequence_parallel(row.input_ids, 0, sp_size);
  pad_for_sequence_parallel(row.labels, kIgnoreIndex, sp_size);
  pad_for_sequence_parallel(row.indexes, 0, sp_size);
  row.cu_seqlens.push_back(static_cast<int32_t>(padded));
  row.max_seqlen = std::max<int32_t>(row.max_seqlen, static_cast<int32_t>(padded - n));
}

double reduce_sequence_parallel_loss(std::span<const double> mean_loss,
                                     std::span<const int64_t> num_tokens) {
  check(mean_loss.size() == num_tokens.size(),
        "reduce_sequence_parallel_loss: {} losses but {} token counts", mean_loss.size(),
        num_tokens.size());
  double sum = 0.0;
  int64_t count = 0;
  for (size_t r = 0; r < mean_loss.size(); ++r) {
    check(num_tokens[r] >= 0, "reduce_sequence_parallel_loss: rank {} has {} tokens", r,
          num_tokens[r]);
    if (num_tokens[r] == 0) continue;
    sum += mean_loss[r] * static_cast<double>(num_tokens[r]);
    count += num_tokens[r];
  }
  return count == 0 ? 0.0 : sum / static_cast<double>(count);
}

}  // namespace longtron::data
