// One optimizer step of the engine (see step.h).
#include "train/step.h"

#include <cmath>

#include "core/error.h"
#include "train/preference.h"
#include "train/schedule.h"

namespace longtron::train {

double combine_step_loss(const std::vector<model::LossSum>& micro, LossReduction reduction) {
  double sum = 0;
  int64_t count = 0;
  for (const auto& m : micro) {
    if (reduction == LossReduction::kMicroMean) {
      if (m.count > 0) sum += m.sum / static_cast<double>(m.count);
    } else {
      sum += m.sum;
      count += m.count;
    }
  }
  if (reduction == LossReduction::kMicroMean) return micro.empty() ? 0.0 : sum / static_cast<double>(micro.size());
  return count > 0 ? sum / static_cast<double>(count) : 0.0;
}

double micro_loss_scale(LossReduction reduction, int64_t count, int64_t step_count,
                        int64_t micro_num, int64_t dp_size) {
  if (reduction == LossReduction::kMicroMean) {
    const double d = static_cast<double>(micro_num) * static_cast<double>(dp_size) *
                     static_cast<double>(count);
    return d > 0 ? 1.0 / d : 0.0;
  }
  return step_count > 0 ? 1.0 / static_cast<double>(step_count) : 0.0;
}

int64_t count_labels(const data::MicroBatch& row) {
  int64_t n = 0;
  for (int32_t l : row.labels) n += l != data::kIgnoreIndex;
  return n;
}

int64_t count_tokens(const data::MicroBatch& row) {
  auto n = static_cast<int64_t>(row.input_ids.size());
  while (n > 0 && row.input_ids[static_cast<size_t>(n - 1)] == 0 &&
         row.labels[static_cast<size_t>(n - 1)] == data::kIgnoreIndex)
    --n;
  return n;
}

// step_gradients; with `slices` the data-parallel reduction is ZeRO-1's reduce-scatter into the
// optimizer's slices (ParallelEngine::finish_gradient_slices) instead of the all-reduce.
static StepResult gradients(parallel::ParallelEngine& engine, const std::vector<data::MicroBatch>& rows,
                            const StepOptions& options, const std::vector<int64_t>* slices) {
  comm::Communicator& dp = *engine.grid().data;
  const bool micro_mean = options.loss_reduction == LossReduction::kMicroMean;
  const int64_t micro_num = options.micro_num > 0 ? options.micro_num : int64_t(rows.size());
  // Count the step's labels BEFORE the forward so each loss scale gives gradients of the mean.
  int64_t counts[2] = {0, 0};  // labels, non-pad tokens
  double sum_l2 = 0;
  for (const auto& b : rows) {
    counts[0] += count_labels(b);
    counts[1] += count_tokens(b);
    // windows: only the visible pairs (the MFU numerator)
    sum_l2 += model::sum_squared_segments(engine.full_layout().config(), b.cu_seqlens);
  }
  if (dp.size() > 1) {
    dp.all_reduce(counts, 2);
    dp.all_reduce(&sum_l2, 1);
  }
  engine.zero_grads();
  engine.set_gradient_slices(slices ? *slices : std::vector<int64_t>{});
  double loss_part = 0;  // token: Σ loss_sum; micro_mean: Σ micro-batch means
  if (options.preference) {
    check(!micro_mean, "train.loss_reduction = \"micro_mean\" does not apply to preference "
          "training (its step loss is the mean over the step's pairs)");
    preference_gradients(engine, rows, *options.preference);
  }
  for (size_t i = 0; i < rows.size() && !options.preference; ++i) {
    const data::MicroBatch& b = rows[i];
    const double scale = micro_loss_scale(options.loss_reduction, count_labels(b), counts[0],
                                          micro_num, dp.size());
    // The last micro-batch's backward may start the data-parallel reduction bucket by bucket
    // (ParallelEngine::overlaps_gradient_reduction): the all-reduce, or ZeRO-1's reduce-scatter.
    const bool last = i + 1 == rows.size();
    const model::LossSum ls = engine.forward_backward(b, scale, last);
    if (micro_mean)
      loss_part += ls.count > 0 ? ls.sum / static_cast<double>(ls.count) : 0.0;
    else
      loss_part += ls.sum;
  }
  if (slices)
    engine.finish_gradient_slices(*slices);  // the layout's SUMs, then reduce-scatter over dp
  else
    engine.finish_gradients();  // the layout's SUMs, then over data parallel
  if (dp.size() > 1) dp.all_reduce(&loss_part, 1);
  StepResult r;
  r.loss = options.preference ? options.preference->stats.step_loss()
         : micro_mean ? loss_part / static_cast<double>(micro_num * dp.size())
                      : (counts[0] > 0 ? loss_part / static_cast<double>(counts[0]) : 0.0);
  r.labels = counts[0];
  r.tokens = counts[1];
  r.sum_l2 = sum_l2;
  return r;
}

StepResult step_gradients(parallel::ParallelEngine& engine, const std::vector<data::MicroBatch>& rows,
                          const StepOptions& options) {
  return gradients(engine, rows, options, nullptr);
}

StepResult train_step(parallel::ParallelEngine& engine, AdamW& optimizer,
                      const std::vector<data::MicroBatch>& rows, const StepOptions& options) {
  // ZeRO-1 over the grid's zero1 group: each rank receives the reduced gradient of its optimizer
  // slice only (a reduce-scatter, not an all-reduce); the norm is taken over the slices.
  const bool sliced = optimizer.zero1() && optimizer.zero1() == engine.grid().zero1 &&
                      engine.shards_gradients();
  const std::vector<int64_t> slices = sliced ? optimizer.shard_counts() : std::vector<int64_t>{};
  engine.set_lora_step(optimizer.step() + 1);  // LoRA dropout's mask (no-op without LoRA)
  StepResult r = gradients(engine, rows, options, sliced ? &slices : nullptr);
  if (options.on_gradients) {
    // The hook (--dump-grads) sees the full reduced gradient, as without slices.
    if (sliced) engine.gather_gradient_slices(slices);
    options.on_gradients(engine);
  }
  const double norm = sliced ? engine.grad_norm_of_slices(slices) : engine.grad_norm();
  const ClipResult clip = clip_grad_norm(std::pow(norm, 2), options.clip_grad_norm);
  r.grad_norm = clip.grad_norm;
  // Every rank must agree (a loss seen by some ranks only would split the run).
  int64_t bad = !clip.finite || !std::isfinite(r.loss);
  const parallel::Grid& grid = engine.grid();
  if (grid.world_size > 1) grid.world->all_reduce(&bad, 1, comm::ReduceOp::kMax);
  r.skipped = bad != 0;
  // The clip's factor is applied as AdamW reads each gradient (no pass of its own); the gradient
  // buffer keeps the unclipped values.
  if (!r.skipped) {
    const model::Params<float>& grads = engine.train_grads();
    // An update that would make a parameter or moment non-finite (too high a learning rate, a
    // gradient whose square overflows) is not applied either. Each rank checks its own slice
    // (its tensor shards, its ZeRO-1 slice); the verdict is agreed by all ranks.
    // The clipped norm bounds every clipped gradient: the check reads no buffer when it can.
    int64_t nonfinite = !optimizer.update_is_finite(engine.train_params(), grads, options.lr,
                                                    clip.grad_norm * clip.scale, clip.scale);
    if (grid.world_size > 1) grid.world->all_reduce(&nonfinite, 1, comm::ReduceOp::kMax);
    r.update_nonfinite = nonfinite != 0;
    r.skipped = r.update_nonfinite;
  }
  if (!r.skipped)
    optimizer.update(engine.train_params(), engine.train_grads(), options.lr,
                     engine.compute().weights(), clip.scale);
  return r;
}

}  // namespace longtron::train
