// Preference training (docs/preference.md): the DPO family's losses on pairs of sequences packed
// into rows (packing/pair_pack.h), as TRL computes them (trl/trainer/dpo_trainer.py `dpo_loss`,
// orpo_trainer.py `odds_ratio_loss`, cpo_trainer.py `cpo_loss` with loss_type "simpo").
//
// A sequence's log-prob π is the sum over its answer tokens of −cross-entropy (the per-token
// average where TRL averages: ipo, orpo, simpo). Every loss is a function ℓ(π_c, π_r, ρ_c, ρ_r) of
// a pair (ρ: the reference's log-probs), so its gradient with respect to a token's cross-entropy is
// −∂ℓ/∂π of the token's sequence (÷ its answer length where averaged): the head runs once for the
// per-token losses, the pair terms are computed, and the head's backward takes one factor per
// token (model::Decoder::set_token_weights). The step loss is the mean of ℓ over all pairs of the
// step (every micro-batch and data-parallel rank), plus for orpo the NLL token mean over the
// step's chosen sequences (prompt and answer).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "modes/engine.h"
#include "train/preference_config.h"
#include "packing/batch.h"
#include "packing/pack.h"
#include "train/metrics.h"

namespace longtron::train {

/// Whether the loss compares with a reference model (sigmoid, ipo, hinge, robust).
bool uses_reference(PreferenceLoss loss);
/// Whether π is the per-token average of the answer's log-probs (ipo, orpo, simpo), not the sum.
bool averages_logps(PreferenceLoss loss);
/// Throws Error naming the key for β ≤ 0 (or not finite), ε outside [0, 0.5), a negative
/// max_length or simpo_gamma not finite.
void check_preference_config(const PreferenceConfig& config);

/// One pair's loss ℓ and its partial derivatives, and TRL's rewards for the metrics.
struct PairTerms {
  double loss = 0;
  double d_chosen = 0, d_rejected = 0;  ///< ∂ℓ/∂π_c, ∂ℓ/∂π_r
  double reward_chosen = 0, reward_rejected = 0;
};

/// ℓ of one pair from the policy's π_c, π_r and the reference's ρ_c, ρ_r (ignored by orpo and
/// simpo), exactly TRL's formulas with h = β·((π_c − π_r) − (ρ_c − ρ_r)):
///   sigmoid −(1−ε)·logσ(h) − ε·logσ(−h); robust (−(1−ε)·logσ(h) + ε·logσ(−h)) / (1−2ε);
///   hinge relu(1 − h); ipo (h/β − 1/(2β))²; simpo with h = β(π_c − π_r) − γ as sigmoid;
///   orpo −β·logσ((π_c − π_r) − (log(1−e^π_c) − log(1−e^π_r))) (π < 0: averages of log-probs).
/// Rewards: β(π − ρ) (orpo, simpo: β·π).
PairTerms pair_terms(const PreferenceConfig& config, double pc, double pr, double rc, double rr);

/// The sequences' log-probs of one row's pairs from per-token losses of the row (token_losses[t]
/// = cross-entropy of position t's target): [2 × pairs], chosen then rejected per pair, each the
/// sum of −token_losses over its answer positions, or their mean when `average`.
std::vector<double> pair_logps(const data::MicroBatch& row, const std::vector<double>& token_losses,
                               bool average);

/// Sums over pairs that make a step's metrics (reduced over the data-parallel group).
struct PreferenceStats {
  double loss = 0;     ///< Σ ℓ
  double nll = 0;      ///< orpo: Σ cross-entropy over the chosen sequences' targets
  double pairs = 0, nll_tokens = 0;
  double rewards_chosen = 0, rewards_rejected = 0, accuracy = 0, margin = 0;
  double logps_chosen = 0, logps_rejected = 0;
  /// Σ ℓ / pairs (+ nll / nll_tokens for orpo): the step loss.
  double step_loss() const;
};

/// The step's metrics into `row` (means over its pairs, as TRL logs them: rewards/chosen,
/// rewards/rejected, rewards/accuracies → reward_accuracy, rewards/margins → reward_margin,
/// logps/chosen, logps/rejected); sets row.preference.
void set_preference_metrics(const PreferenceStats& stats, TrainRow& row);

/// What the per-token factors divide by: the step's pairs, and orpo's NLL targets (every target
/// of a chosen sequence: prompt and answer).
struct PreferenceTotals {
  double pairs = 0, nll_tokens = 0;
};
/// The totals of these rows (one rank's; the step sums them over data parallel). Throws Error
/// for a row without pairs.
PreferenceTotals preference_totals(const std::vector<data::MicroBatch>& rows);

/// One row's per-token factors of the step loss's gradient, scale[t] = ∂L/∂(token loss t), from
/// its token losses ([N], the head's first pass) and the reference's pair_logps (nullptr:
/// reference-free); adds the row's pairs to `stats`. Any scalar type's token losses can be
/// given as double, so the double model takes the same factors (finite-difference tests).
void preference_token_factors(const PreferenceConfig& config, const data::MicroBatch& row,
                              const std::vector<double>& token_losses,
                              const std::vector<double>* reference_logps,
                              const PreferenceTotals& totals, std::vector<double>& scale,
                              PreferenceStats& stats);

/// What the engine needs for one preference step: the loss and the reference (nullptr for
/// reference-free losses; any weights: "initial" is a frozen copy of the starting weights). Under
/// LoRA a null reference means the policy's frozen base, its adapters switched off for the
/// reference's forward (no second copy).
struct PreferenceStep {
  PreferenceConfig config;
  parallel::ParallelEngine* reference = nullptr;
  PreferenceStats stats;  ///< filled by preference_gradients (the same on every rank)
};

/// The gradient half of a preference step on this rank's full rows (each carrying
/// MicroBatch::pairs): the step's pair and NLL-token counts over the data-parallel group, then per
/// micro-batch the reference's log-probs (its forward_loss) and the policy's forward and backward
/// with the per-token factors of the step loss (loss_scale 1). Fills step.stats (reduced over the
/// data-parallel group) and leaves the gradients for finish_gradients. Throws Error for a row
/// without pairs, a reference-based loss without a reference (or LoRA), or a layout whose head
/// takes no per-token factors. Collective over the engine's grid.
void preference_gradients(parallel::ParallelEngine& engine,
                          const std::vector<data::MicroBatch>& rows, PreferenceStep& step);

/// The held-out pairs of `rows` (each row's MicroBatch::pairs), loss only: dp rank r scores rows
/// r, r + D, …; the policy's and the reference's forward_loss give the log-probs (reference as
/// PreferenceStep::reference: nullptr is reference-free, or under LoRA the base). Returns the stats over all rows (reduced over the data-parallel group), so
/// step_loss() is the mean pair loss over the set (orpo: plus its NLL token mean). Collective.
PreferenceStats preference_evaluate(parallel::ParallelEngine& engine,
                                    parallel::ParallelEngine* reference,
                                    const PreferenceConfig& config, const data::RowSource& rows);

}  // namespace longtron::train
