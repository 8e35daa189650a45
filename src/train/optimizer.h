// AdamW over the flat parameter buffer (docs/training.md): weight decay on matrices only (not norms
// or biases) and an optional ZeRO-1 shard (each rank of the zero1 group holds the moments of, and
// updates, one contiguous slice of the flat buffer; the slices are all-gathered after). It does not
// clip: train_step (step.h) clips the gradients by their global norm before update().
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "core/zeroed_buffer.h"
#include "model/params.h"
#include "ops/adamw.h"
#include "ops/compute_context.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace longtron::train {

/// PyTorch AdamW (Loshchilov & Hutter 2019) with decoupled weight decay, moments in float, over
/// the flat buffer of a ParamTable. Decay is applied to views with is_matrix (all 2-D weights,
/// the embedding included, as InternEvo's default param groups do) and not to norms or biases.
/// With a zero1 communicator of size Z > 1 the buffer is split into Z contiguous slices of
/// ceil(n/Z) elements (the last ones shorter or empty); this rank ALLOCATES moments only for its
/// slice, updates only that slice, and the slices are then all-gathered in place into every
/// rank's parameters (ZeRO stage 1, Rajbhandari et al. 2020): the optimizer state per rank is
/// 2·ceil(n/Z) floats instead of 2·n, and an update allocates nothing.
class AdamW {
 public:
  /// `zero1` may be nullptr (no sharding). Throws Error for a non-positive lr.
  AdamW(const model::ParamTable& layout, const OptimizerConfig& config, comm::CommPtr zero1 = nullptr);

  /// One update of `params` with `grads` (already reduced over data parallel), each read as
  /// grad · float(grad_scale) (the global-norm clip's factor), at learning rate `lr`; only this
  /// rank's slice of `grads` is read, so a gradient reduced to the slices
  /// (ParallelEngine::finish_gradient_slices) is enough. Increments step(). With ZeRO-1,
  /// collective over the zero1 group. `copy` is the bf16 weight copy of the compute context the
  /// weights are read in (ParallelEngine::compute().weights()): when it mirrors `params`, the
  /// update writes each new weight's bf16 rounding into it in the same pass (the slices other
  /// ranks updated are rounded after the all-gather), so the copy is fresh after the update and
  /// the next step reads the weights once instead of twice; any other buffer (LoRA's adapters)
  /// leaves it as it is. Results are bitwise those of rounding the updated weights afterwards.
  void update(model::Params<float>& params, const model::Params<float>& grads, double lr,
              ops::Bf16WeightCopy& copy, double grad_scale = 1.0);

  /// Whether update(params, grads, lr, copy, grad_scale) would leave this rank's slice of the
  /// parameters and its moments finite. Changes nothing and communicates nothing: the caller
  /// agrees the verdict over every rank that holds a slice (train_step does, over the world).
  /// `grad_max_abs` bounds |g| of every gradient as the update reads it (the clipped global L2
  /// norm does): with it, what the last update wrote (ops::AdamWStats) usually proves the verdict
  /// without reading the buffers; otherwise (the first update, after load_state, an unproven
  /// bound) the update's arithmetic is run on every element. The bound assumes the parameters
  /// were written only by update() since the last update (a caller that writes them otherwise
  /// passes no grad_max_abs).
  bool update_is_finite(const model::Params<float>& params, const model::Params<float>& grads,
                        double lr,
                        double grad_max_abs = std::numeric_limits<double>::infinity(),
                        double grad_scale = 1.0) const;

  /// Number of updates taken (AdamW's bias-correction step).
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  /// Floats of optimizer state this rank holds: exp_avg + exp_avg_sq over its slice
  /// (2·(shard_end() − shard_begin()); 2·layout.numel() without ZeRO-1).
  int64_t state_numel() const { return static_cast<int64_t>(m_.size() + v_.size()); }

  /// Full moments over the layout this optimizer was built on (for a checkpoint): every rank of
  /// the zero1 group receives the whole `exp_avg` and `exp_avg_sq` (all_gather_v of the slices).
  /// Buffers must be over that layout. Collective over the zero1 group (no-op communication
  /// without ZeRO-1). The engine's gather_full() then assembles HF tensors under tensor sharding.
  void gather_state(model::Params<float>& exp_avg, model::Params<float>& exp_avg_sq) const;
  /// Loads this rank's slice of full moments over the layout (resume from a checkpoint saved in
  /// any layout: the engine's scatter_full() first cuts the HF tensors to the local layout). No
  /// communication.
  void load_state(const model::Params<float>& exp_avg, const model::Params<float>& exp_avg_sq);

  /// [begin, end) of this rank's slice of the flat buffer.
  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }
  /// Elements per zero1 rank (the uneven split, in zero1-rank order), for all_gather_v and the
  /// gradient reduce_scatter_v. Requires a zero1 communicator.
  std::vector<int64_t> shard_counts() const;
  /// The zero1 communicator (nullptr without ZeRO-1).
  const comm::CommPtr& zero1() const { return zero1_; }

 private:

  const model::ParamTable& layout_;
  OptimizerConfig config_;
  /// The update's arguments at learning rate lr and 1-based step, gradients read · grad_scale.
  ops::AdamWArgs args(double lr, int64_t step, double grad_scale) const;

  comm::CommPtr zero1_;
  std::vector<ops::AdamWRange> ranges_;  // the views within the slice, from begin_
  int64_t covered_ = 0;                  // elements of the slice the views cover
  std::optional<ops::AdamWStats> last_;  // what the last update wrote (none yet, or loaded since)
  ZeroedBuffer<float> m_, v_;  // moments of [begin_, end_) only (zero, unwritten until used)
  int64_t step_ = 0;
  int64_t begin_ = 0, end_ = 0, chunk_ = 0;
};

/// Tensor lists of a parameter-shaped buffer (HF names and shapes), for checkpoints and dumps.
std::vector<NamedTensor> named_tensors(const model::Params<float>& buffer, const std::string& prefix = "");
std::vector<MutableTensor> mutable_tensors(model::Params<float>& buffer, const std::string& prefix = "");

}  // namespace longtron::train
