// train.loss_reduction: how a step's loss combines its micro-batches (docs/training.md).
#pragma once
#include <array>

#include "core/enum_names.h"

namespace longtron::train {

/// kToken: Σ loss_sum / Σ count over the step; kMicroMean: InternEvo's mean over micro-batches of
/// each micro-batch's mean (combine_step_loss, train/step.h).
enum class LossReduction { kToken, kMicroMean };

/// The config spellings of LossReduction.
inline constexpr std::array<EnumName<LossReduction>, 2> kLossReductionNames{
    {{LossReduction::kToken, "token"}, {LossReduction::kMicroMean, "micro_mean"}}};

}  // namespace longtron::train
