// AdamW over the flat parameter buffer (SPEC §4.1, §4.2): weight decay on matrices only (not norms
// or biases), global gradient-norm clipping, and an optional ZeRO-1 shard (each rank of the zero1
// group updates one contiguous slice of the flat buffer and the slices are all-gathered after).
#pragma once
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "model/params.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace longtron::train {

/// PyTorch AdamW (Loshchilov & Hutter 2019) with decoupled weight decay, moments in float, over
/// the flat buffer of a ParamLayout. Decay is applied to views with is_matrix (all 2-D weights,
/// the embedding included, as InternEvo's default param groups do) and not to norms or biases.
/// With a zero1 communicator of size Z > 1 the buffer is split into Z contiguous slices of
/// ceil(n/Z) elements; this rank keeps moments for, and updates, only its slice, then the slices
/// are all-gathered into every rank's parameters (ZeRO stage 1, Rajbhandari et al. 2020).
class AdamW {
 public:
  /// `zero1` may be nullptr (no sharding). Throws Error for a non-positive lr.
  AdamW(const model::ParamLayout& layout, const OptimizerConfig& config, comm::CommPtr zero1 = nullptr);

  /// One update of `params` with `grads` (already reduced over data parallel and clipped) at
  /// learning rate `lr`. Increments step().
  void update(model::Params<float>& params, const model::Params<float>& grads, double lr);

  /// Number of updates taken (AdamW's bias-correction step).
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  /// Full moment buffers (every rank holds full-size buffers; with ZeRO-1 only the own slice is
  /// meaningful until gather_state()).
  model::Params<float>& exp_avg() { return m_; }
  model::Params<float>& exp_avg_sq() { return v_; }
  /// All-gathers the moments so every rank holds full tensors (before a checkpoint). No-op without
  /// ZeRO-1.
  void gather_state();

  /// Tensor lists for checkpoint.h (HF names, full shapes) over the moment buffers.
  std::vector<NamedTensor> named_exp_avg() const;
  std::vector<NamedTensor> named_exp_avg_sq() const;
  std::vector<MutableTensor> mutable_exp_avg();
  std::vector<MutableTensor> mutable_exp_avg_sq();

  /// [begin, end) of this rank's slice of the flat buffer.
  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }

 private:
  const model::ParamLayout& layout_;
  OptimizerConfig config_;
  comm::CommPtr zero1_;
  model::Params<float> m_, v_;
  int64_t step_ = 0;
  int64_t begin_ = 0, end_ = 0, chunk_ = 0;
};

/// Tensor lists of a parameter-shaped buffer (HF names and shapes), for checkpoints and dumps.
std::vector<NamedTensor> named_tensors(const model::Params<float>& buffer, const std::string& prefix = "");
std::vector<MutableTensor> mutable_tensors(model::Params<float>& buffer, const std::string& prefix = "");

}  // namespace longtron::train
