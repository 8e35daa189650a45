// Which rows a data-parallel rank trains on at each step (docs/data.md): InternEvo's
// StaticBatchSampler, and XTuner's SequenceParallelSampler (xtuner/parallel/sequence/sampler.py).
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace longtron::data {

/// Sampler position, saved with checkpoints: `epoch` and the next step inside it.
struct SamplerState {
  int64_t epoch = 0;
  int64_t position = 0;  ///< steps already taken in `epoch`
  friend bool operator==(const SamplerState&, const SamplerState&) = default;
};
void to_json(nlohmann::json& j, const SamplerState& s);
/// Throws Error if "epoch"/"position" are missing or negative.
void from_json(const nlohmann::json& j, SamplerState& s);

/// InternEvo StaticBatchSampler (internlm/data/batch_sampler.py): the row ids [0, num_rows) permuted by
/// numpy_permutation(num_rows, seed + epoch) (or in order without shuffle), truncated to a multiple
/// of micro_num × dp_size; dp rank r takes rows r, r+dp, r+2dp, … and each step uses micro_num of
/// them. Ranks of one TP/SP group pass the same dp_rank and so get identical rows.
/// Epochs: epoch 0 uses `seed` exactly as InternEvo; epoch e reshuffles with seed + e (InternEvo's
/// generator would continue its state instead; seed + e keeps resume O(1) and deterministic).
class StaticBatchSampler {
 public:
  /// Throws Error if micro_num or dp_size <= 0, or num_rows < micro_num × dp_size (no full step).
  StaticBatchSampler(int64_t num_rows, int64_t micro_num, int64_t dp_size, bool shuffle,
                     uint32_t seed);
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  /// Row ids [micro_num] of `dp_rank` at step `step` (0-based, counted over all epochs).
  std::vector<int64_t> rows(int64_t dp_rank, int64_t step) const;
  /// The rows of the current state's step, then advances the state by one step.
  std::vector<int64_t> next(int64_t dp_rank);
  SamplerState state() const { return state_; }
  /// Resumes at `state` (Error if position >= steps_per_epoch or negative).
  void restore(const SamplerState& state);
  /// The state just before global step `step`.
  SamplerState state_at(int64_t step) const;

 private:
  const std::vector<int64_t>& epoch_order(int64_t epoch) const;
  int64_t num_rows_, micro_num_, dp_size_;
  bool shuffle_;
  uint32_t seed_;
  int64_t steps_per_epoch_;
  SamplerState state_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

/// XTuner SequenceParallelSampler (mmengine DefaultSampler with the DP group's rank/size): ranks of
/// one SP group (contiguous blocks [i·sp, (i+1)·sp) of the world) draw identical indices; data is
/// sharded over dp_size = world/sp only. With round_up the index list is repeated to
/// ceil(n/dp)·dp entries, else truncated to floor(n/dp)·dp; dp rank takes indices[rank::dp].
/// Shuffle uses numpy_permutation(n, seed + epoch) (mmengine seeds with seed + epoch too; its
/// torch generator is not reproduced).
class SequenceParallelSampler {
 public:
  /// Throws Error if world_size % sp_size != 0, rank out of range or num_samples <= 0.
  SequenceParallelSampler(int64_t num_samples, int64_t world_size, int64_t sp_size, int64_t rank,
                          bool shuffle, uint32_t seed, bool round_up = true);
  int64_t dp_rank() const { return dp_rank_; }
  int64_t dp_size() const { return dp_size_; }
  /// The sample ids this rank visits in `epoch`, in order.
  std::vector<int64_t> indices(int64_t epoch) const;

 private:
  int64_t num_samples_, dp_size_, dp_rank_;
  bool shuffle_, round_up_;
  uint32_t seed_;
};

}  // namespace longtron::data
