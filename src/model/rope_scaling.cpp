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

/// config.json's `rope_parameters` (Transformers 5), or nullptr when absent or null. Refuses one
/// keyed by layer type ({"full_attention": {…}, "sliding_attention": {…}}).
const nlohmann::json* rope_parameters(const nlohmann::json& hf, const std::string& source) {
  if (!hf.contains("rope_parameters") || hf["rope_parameters"].is_null()) return nullptr;
  const nlohmann::json& r = hf["rope_parameters"];
  check(r.is_object(), "{}: rope_parameters must be an object or null, got {}", source,
        json_excerpt(r));
  for (const auto& [key, value] : r.items())
    check(!value.is_object(), "{}: rope_parameters.{} is an object: one RoPE per layer type is not "
          "supported (only one rope_type and rope_theta for every layer)", source, key);
  return &r;
}

}  // namespace

double read_rope_theta(const nlohmann::json& hf, double fallback, const std::string& source) {
  const nlohmann::json* params = rope_parameters(hf, source);
  using Json = nlohmann::json;
  const auto number_or_null = [&](const Json& j, const char* key) -> const Json* {
    if (!j.contains(key) || j[key].is_null()) return nullptr;
    check(j[key].is_number(), "{}: {} must be a number, got {}", source, key, json_excerpt(j[key]));
    return &j[key];
  };
  const nlohmann::json* top = number_or_null(hf, "rope_theta");
  const nlohmann::json* inner = params ? number_or_null(*params, "rope_theta") : nullptr;
  check(top == nullptr || inner == nullptr || top->get<double>() == inner->get<double>(),
        "{}: rope_theta = {} but rope_parameters.rope_theta = {}", source, top ? top->dump() : "",
        inner ? inner->dump() : "");
  const double theta = top ? top->get<double>() : inner ? inner->get<double>() : fallback;
  check(std::isfinite(theta) && theta > 0, "{}: rope_theta must be finite and > 0, got {}", source,
        theta);
  return theta;
}

void read_rope_scaling(const nlohmann::json& hf, ModelConfig& c, const std::string& source) {
  c.rope_scaling_type.clear();
  const bool own = hf.contains("rope_scaling") && !hf["rope_scaling"].is_null();
  const nlohmann::json* found = own ? &hf["rope_scaling"] : rope_parameters(hf, source);
  if (found == nullptr) return;
  const nlohmann::json& r = *found;
  check(r.is_object(), "{}: rope_scaling must be an object or null, got {}", source, json_excerpt(r));
  // rope_parameters may hold rope_theta alone: no rope_type is the default RoPE.
  if (!own && !r.contains("rope_type") && !r.contains("type")) return;
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
