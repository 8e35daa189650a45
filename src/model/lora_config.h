// LoRA settings (the `[lora]` config section, docs/lora.md): low-rank adapters on a frozen base,
// PEFT's method (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models";
// https://github.com/huggingface/peft, tuners/lora).
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/enum_names.h"

namespace longtron::model {

/// The dtype the frozen base weights are held in under LoRA. kAuto: bfloat16 when the run's
/// compute type resolves to bfloat16, else float32.
enum class LoraBaseDtype { kAuto, kFloat32, kBFloat16 };
inline constexpr std::array<EnumName<LoraBaseDtype>, 3> kLoraBaseDtypeNames = {{
    {LoraBaseDtype::kAuto, "auto"},
    {LoraBaseDtype::kFloat32, "float32"},
    {LoraBaseDtype::kBFloat16, "bfloat16"},
}};

/// `[lora]`: y = W x + s · B A dropout(x) on each targeted linear, s = alpha / rank (alpha /
/// sqrt(rank) with use_rslora, Kalajdzievski 2023). rank 0 = off.
struct LoraConfig {
  int64_t rank = 0;
  double alpha = 8.0;    ///< PEFT's lora_alpha default
  double dropout = 0.0;  ///< probability of dropping an input feature of A, in [0, 1)
  /// The family's Hugging Face module names (q_proj … down_proj; InternLM2 wqkv wo w1 w3 w2), or
  /// "all-linear" (every linear but the head).
  std::vector<std::string> targets = {"all-linear"};
  bool use_rslora = false;
  LoraBaseDtype base_dtype = LoraBaseDtype::kAuto;
  int64_t seed = 0;  ///< A's initialisation and dropout's masks (>= 0)

  bool enabled() const { return rank > 0; }
  /// alpha / rank, or alpha / sqrt(rank) with use_rslora (0 when off).
  double scale() const {
    if (rank <= 0) return 0.0;
    return use_rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank);
  }
};

}  // namespace longtron::model
