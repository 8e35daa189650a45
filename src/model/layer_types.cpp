#include "model/layer_types.h"

#include "core/error.h"

namespace longtron::model {

std::vector<bool> window_layers_from_types(const std::vector<std::string>& layer_types,
                                           int64_t num_layers, const std::string& source) {
  check(static_cast<int64_t>(layer_types.size()) == num_layers,
        "{}: layer_types has {} entries, num_hidden_layers is {}", source, layer_types.size(),
        num_layers);
  std::vector<bool> out;
  out.reserve(layer_types.size());
  for (size_t i = 0; i < layer_types.size(); ++i) {
    const std::string& t = layer_types[i];
    check(t == "sliding_attention" || t == "full_attention",
          "{}: layer_types[{}] is \"{}\" (only \"sliding_attention\" or \"full_attention\")",
          source, i, t);
    out.push_back(t == "sliding_attention");
  }
  return out;
}

std::vector<bool> window_layers_from_pattern(int64_t pattern, int64_t num_layers,
                                             const std::string& source) {
  check(pattern >= 1, "{}: sliding_window_pattern must be at least 1, got {}", source, pattern);
  std::vector<bool> out;
  for (int64_t i = 0; i < num_layers; ++i) out.push_back((i + 1) % pattern != 0);
  return out;
}

}  // namespace longtron::model
