// Which layers attend through the sliding window, as config.json states it per layer: Hugging
// Face's layer_types ("sliding_attention" / "full_attention", one entry a layer), or the older
// sliding_window_pattern of Gemma 3's configs (Transformers' Gemma3TextConfig: without
// layer_types, layer i slides unless (i + 1) is a multiple of the pattern, default 6).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace longtron::model {

/// Per layer, whether it slides (ModelConfig::window_layers), from layer_types. Throws
/// longtron::Error naming `source` when the list does not have num_layers entries or an entry is
/// neither "sliding_attention" nor "full_attention".
std::vector<bool> window_layers_from_types(const std::vector<std::string>& layer_types,
                                           int64_t num_layers, const std::string& source);

/// Per layer, whether it slides, from sliding_window_pattern: every pattern-th layer (the 6th,
/// the 12th, …) full, the others sliding; pattern 1 makes every layer full. Throws
/// longtron::Error naming `source` when pattern < 1.
std::vector<bool> window_layers_from_pattern(int64_t pattern, int64_t num_layers,
                                             const std::string& source);

}  // namespace longtron::model
