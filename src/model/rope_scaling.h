// RoPE frequency scaling as Hugging Face transformers' modeling_rope_utils.py defines it for the
// types longtron trains: linear (Chen et al. 2023, position interpolation), llama3 (Meta's Llama
// 3.1 rule) and dynamic (NTK-aware; below max_position_embeddings it is plain RoPE).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace longtron::model {

/// The inverse frequencies inv_freq[head_dim/2] of `c`: base^(−2i/d), then
/// - linear: ÷ factor;
/// - llama3: with wavelen = 2π/inv_freq, L = original_max_position_embeddings: wavelen > L /
///   low_freq_factor → ÷ factor; wavelen < L / high_freq_factor → unchanged; between, the blend
///   (1 − s)·inv/factor + s·inv with s = (L/wavelen − low_freq_factor) / (high_freq_factor −
///   low_freq_factor);
/// - dynamic: unchanged (positions are checked by check_rope_positions instead).
std::vector<double> rope_inv_freq(const ModelConfig& c);

/// Reads config.json's `rope_scaling` (null or absent: none) into `c`; `max_position_embeddings`
/// is the config's (dynamic needs it). Without `rope_scaling`, the same keys are read from
/// `rope_parameters` (Transformers 5 writes RoPE there: rope_type, rope_theta and the scaling's
/// keys in one object). Throws Error naming the type when it is not linear, llama3 or dynamic
/// ("default" is none), and naming the key when a parameter is missing or invalid.
void read_rope_scaling(const nlohmann::json& hf, ModelConfig& c, const std::string& source);

/// config.json's RoPE base: `rope_theta`, or (Transformers 5) `rope_parameters.rope_theta`, or
/// `fallback` when neither is there. Throws Error when both are there and differ, when
/// rope_parameters is keyed by layer type (one RoPE per kind of layer, which no family here has)
/// or when the value is not a finite number > 0.
double read_rope_theta(const nlohmann::json& hf, double fallback, const std::string& source);

/// Dynamic scaling is plain RoPE while positions stay below max_position_embeddings; beyond, Hugging
/// Face would change the frequencies with the sequence length, which longtron does not do: throws
/// Error naming the position and the limit. A no-op for the other types.
void check_rope_positions(const ModelConfig& c, const int32_t* indexes, int64_t n);

}  // namespace longtron::model
