#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace longtron::train {

double LrSchedule::at(int64_t step) const {
  const int64_t s = std::max<int64_t>(step, 1);
  if (warmup_steps > 0 && s <= warmup_steps) return lr * double(s) / double(warmup_steps);
  const int64_t span = total_steps - warmup_steps;
  const double p = span <= 0 ? 1.0 : std::min(1.0, double(s - warmup_steps) / double(span));
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

ClipResult clip_grad_norm(double squared_norm_sum, double max_norm) {
  ClipResult r;
  r.grad_norm = std::sqrt(squared_norm_sum);
  r.finite = std::isfinite(r.grad_norm);
  if (r.finite && max_norm > 0) r.scale = std::min(1.0, max_norm / (r.grad_norm + 1e-6));
  return r;
}

}  // namespace longtron::train
