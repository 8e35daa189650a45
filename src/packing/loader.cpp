#include "packing/loader.h"

#include <limits>

#include "core/error.h"

namespace longtron::data {

BatchLoader::BatchLoader(Dataset dataset, const DataConfig& config, int64_t dp_size,
                         ProgressHook* progress)
    : dataset_(std::move(dataset)), config_(config), dp_size_(dp_size) {
  config_.balance.validate();
  check(config_.micro_num > 0, "data.micro_num must be > 0, got {}", config_.micro_num);
  check(dp_size > 0, "data parallel size must be > 0, got {}", dp_size);
  // A window of more rows than 64 bits count is the whole dataset: saturate, never wrap.
  int64_t window_rows = 0;
  if (config_.balance.mode == BalanceMode::kDocuments &&
      (__builtin_mul_overflow(config_.balance.window, config_.micro_num, &window_rows) ||
       __builtin_mul_overflow(window_rows, dp_size, &window_rows)))
    window_rows = std::numeric_limits<int64_t>::max();
  config_.pack.balance_window_rows = window_rows;
  config_.pack.balance_pairs = config_.balance.cost;  // the packer counts pairs as the cost does
  rows_ = std::make_unique<DatasetRows>(dataset_, config_.pack, config_.min_length,
                                        config_.shuffle, config_.seed, progress);
  sampler_ = std::make_unique<StaticBatchSampler>(rows_->num_rows(), config_.micro_num, dp_size,
                                                  config_.shuffle, config_.seed);
}

StepPlan BatchLoader::plan(int64_t step) const {
  // The global batch in canonical order: the sampler's stream order (micro-batch j of rank r is
  // entry j·dp + r), with each row's cost.
  const int64_t M = config_.micro_num;
  std::vector<int64_t> global(M * dp_size_);
  std::vector<double> costs(global.size());
  std::vector<int32_t> cu;
  for (int64_t r = 0; r < dp_size_; ++r) {
    const std::vector<int64_t> sampled = sampler_->rows(r, step);
    for (int64_t j = 0; j < M; ++j) {
      global[j * dp_size_ + r] = sampled[j];
      rows_->segments_into(sampled[j], cu);
      costs[j * dp_size_ + r] = config_.balance.cost.of(cu);
    }
  }
  std::vector<std::vector<int64_t>> slots(dp_size_);
  if (config_.balance.mode == BalanceMode::kNone) {
    for (int64_t r = 0; r < dp_size_; ++r)
      for (int64_t j = 0; j < M; ++j) slots[r].push_back(j * dp_size_ + r);
  } else {
    slots = assign_rows(costs, dp_size_, M);
  }
  StepPlan p;
  p.rows.resize(dp_size_);
  p.cost.assign(dp_size_, 0.0);
  for (int64_t r = 0; r < dp_size_; ++r)
    for (const int64_t i : slots[r]) {
      p.rows[r].push_back(global[i]);
      p.cost[r] += costs[i];
    }
  return p;
}

std::vector<MicroBatch> BatchLoader::micro_batches(const StepPlan& plan, int64_t dp_rank) const {
  check(dp_rank >= 0 && dp_rank < static_cast<int64_t>(plan.rows.size()),
        "data parallel rank {} out of range [0, {})", dp_rank, plan.rows.size());
  std::vector<MicroBatch> out;
  for (const int64_t r : plan.rows[dp_rank]) out.push_back(rows_->row(r));
  return out;
}

std::vector<MicroBatch> BatchLoader::step(int64_t dp_rank, int64_t step) const {
  if (config_.balance.mode == BalanceMode::kNone) {  // no plan needed: the sampler's rows
    std::vector<MicroBatch> out;
    for (const int64_t r : sampler_->rows(dp_rank, step)) out.push_back(rows_->row(r));
    return out;
  }
  return micro_batches(plan(step), dp_rank);
}

}  // namespace longtron::data
