// The trainer's entry point to data: the rows of a dataset (pack.h) + the sampler (sampler.h) →
// the micro-batches of (dp_rank, step), as InternEvo's dataloader + scheduler produce them.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "data/dataset.h"
#include "packing/balance.h"
#include "packing/batch.h"
#include "packing/pack.h"
#include "packing/sampler.h"

namespace longtron::data {

/// `data.*` settings (docs/configuration.md) that decide the batches.
struct DataConfig {
  PackConfig pack;          ///< seq_len, micro_bsz, use_packed_dataset, pack_sample_into_one, pack_tail
  int64_t micro_num = 1;    ///< rows per step per dp rank (gradient accumulation)
  bool shuffle = true;      ///< shuffles documents (per file) and rows
  uint32_t seed = 1024;
  int64_t min_length = 0;
  BalanceConfig balance;    ///< data.balance, balance_window, balance_cost (balance.h)
};

/// Who trains on what in one step: rows[r] = the row ids of dp rank r, in micro-batch order;
/// cost[r] = their summed modelled cost (RowCost).
struct StepPlan {
  std::vector<std::vector<int64_t>> rows;
  std::vector<double> cost;
  /// max over ranks of cost ÷ mean (1.0 = perfect), the metrics' `imbalance`.
  double imbalance() const { return imbalance_of(cost); }
};

/// Owns a dataset and serves micro-batches. Rows are built on demand (nothing is precomputed but
/// prefix sums), so memory stays O(documents). Not thread-safe (row scratch buffers).
class BatchLoader {
 public:
  /// Throws Error for a bad config (seq_len/micro_bsz/micro_num <= 0, a bad balance setting or
  /// "documents" with rows it cannot pack), an empty dataset, or fewer rows than one step needs.
  /// With data.balance = "documents" the rows are packed in windows of balance.window × micro_num
  /// × dp_size rows (balanced_pack.h): they depend on the global batch, not on the rank.
  /// `progress` (may be null) sees the row index being built (DatasetRows).
  BatchLoader(Dataset dataset, const DataConfig& config, int64_t dp_size,
              ProgressHook* progress = nullptr);
  /// The micro_num normalized micro-batches of `dp_rank` at global step `step` (0-based; epochs
  /// follow each other). Every rank of one TP/SP group passes its dp_rank and gets the same whole
  /// rows; the parallel mode takes its rank's part of a row itself (ModeFactory::local_batch).
  std::vector<MicroBatch> step(int64_t dp_rank, int64_t step) const;
  /// The step's global batch (the sampler's micro_num × dp rows, as "none" orders them) and its
  /// assignment to ranks: "none" keeps the sampler's (rank r takes rows r, r+dp, …); "rows" and
  /// "documents" re-assign by assign_rows on the rows' costs. A pure function of `step`, the same
  /// on every rank; costs come from cu_seqlens alone (RowSource::segments_into, no token read).
  StepPlan plan(int64_t step) const;
  /// The micro-batches of `dp_rank` in `plan`.
  std::vector<MicroBatch> micro_batches(const StepPlan& plan, int64_t dp_rank) const;
  int64_t dp_size() const { return dp_size_; }
  int64_t num_rows() const { return rows_->num_rows(); }
  int64_t steps_per_epoch() const { return sampler_->steps_per_epoch(); }
  const RowSource& rows() const { return *rows_; }
  /// Whether the rows hold preference pairs (MicroBatch::pairs; DatasetRows::has_pairs).
  bool has_pairs() const { return rows_->has_pairs(); }
  const StaticBatchSampler& sampler() const { return *sampler_; }
  const DataConfig& config() const { return config_; }

 private:
  Dataset dataset_;
  DataConfig config_;
  int64_t dp_size_;
  std::unique_ptr<DatasetRows> rows_;
  std::unique_ptr<StaticBatchSampler> sampler_;
};

}  // namespace longtron::data
