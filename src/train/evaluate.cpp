#include "train/evaluate.h"

#include <algorithm>
#include <cmath>

namespace longtron::train {

model::LossSum evaluate_rows(parallel::ParallelEngine& engine, const data::RowSource& rows) {
  const comm::Communicator& dp = *engine.grid().data;
  model::LossSum local;
  data::MicroBatch batch;
  for (int64_t k = dp.rank(); k < rows.num_rows(); k += dp.size()) {
    rows.row_into(k, batch);
    const model::LossSum ls = engine.forward_loss(batch);
    local.sum += ls.sum;
    local.count += ls.count;
  }
  return engine.reduce_loss(local);
}

namespace {

/// Scores the rows of one file and adds each token's loss to its document.
void score_file(parallel::ParallelEngine& engine, const data::DocumentSource& file,
                const data::PackConfig& pack, int64_t first_index, EvalResult& result) {
  std::vector<int64_t> order = data::document_order(file, 0, /*shuffle=*/false, 0);
  if (order.empty()) return;
  const size_t base = result.documents.size();
  for (int64_t d : order)
    result.documents.push_back({first_index + d, 0, 0.0,
                                static_cast<int64_t>(file.document_length(static_cast<size_t>(d)))});
  std::vector<int64_t> starts;  // packed stream position of each ordered document (+ the end)
  std::unique_ptr<data::RowSource> rows;
  if (pack.use_packed_dataset) {
    auto packed = data::build_pack(file, order, pack);
    starts = packed->document_starts();
    rows = std::move(packed);
  } else {
    rows = data::build_unpack(file, order, pack);
  }
  const int64_t P = pack.packed_length();
  data::MicroBatch batch;
  std::vector<double> token_losses;
  const comm::Communicator& dp = *engine.grid().data;
  for (int64_t k = dp.rank(); k < rows->num_rows(); k += dp.size()) {
    rows->row_into(k, batch);
    engine.forward_loss(batch, &token_losses);
    auto add = [&](size_t doc, int64_t j) {
      if (batch.labels[static_cast<size_t>(j)] == data::kIgnoreIndex) return;
      auto& d = result.documents[base + doc];
      d.tokens += 1;
      d.loss_sum += token_losses[static_cast<size_t>(j)];
    };
    if (pack.use_packed_dataset) {
      // Row k holds stream positions [kP, kP + P); the tail past the stream is pad.
      for (int64_t j = 0; j < P; ++j) {
        const int64_t pos = k * P + j;
        if (pos >= starts.back()) break;
        const auto it = std::upper_bound(starts.begin(), starts.end(), pos);
        add(static_cast<size_t>(it - starts.begin() - 1), j);
      }
    } else {
      // Unpacked: segment s of row k is document k·micro_bsz + s (the pad segment follows).
      for (size_t s = 0; s + 1 < batch.cu_seqlens.size(); ++s) {
        const int64_t doc = k * pack.micro_bsz + static_cast<int64_t>(s);
        if (doc >= static_cast<int64_t>(order.size()) || static_cast<int64_t>(s) >= pack.micro_bsz)
          break;
        for (int32_t j = batch.cu_seqlens[s]; j < batch.cu_seqlens[s + 1]; ++j)
          add(static_cast<size_t>(doc), j);
      }
    }
  }
}

}  // namespace

EvalResult evaluate_documents(parallel::ParallelEngine& engine, const data::Dataset& dataset,
                              const data::PackConfig& pack) {
  pack.validate();
  EvalResult result;
  int64_t first_index = 0;
  for (const auto& file : dataset) {
    score_file(engine, *file, pack, first_index, result);
    first_index += static_cast<int64_t>(file->num_documents());
  }
  comm::Communicator& dp = *engine.grid().data;
  if (dp.size() > 1) {  // each dp rank scored its own rows: sum the documents' parts
    std::vector<double> sums(result.documents.size() * 2);
    for (size_t i = 0; i < result.documents.size(); ++i) {
      sums[2 * i] = result.documents[i].loss_sum;
      sums[2 * i + 1] = static_cast<double>(result.documents[i].tokens);
    }
    dp.all_reduce(sums.data(), static_cast<int64_t>(sums.size()));
    for (size_t i = 0; i < result.documents.size(); ++i) {
      result.documents[i].loss_sum = sums[2 * i];
      result.documents[i].tokens = std::llround(sums[2 * i + 1]);
    }
  }
  for (const auto& d : result.documents) {
    result.loss_sum += d.loss_sum;
    result.count += d.tokens;
  }
  return result;
}

}  // namespace longtron::train
