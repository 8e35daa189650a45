#include "data/loader.h"

namespace longtron::data {

BatchLoader::BatchLoader(Dataset dataset, const DataConfig& config, int64_t dp_size)
    : dataset_(std::move(dataset)), config_(config) {
  rows_ = std::make_unique<DatasetRows>(dataset_, config_.pack, config_.min_length,
                                        config_.shuffle, config_.seed);
  sampler_ = std::make_unique<StaticBatchSampler>(rows_->num_rows(), config_.micro_num, dp_size,
                                                  config_.shuffle, config_.seed);
}

std::vector<MicroBatch> BatchLoader::step(int64_t dp_rank, int64_t step) const {
  std::vector<MicroBatch> out;
  for (const int64_t r : sampler_->rows(dp_rank, step)) out.push_back(rows_->row(r));
  return out;
}

}  // namespace longtron::data
