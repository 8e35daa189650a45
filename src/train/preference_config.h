// The `[preference]` section (docs/preference.md): which loss of the DPO family and its
// hyperparameters, under TRL's key names (DPOConfig, ORPOConfig, CPOConfig).
#pragma once
#include <array>
#include <cstdint>

#include "core/enum_names.h"

namespace longtron::train {

/// `preference.loss_type`, TRL's names.
enum class PreferenceLoss { kSigmoid, kIpo, kHinge, kRobust, kOrpo, kSimpo };
inline constexpr std::array<EnumName<PreferenceLoss>, 6> kPreferenceLossNames{{
    {PreferenceLoss::kSigmoid, "sigmoid"},
    {PreferenceLoss::kIpo, "ipo"},
    {PreferenceLoss::kHinge, "hinge"},
    {PreferenceLoss::kRobust, "robust"},
    {PreferenceLoss::kOrpo, "orpo"},
    {PreferenceLoss::kSimpo, "simpo"},
}};

/// The `[preference]` section (docs/preference.md): TRL's key names and defaults.
struct PreferenceConfig {
  PreferenceLoss loss_type = PreferenceLoss::kSigmoid;
  double beta = 0.1;             ///< β: the temperature of the log-ratio (orpo: the odds-ratio weight)
  double label_smoothing = 0.0;  ///< ε of cDPO (sigmoid), robust and simpo, in [0, 0.5)
  double simpo_gamma = 0.5;      ///< SimPO's target margin γ (simpo)
  int64_t max_length = 0;        ///< per-sequence token limit (0: none; longer is refused)
  bool truncation_keep_end = false;  ///< truncation_mode: "keep_end" (true) or "keep_start"
};

}  // namespace longtron::train
