// One optimizer step of the engine, the one every caller runs: the trainer, the parity tests and
// the benchmarks (docs/training.md, "One step").
//
//   counts (labels, tokens, Σ l²) over the data-parallel group
//   zero grads → forward/backward of each micro-batch with its loss scale → finish_gradients
//   loss over the data-parallel group → on_gradients hook → grad norm → clip → AdamW
//
// The loss is carried as (sum, count) until the end of the step; gradients are those of the
// reduced step loss, so every layout takes the same update as one process.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "modes/engine.h"
#include "packing/batch.h"
#include "train/loss_reduction.h"
#include "train/optimizer.h"

namespace longtron::train {

struct PreferenceStep;  // train/preference.h

/// How the step loss combines micro-batches (docs/training.md, train.loss_reduction):
/// kToken: Σ loss_sum / Σ count over the step (all dp ranks);
/// kMicroMean: InternEvo's mean over micro-batches (and dp ranks) of each micro-batch's mean.
/// `micro` lists every micro-batch of the step (over all ranks). Micro-batches with count 0 add 0.
double combine_step_loss(const std::vector<model::LossSum>& micro, LossReduction reduction);

/// loss_scale passed to forward_backward for a micro-batch with `count` valid labels, so that the
/// accumulated (and dp-summed) gradients are those of combine_step_loss: 1/step_count (kToken),
/// or 1/(micro_num · dp_size · count) (kMicroMean); 0 when the denominator is 0.
double micro_loss_scale(LossReduction reduction, int64_t count, int64_t step_count,
                        int64_t micro_num, int64_t dp_size);

/// What a step does besides the data (train.loss_reduction, optimizer.*).
struct StepOptions {
  LossReduction loss_reduction = LossReduction::kToken;  ///< combine_step_loss
  int64_t micro_num = 0;                 ///< micro-batches per dp rank (micro_mean); 0: rows.size()
  double lr = 0;                         ///< learning rate of this update
  double clip_grad_norm = 0;             ///< max global norm (clip_grad_norm); ≤ 0: no clipping
  /// Called on every rank after the gradients are finished (reduced, not yet clipped), before
  /// the norm: e.g. --dump-grads. May be collective (every rank calls it at the same point).
  std::function<void(parallel::ParallelEngine&)> on_gradients;
  /// Preference training (train/preference.h; nullptr: the token-weighted cross-entropy): the
  /// step's gradients and loss are those of its pairs' loss (preference_gradients), and its
  /// stats are filled. Needs loss_reduction kToken (the step loss is a mean over pairs).
  PreferenceStep* preference = nullptr;
};

/// What a step measured (the same on every rank).
struct StepResult {
  double loss = 0;        ///< the step loss (loss_reduction), over the data-parallel group
  double grad_norm = 0;   ///< global gradient norm before clipping
  int64_t labels = 0;     ///< labels that take loss (≠ ignore index), all dp ranks
  int64_t tokens = 0;     ///< non-pad tokens (trailing pad run left out), all dp ranks
  double sum_l2 = 0;      ///< Σ over the step's segments of length² (attention FLOPs)
  bool skipped = false;   ///< the loss or the norm was not finite, or update_nonfinite: no update
  bool update_nonfinite = false;  ///< the update would have made a parameter or moment non-finite
};

/// Labels that take loss (≠ data::kIgnoreIndex) of one micro-batch.
int64_t count_labels(const data::MicroBatch& row);
/// Non-pad tokens of a row: the trailing pad run (ids 0, labels ignored) is left out.
int64_t count_tokens(const data::MicroBatch& row);

/// The gradient half of a step: zeroes the gradients, runs forward/backward over this rank's
/// full rows `rows` (its share of the global batch, before the engine's local_batch) with the
/// loss scales of `options.loss_reduction`, and finishes the gradients (every reduction of the
/// layout). Fills loss, labels, tokens and sum_l2 of the result (grad_norm stays 0).
/// Collective over the engine's grid.
StepResult step_gradients(parallel::ParallelEngine& engine, const std::vector<data::MicroBatch>& rows,
                          const StepOptions& options);

/// One optimizer step: step_gradients, options.on_gradients, the global gradient norm, clipping
/// (clip_grad_norm in schedule.h: PyTorch's clip_grad_norm_ rule), then one AdamW update at
/// options.lr — unless the loss or the norm is not finite on any rank, or the update would make a
/// parameter or moment non-finite on any rank (AdamW::update_is_finite), when the update is
/// skipped on every rank (result.skipped). Collective over the engine's grid (and AdamW's ZeRO-1 group).
/// When AdamW's zero1 communicator is the grid's zero1 group and engine.shards_gradients(), the
/// data-parallel reduction is a reduce-scatter into the optimizer's slices
/// (ParallelEngine::finish_gradient_slices) and the norm is taken over the slices; the hook still
/// sees the full gradient (the slices are all-gathered first), but after the step only this rank's
/// slice of engine.grads() is the step gradient. The gradients stay unclipped in engine.grads():
/// AdamW applies the clip's factor as it reads them.
StepResult train_step(parallel::ParallelEngine& engine, AdamW& optimizer,
                      const std::vector<data::MicroBatch>& rows, const StepOptions& options);

}  // namespace longtron::train
