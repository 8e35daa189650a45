// Held-out loss (the valid_loss of docs/training.md and `longtron eval`): forward only, token-weighted.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "data/dataset.h"
#include "model/decoder.h"
#include "modes/engine.h"
#include "packing/pack.h"

namespace longtron::train {

/// Σ token losses and valid labels over every row of `rows` through the engine (any layout): with
/// a data-parallel group of size D, dp rank r scores rows r, r+D, … and the sums are reduced over
/// it, so every rank returns the same total. valid_loss = sum / count (token-weighted).
/// Collective over the engine's grid.
model::LossSum evaluate_rows(parallel::ParallelEngine& engine, const data::RowSource& rows);

/// Loss of one document as scored by `longtron eval`.
struct DocumentLoss {
  int64_t index = 0;   ///< document index in the dataset (files in order, documents in file order)
  int64_t tokens = 0;  ///< tokens scored (labels ≠ -100 that belong to the document)
  double loss_sum = 0;
  int64_t length = 0;  ///< tokens the dataset stores for the document
  /// Mean loss per scored token (NaN when none was scored).
  double loss() const { return tokens > 0 ? loss_sum / static_cast<double>(tokens) : std::nan(""); }
};

struct EvalResult {
  std::vector<DocumentLoss> documents;  ///< documents of length 0 are left out
  double loss_sum = 0;
  int64_t count = 0;
  double loss() const { return count > 0 ? loss_sum / static_cast<double>(count) : 0.0; }
};

/// Per-document losses of a dataset packed as in training: each file's documents in
/// stored order (no shuffle) through build_pack (or build_unpack when !use_packed_dataset), so a
/// document longer than seq_len or cut by a row edge is scored in segments, exactly as training
/// sees it. Tokens of a document are attributed through the prefix sums of document lengths.
/// Through the engine, so any layout scores the same documents (the engine returns full-row token
/// losses in every mode); dp rank r scores rows r, r+D, … of each file and the documents' sums are
/// reduced over the data-parallel group: every rank returns the same result. Collective.
EvalResult evaluate_documents(parallel::ParallelEngine& engine, const data::Dataset& dataset,
                              const data::PackConfig& pack);

}  // namespace longtron::train
