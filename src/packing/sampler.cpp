#include "packing/sampler.h"

#include <numeric>

#include "core/error.h"
#include "core/json_read.h"
#include "packing/shuffle.h"

namespace longtron::data {

void to_json(nlohmann::json& j, const SamplerState& s) {
  j = nlohmann::json{{"epoch", s.epoch}, {"position", s.position}};
}

void from_json(const nlohmann::json& j, SamplerState& s) {
  check(j.is_object() && j.contains("epoch") && j.contains("position") &&
            j["epoch"].is_number_integer() && j["position"].is_number_integer(),
        "sampler state: expected {{\"epoch\": int, \"position\": int}}, got {}", json_excerpt(j));
  s.epoch = j["epoch"].get<int64_t>();
  s.position = j["position"].get<int64_t>();
  check(s.epoch >= 0 && s.position >= 0, "sampler state: negative epoch/position in {}", json_excerpt(j));
}

StaticBatchSampler::StaticBatchSampler(int64_t num_rows, int64_t micro_num, int64_t dp_size,
                                       bool shuffle, uint32_t seed)
    : num_rows_(num_rows), micro_num_(micro_num), dp_size_(dp_size), shuffle_(shuffle),
      seed_(seed) {
  check(micro_num > 0, "data.micro_num must be > 0, got {}", micro_num);
  check(dp_size > 0, "data parallel size must be > 0, got {}", dp_size);
  // num_rows / dp_size >= micro_num is num_rows >= micro_num × dp_size without its overflow.
  check(num_rows / dp_size >= micro_num,
        "the dataset has {} rows, fewer than one step needs (data.micro_num x data parallel size "
        "= {} x {})",
        num_rows, micro_num, dp_size);
  steps_per_epoch_ = num_rows / (micro_num * dp_size);
}

const std::vector<int64_t>& StaticBatchSampler::epoch_order(int64_t epoch) const {
  if (epoch != cached_epoch_) {
    if (shuffle_) {
      cached_order_ = numpy_permutation(num_rows_, seed_ + static_cast<uint32_t>(epoch));
    } else {
      cached_order_.resize(num_rows_);
      std::iota(cached_order_.begin(), cached_order_.end(), 0);
    }
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

SamplerState StaticBatchSampler::state_at(int64_t step) const {
  check(step >= 0, "sampler: step must be >= 0, got {}", step);
  return {step / steps_per_epoch_, step % steps_per_epoch_};
}

std::vector<int64_t> StaticBatchSampler::rows(int64_t dp_rank, int64_t step) const {
  check(dp_rank >= 0 && dp_rank < dp_size_, "data parallel rank {} out of range [0, {})", dp_rank,
        dp_size_);
  const SamplerState at = state_at(step);
  const auto& order = epoch_order(at.epoch);
  std::vector<int64_t> out(micro_num_);
  for (int64_t j = 0; j < micro_num_; ++j)
    out[j] = order[(at.position * micro_num_ + j) * dp_size_ + dp_rank];
  return out;
}

std::vector<int64_t> StaticBatchSampler::next(int64_t dp_rank) {
  auto out = rows(dp_rank, state_.epoch * steps_per_epoch_ + state_.position);
  if (++state_.position == steps_per_epoch_) state_ = {state_.epoch + 1, 0};
  return out;
}

void StaticBatchSampler::restore(const SamplerState& state) {
  check(state.epoch >= 0 && state.position >= 0 && state.position < steps_per_epoch_,
        "sampler state (epoch {}, position {}) does not fit this dataset ({} steps per epoch)",
        state.epoch, state.position, steps_per_epoch_);
  state_ = state;
}

SequenceParallelSampler::SequenceParallelSampler(int64_t num_samples, int64_t world_size,
                                                 int64_t sp_size, int64_t rank, bool shuffle,
                                                 uint32_t seed, bool round_up)
    : num_samples_(num_samples), shuffle_(shuffle), round_up_(round_up), seed_(seed) {
  check(num_samples > 0, "sequence parallel sampler: the dataset is empty");
  check(sp_size > 0 && world_size > 0 && world_size % sp_size == 0,
        "world size {} must be a multiple of the sequence parallel size {}", world_size, sp_size);
  check(rank >= 0 && rank < world_size, "rank {} out of range [0, {})", rank, world_size);
  dp_size_ = world_size / sp_size;
  dp_rank_ = rank / sp_size;  // SP groups are contiguous rank blocks
}

std::vector<int64_t> SequenceParallelSampler::indices(int64_t epoch) const {
  std::vector<int64_t> all;
  if (shuffle_) {
    all = numpy_permutation(num_samples_, seed_ + static_cast<uint32_t>(epoch));
  } else {
    all.resize(num_samples_);
    std::iota(all.begin(), all.end(), 0);
  }
  const int64_t per_rank =
      round_up_ ? (num_samples_ + dp_size_ - 1) / dp_size_ : num_samples_ / dp_size_;
  std::vector<int64_t> out;
  out.reserve(per_rank);
  for (int64_t i = dp_rank_; i < per_rank * dp_size_; i += dp_size_)
    out.push_back(all[i % num_samples_]);  // round_up repeats the list from its start
  return out;
}

}  // namespace longtron::data
