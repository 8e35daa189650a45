#include "model/rope_scaling.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/json_read.h"
#include "ops/ops.h"

namespace longtron::model {

std::vector<double> rope_inv_freq(const ModelConfig& c) {
  std::vector<double> inv = ops::rope_inv_freq(c.rope_base, c.head_dim());
  const std::string& type = c.rope_scaling_type;
  if (type == "linear") {
    for (double& f : inv) f /= c.rope_factor;
  } else if (type == "llama3") {
    const double L = static_cast<double>(c.rope_original_max_position);
    const double low_wavelen = L / c.rope_low_freq_factor, high_wavelen = L / c.rope_high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= c.rope_factor;
      } else if (wavelen >= high_wavelen) {
        const double s = (L / wavelen - c.rope_low_freq_factor) /
                         (c.rope_high_freq_factor - c.rope_low_freq_factor);
        f = (1 - s) * f / c.rope_factor + s * f;
      }
    }
  }
  return inv;
}

namespace {
double number(const nlohmann::json& r, const char* key, const std::string& where) {
  check(r.contains(key) && r[key].is_number(), "{}: rope_scaling.{} must be a number, got {}", where,
        key, r.contains(key) ? json_excerpt(r[key]) : "nothing");
  return r[key].get<double>();
}
}  // namespace

void read_rope_scaling(const nlohmann::json& hf, ModelConfig& c, const std::string& source) {
  c.rope_scaling_type.clear();
  if (!hf.contains("rope_scaling") || hf["rope_scaling"].is_null()) return;
  const nlohmann::json& r = hf["rope_scaling"];
  check(r.is_object(), "{}: rope_scaling must be an object or null, got {}", source, json_excerpt(r));
  // transformers reads "rope_type", falling back to the older "type".
  const char* key = r.contains("rope_type") ? "rope_type" : "type";
  check(r.contains(key) && r[key].is_string(), "{}: rope_scaling has no rope_type", source);
  const std::string type = r[key].get<std::string>();
  if (type == "default") return;
  check(type == "linear" || type == "llama3" || type == "dynamic",
        "{}: rope_scaling of type \"{}\" is not supported (supported: linear, llama3, dynamic)",
        source, type);
  c.rope_scaling_type = type;
  c.rope_factor = number(r, "factor", source);
  check(c.rope_factor >= 1, "{}: rope_scaling.factor must be >= 1, got {}", source, c.rope_factor);
  if (type == "llama3") {
    c.rope_low_freq_factor = number(r, "low_freq_factor", source);
    c.rope_high_freq_factor = number(r, "high_freq_factor", source);
    check(c.rope_high_freq_factor > c.rope_low_freq_factor && c.rope_low_freq_factor > 0,
          "{}: rope_scaling needs 0 < low_freq_factor < high_freq_factor, got {} and {}", source,
          c.rope_low_freq_factor, c.rope_high_freq_factor);
    c.rope_original_max_position =
        static_cast<int64_t>(number(r, "original_max_position_embeddings", source));
    check(c.rope_original_max_position > 0,
          "{}: rope_scaling.original_max_position_embeddings must be > 0", source);
  }
  if (type == "dynamic") {
    check(hf.contains("max_position_embeddings") && hf["max_position_embeddings"].is_number_integer(),
          "{}: rope_scaling of type dynamic needs max_position_embeddings", source);
    c.rope_max_position = hf["max_position_embeddings"].get<int64_t>();
  }
}

void check_rope_positions(const ModelConfig& c, const int32_t* indexes, int64_t n) {
  if (c.rope_scaling_type != "dynamic") return;
  for (int64_t i = 0; i < n; ++i)
    check(indexes[i] < c.rope_max_position,
          "position {} reaches max_position_embeddings = {}: dynamic RoPE scaling would change the "
          "frequencies there, which longtron does not do (use shorter sequences)", indexes[i],
          c.rope_max_position);
}

}  // namespace longtron::model
