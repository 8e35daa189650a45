// Learning-rate schedule and global gradient-norm clipping (docs/training.md).
#pragma once
#include <cstddef>
#include <cstdint>

namespace longtron::train {

/// Linear warmup then cosine decay (docs/training.md). Steps are 1-based: step s is the s-th optimizer
/// update. With W = warmup_steps, T = total_steps:
///   s ≤ W:  lr(s) = lr · s / W                 (lr/W at step 1, lr at step W)
///   s > W:  p = min(1, (s − W) / (T − W)),  lr(s) = min_lr + (lr − min_lr) · (1 + cos(π p)) / 2
/// so lr(W) = lr, lr(T) = min_lr; steps past T stay at min_lr. This is the usual
/// warmup + cosine-annealing-to-eta_min (InternEvo's / Megatron's cosine style, 1-based).
struct LrSchedule {
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  /// Learning rate of step s ≥ 1 (s ≤ 0 is treated as step 1).
  double at(int64_t step) const;
};

/// Result of global gradient-norm clipping.
struct ClipResult {
  double grad_norm = 0;  ///< sqrt(squared_norm_sum), before clipping (what metrics report)
  double scale = 1;      ///< factor to multiply every gradient by (1 = unchanged)
  bool finite = true;    ///< false when the norm is inf/NaN; scale is then 1 and the caller
                         ///< decides (e.g. skip the step)
};

/// PyTorch clip_grad_norm_ / InternEvo: scale = min(1, max_norm / (grad_norm + 1e-6)).
/// `squared_norm_sum` is Σ g² over every parameter counted once (whatever its sharding),
/// already all-reduced by the caller. max_norm ≤ 0 disables clipping.
ClipResult clip_grad_norm(double squared_norm_sum, double max_norm);

}  // namespace longtron::train
